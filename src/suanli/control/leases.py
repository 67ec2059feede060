"""Named leases in the database: one holder at a time, taken over when it lapses (a crashed holder)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError

from suanli.db.engine import Database
from suanli.db.models import Lease

WORKLOAD_LOOP = "workload-loop"  # the scheduling loop's leader; its info carries the live waste figures


def acquire(
    db: Database, name: str, owner: str, now: datetime, ttl_s: float, info: dict[str, Any] | None = None
) -> bool:
    """Take or renew the lease (recording `info`, the holder's report); False while another live holder has it."""
    try:
        with db.write() as s, s.begin():
            row = s.get(Lease, name, with_for_update=True, populate_existing=True)
            if row is None:
                s.add(Lease(name=name, owner=owner, expires_at=now + timedelta(seconds=ttl_s), info=info or {}))
                return True
            if row.owner != owner and row.expires_at > now:
                return False
            row.owner, row.expires_at = owner, now + timedelta(seconds=ttl_s)
            if info is not None:
                row.info = info
            return True
    except IntegrityError:  # another process inserted the row first
        return False


def release(db: Database, name: str, owner: str) -> None:
    with db.write() as s, s.begin():
        row = s.get(Lease, name, with_for_update=True)
        if row is not None and row.owner == owner:
            s.delete(row)


def holder(db: Database, name: str, now: datetime) -> tuple[str | None, dict[str, Any]]:
    """The live holder and what it last reported; (None, {}) when nobody holds the lease."""
    with db.read() as s:
        row = s.get(Lease, name)
        return (row.owner, dict(row.info or {})) if row is not None and row.expires_at > now else (None, {})
