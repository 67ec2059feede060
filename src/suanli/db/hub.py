"""The hub's table: one row per public model or dataset the operator added (`control.storage.hub`); the files themselves
are in the hub directory (`storage.hub`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from suanli.db.models import Base


class HubEntry(Base):
    """A model or dataset: the name tenants use (`models: [NAME]`), the repository id programs load it by
    (`from_pretrained("ORG/NAME")`), its revision, size, licence and every file's size and SHA-256."""

    __tablename__ = "hub_entries"
    __table_args__ = (
        UniqueConstraint("kind", "name", name="uq_hub_entries_kind_name"),
        UniqueConstraint("kind", "repo_id", name="uq_hub_entries_kind_repo_id"),
    )
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))  # model | dataset
    name: Mapped[str] = mapped_column(String(64))
    repo_id: Mapped[str] = mapped_column(String(200))
    revision: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    license: Mapped[str | None] = mapped_column(String(64), nullable=True)
    source: Mapped[str] = mapped_column(String(1024))  # where the operator took it from (a directory, hf://…)
    folder: Mapped[str] = mapped_column(String(256))  # hub/models--ORG--NAME, relative to the hub directory
    prepared: Mapped[str | None] = mapped_column(String(256), nullable=True)  # datasets/ORG___NAME (a dataset)
    files: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # [{path, size, sha256}], sorted by path
    created_at: Mapped[datetime]
