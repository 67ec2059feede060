"""Apply the Alembic migrations shipped in the package (the server does this on start)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "suanli.db:migrations")
    cfg.attributes["engine"] = engine
    return cfg


def migrate(engine: Engine, revision: str = "head") -> None:
    command.upgrade(alembic_config(engine), revision)
