"""Database adapter: SQLAlchemy 2 models, engines for SQLite and PostgreSQL, and Alembic migrations.

The table modules (`access`, `credit`, `hub`, `serving`, `telemetry`, `volumes`) take `Base` from `models`, which
imports them back at its end so that every table is in its metadata; `models` is therefore loaded first, whichever
of them is imported first."""

from suanli.db import models as models  # loaded first: see above
