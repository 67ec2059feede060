"""Secrets a console form made (an API token, an invitation's code, an endpoint key, top-up codes), held until the
page the form's redirect leads to shows them once (Post/Redirect/Get, `web/once.py`).

They wait in the database, so whichever process of `suanli server --workers N` answers that GET (or the server
after a restart) can show them. The database never holds them readable: each is sealed with AES-GCM under a fresh
random key that exists only in the browser's short-lived cookie, and its row is found by that key's SHA-256. A copy
of the database (a backup taken in those minutes) holds ciphertext; the cookie alone holds no secret; both together
show it only to the session that made it (its hash is bound to the row and authenticated with the ciphertext), and
only once (taking it deletes the row; of two racing GETs one gets it).

Bounds: a secret lives `TTL_S` seconds; a session holds at most `PER_SESSION` (its oldest goes first) and the table
at most `TOTAL` (the oldest of all goes first). Holds take turns (`db.engine.exclusive`: an advisory lock on
PostgreSQL, the write lock on SQLite), so the bounds hold under concurrent holds and two evictions never deadlock.
A GET that presents keys reads first and writes only to take a secret that is there for it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
from datetime import datetime, timedelta
from typing import Any, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from suanli.db.engine import exclusive
from suanli.db.models import ConsoleSecret

TTL_S = 300
PER_SESSION = 4
TOTAL = 100_000  # rows of a few hundred bytes: a bound on the table, far above any honest traffic in TTL_S
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
EXPIRED_PER_HOLD = 1_000  # expired rows deleted by one hold: a table left full and idle is emptied in steps
HOLD_LOCK = 0x5A4E_4F4E  # advisory lock: holds take turns
COOKIE_ID = re.compile(r"[A-Za-z0-9_-]{43}")  # 32 bytes, URL-safe base64 without padding

Outcome = Literal["shown", "elsewhere", "lost"]


def owner_of(session_token: str) -> str:
    """What a row is bound to: the SHA-256 of the console session's token (never the token itself)."""
    return hashlib.sha256(session_token.encode()).hexdigest()


def _row_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()


def _page_id(page: str) -> str:
    return hashlib.sha256(page.encode()).hexdigest()


def _aad(owner: str, page: str) -> bytes:
    return f"{owner}\n{page}".encode()


def _key_of(cookie_id: str) -> bytes | None:
    if not COOKIE_ID.fullmatch(cookie_id):
        return None
    key = base64.urlsafe_b64decode(cookie_id + "=")
    return key if len(key) == KEY_BYTES else None


def hold(s: Session, owner: str, page: str, payload: Any, now: datetime, *, ttl_s: float = TTL_S,
         per_session: int = PER_SESSION, total: int = TOTAL) -> str:  # fmt: skip
    """Seal `payload` (JSON) for `owner`'s next GET of `page`; the id for the browser's cookie (the key itself)."""
    exclusive(s, HOLD_LOCK)
    expired = select(ConsoleSecret.id).where(ConsoleSecret.expires_at <= now).limit(EXPIRED_PER_HOLD)
    s.execute(delete(ConsoleSecret).where(ConsoleSecret.id.in_(expired.scalar_subquery())))
    mine = s.scalars(
        select(ConsoleSecret.id).where(ConsoleSecret.owner == owner)
        .order_by(ConsoleSecret.created_at.desc(), ConsoleSecret.id).offset(max(0, per_session - 1))
    ).all()  # fmt: skip
    if mine:
        s.execute(delete(ConsoleSecret).where(ConsoleSecret.id.in_(mine)))
    over = (s.scalar(select(func.count()).select_from(ConsoleSecret)) or 0) - total + 1
    if over > 0:
        oldest = s.scalars(select(ConsoleSecret.id).order_by(ConsoleSecret.created_at, ConsoleSecret.id).limit(over))
        s.execute(delete(ConsoleSecret).where(ConsoleSecret.id.in_(list(oldest))))
    key, nonce = os.urandom(KEY_BYTES), os.urandom(NONCE_BYTES)
    sealed = nonce + AESGCM(key).encrypt(nonce, json.dumps(payload).encode(), _aad(owner, page))
    s.add(ConsoleSecret(id=_row_id(key), owner=owner, page=_page_id(page), sealed=sealed, created_at=now,
                        expires_at=now + timedelta(seconds=ttl_s)))  # fmt: skip
    return base64.urlsafe_b64encode(key).rstrip(b"=").decode()


def _find(s: Session, cookie_id: str, owner: str, page: str, now: datetime) -> tuple[Outcome, bytes, ConsoleSecret]:
    key = _key_of(cookie_id)
    row = None if key is None else s.get(ConsoleSecret, _row_id(key))
    if key is None or row is None or row.expires_at <= now or not hmac.compare_digest(row.owner, owner):
        return "lost", b"", ConsoleSecret()
    return ("elsewhere" if row.page != _page_id(page) else "shown"), key, row


def look(s: Session, cookie_id: str, owner: str, page: str, now: datetime) -> Outcome:
    """What `take` would find, read only: `"shown"` when a secret waits for this owner on this page."""
    return _find(s, cookie_id, owner, page, now)[0]


def take(s: Session, cookie_id: str, owner: str, page: str, now: datetime) -> tuple[Outcome, Any]:
    """`("shown", payload)` once; `("elsewhere", None)` when it waits for another page (it stays); `("lost", None)`
    when this owner has no such secret (taken, expired, another session's, a junk id, an edited row)."""
    outcome, key, row = _find(s, cookie_id, owner, page, now)
    if outcome != "shown":
        return outcome, None
    sealed = bytes(row.sealed)
    if s.execute(delete(ConsoleSecret).where(ConsoleSecret.id == row.id)).rowcount != 1:  # type: ignore[attr-defined]
        return "lost", None  # another request took it first
    if len(sealed) < NONCE_BYTES + TAG_BYTES:
        return "lost", None
    try:
        plain = AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], _aad(owner, page))
    except (InvalidTag, ValueError):
        return "lost", None
    return "shown", json.loads(plain)


def count(s: Session) -> int:
    return s.scalar(select(func.count()).select_from(ConsoleSecret)) or 0
