"""Database adapter: SQLAlchemy 2 models, engines for SQLite and PostgreSQL, and Alembic migrations."""
