"""Links mailed to a user that act once: verifying their address (`verification`) and resetting their password
(`password_resets`). What both kinds share: a token of 256 random bits, stored as its SHA-256 only, good once and
until it expires; a check of it on a read, before anything costly or the write lock; and spending it, where of two
redeems at once exactly one wins."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Protocol, TypeVar

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from suanli.control.errors import Conflict, Invalid
from suanli.control.ids import token_hash
from suanli.db.models import User

TOKEN_MAX = 128  # what the routes accept; ours are 43 characters
TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{16,128}")


class LinkRow(Protocol):
    token_hash: str
    user_id: str
    expires_at: datetime
    used_at: datetime | None


Row = TypeVar("Row", bound=LinkRow)


def check_known(s: Session, table: type[LinkRow], token: str, unknown: str) -> None:
    """422 (`unknown`) for a token not of our shape or matching no link of `table`."""
    if not TOKEN_SHAPE.fullmatch(token) or s.get(table, token_hash(token)) is None:
        raise Invalid(unknown)


def spend(s: Session, table: type[Row], token: str, now: datetime, *, unknown: str, used: str, expired: str) -> Row:
    """Mark the link used and return it: 422 `unknown` (not ours) or `expired`, 409 `used`. The user's row is locked
    first (FOR NO KEY UPDATE: what only refers to the user waits not), as every path that changes what a link acts on
    takes it, so two of them at once take turns rather than deadlock; then one conditional UPDATE decides which of
    two redeems wins (PostgreSQL re-reads the row after the other's commit; SQLite serialises writers)."""
    if not TOKEN_SHAPE.fullmatch(token):
        raise Invalid(unknown)
    h = token_hash(token)
    row = s.get(table, h)
    if row is None:
        raise Invalid(unknown)
    if row.used_at is not None:
        raise Conflict(used)
    if row.expires_at <= now:
        raise Invalid(expired)
    s.execute(select(User.id).where(User.id == row.user_id).with_for_update(key_share=True))
    column = table.__table__.c  # type: ignore[attr-defined]
    won = s.execute(
        update(table)
        .where(column.token_hash == h, column.used_at.is_(None))
        .values(used_at=now)
        .execution_options(synchronize_session=False)
    ).rowcount
    if won != 1 or s.get(User, row.user_id) is None:
        raise Conflict(used)
    return row
