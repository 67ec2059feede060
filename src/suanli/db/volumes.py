"""Tables of persistent volumes: a volume of an org (its size is its limit, what it holds as last measured, its
billing watermark) and its versions (snapshots), numbered from 1 per volume."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Integer, String, UniqueConstraint, select
from sqlalchemy.orm import Mapped, column_property, mapped_column

from suanli.db.columns import UTCDateTime
from suanli.db.models import Base, Org


class Volume(Base):
    """A volume: a directory tree (local backend) or a bucket prefix (s3) of one org, at most `size_bytes`."""

    __tablename__ = "volumes"
    __table_args__ = (UniqueConstraint("org_id", "name"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("orgs.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str] = mapped_column(String(8))  # local | s3
    size_bytes: Mapped[int] = mapped_column(BigInteger)  # the limit, and what is billed (allocated)
    used_bytes: Mapped[int] = mapped_column(BigInteger, default=0)  # the live tree, as last measured
    files: Mapped[int] = mapped_column(Integer, default=0)
    snapshot_bytes: Mapped[int] = mapped_column(BigInteger, default=0)  # the content its versions hold, each once
    last_version: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default="ready")  # ready | read-only (unpaid) | full
    created_by: Mapped[str] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime]
    measured_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    billed_until: Mapped[datetime]  # metered in whole hours up to here
    unpaid_since: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)  # balance exhausted since
    # Not a column: its org's sandbox uid, read with the row (the live tree's owner on a root server). An org's uid
    # never changes, so a flush of the row (a removal included) keeps the value read.
    org_uid: Mapped[int | None] = column_property(
        select(Org.sandbox_uid).where(Org.id == org_id).correlate_except(Org).scalar_subquery(), expire_on_flush=False
    )


class VolumeVersion(Base):
    """Version `number` of a volume: its files as they were, stored once each by content."""

    __tablename__ = "volume_versions"
    volume_id: Mapped[str] = mapped_column(ForeignKey("volumes.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    message: Mapped[str] = mapped_column(String(200), default="")
    bytes: Mapped[int] = mapped_column(BigInteger)  # the files' sizes, summed
    files: Mapped[int] = mapped_column(Integer)
    added_bytes: Mapped[int] = mapped_column(BigInteger)  # new content it stored (what it costs beyond the others)
    created_by: Mapped[str] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime]
