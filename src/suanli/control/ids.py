"""Identifiers, hashes and time for the services: the one place that reads the clock or draws randomness."""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime

TOKEN_PREFIX = "sl_"


def new_id(prefix: str) -> str:
    """Short, URL-safe, prefixed by kind (`org_…`, `usr_…`), so a pasted id says what it is."""
    return f"{prefix}_{secrets.token_hex(8)}"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_secret() -> str:
    """256 random bits, URL-safe: tickets, cookies, per-attempt tokens."""
    return secrets.token_urlsafe(32)


CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # base32 without I, L, O, U: nothing to misread on a printed card


def new_code(length: int) -> str:
    """`length` random Crockford base32 characters (5 bits each): codes people type from paper."""
    return "".join(secrets.choice(CROCKFORD) for _ in range(length))


def token_hash(token: str) -> str:
    # Tokens are 256 random bits, so a fast hash is safe (no dictionary to attack) and keeps auth cheap.
    return hashlib.sha256(token.encode()).hexdigest()


def utcnow() -> datetime:
    return datetime.now(UTC)
