"""Users' SSH public keys: add, list, remove. The SSH gateway reads them to let a user into the instances of
every org the user is a member of (`control.workloads.ssh_gateway`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from suanli.control.accounts import accounts
from suanli.control.accounts.accounts import Principal
from suanli.control.errors import Conflict, Invalid, NotFound
from suanli.control.ids import new_id
from suanli.db.models import SshKey, User
from suanli.ssh.keys import BadKey, parse

MAX_KEYS_PER_USER = 50
MAX_NAME = 128


def add(s: Session, who: Principal, public_key: str, name: str | None, now: datetime) -> SshKey:
    """A new key of the caller's. Its name defaults to the key's comment (`me@laptop`), else its fingerprint."""
    try:
        key = parse(public_key, "public_key")
    except BadKey as e:
        raise Invalid(str(e)) from None
    name = (name if name is not None else key.comment or key.fingerprint).strip()
    if not 1 <= len(name) <= MAX_NAME:
        raise Invalid(f"name: 1 to {MAX_NAME} characters")
    user = accounts.user(s, who)
    s.get(User, user.id, with_for_update=True)  # concurrent adds of one user count one at a time
    count = s.scalar(select(func.count()).select_from(SshKey).where(SshKey.user_id == user.id)) or 0
    if count >= MAX_KEYS_PER_USER:
        raise Conflict(f"public_key: at most {MAX_KEYS_PER_USER} keys per user; remove one first (suanli keys rm ID)")
    same = s.scalar(select(SshKey).where(SshKey.user_id == user.id, SshKey.fingerprint == key.fingerprint))
    if same is not None:
        raise Conflict(f"public_key: this key is already added as {same.id} ({same.name})")
    # A public key is public (github.com/USER.keys): held by two accounts, a login with it could be steered into
    # the other's instance. It belongs to one account.
    if s.scalar(select(SshKey.id).where(SshKey.fingerprint == key.fingerprint).limit(1)) is not None:
        raise Conflict("public_key: this key belongs to another account; make a key of your own (ssh-keygen -t "
                       "ed25519)")  # fmt: skip
    row = SshKey(id=new_id("key"), user_id=user.id, name=name, algorithm=key.algorithm, public_key=key.openssh,
                 fingerprint=key.fingerprint, created_at=now)  # fmt: skip
    s.add(row)
    s.flush()
    return row


def listing(s: Session, who: Principal) -> list[SshKey]:
    return list(s.scalars(select(SshKey).where(SshKey.user_id == who.user_id).order_by(SshKey.created_at)))


def remove(s: Session, who: Principal, key_ref: str) -> SshKey:
    """Remove one of the caller's keys, by id or fingerprint; another user's key does not exist (404)."""
    row = s.get(SshKey, key_ref)
    if row is None:
        row = s.scalar(select(SshKey).where(SshKey.user_id == who.user_id, SshKey.fingerprint == key_ref))
    if row is None or row.user_id != who.user_id:
        raise NotFound(f"key {key_ref} not found")
    s.delete(row)
    s.flush()
    return row
