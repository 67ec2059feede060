"""Who may sign up (the operator's `signup` setting) and the operators' invite codes.

- `open`: anyone.
- `invite`: only with a code: the code of an organisation's invitation made out to that email (the new user then
  joins that organisation), or an operator's invite code (`suanli admin invites create`: a number of uses, an
  expiry).
- `closed`: nobody; operators create users (`suanli admin create-user`).

A code that is not valid for that email is refused with one message whatever the reason (unknown, used up,
expired, revoked, made out to someone else), and a signup that fails for any other reason uses nothing up.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from suanli.control.accounts import memberships
from suanli.control.accounts.accounts import Principal
from suanli.control.errors import Forbidden, Invalid, NotFound
from suanli.control.ids import new_id, new_secret, token_hash
from suanli.db.access import Invitation, SignupCode

MODES = ("open", "invite", "closed")
MAX_USES = 10_000
MAX_DAYS = 365


def check_open(mode: str, code: str | None) -> None:
    """Refuse at once (before any password is hashed) what the mode refuses whatever the code."""
    if mode == "closed":
        raise Forbidden("signup: closed on this server; ask its operator for an account")
    if mode == "invite" and not code:
        raise Forbidden("signup: by invitation only on this server; sign up with the code you were given (invite)")


def redeem(s: Session, mode: str, email: str, code: str | None, now: datetime) -> Invitation | None:
    """Use up the code (in the signup's transaction); the invitation it belongs to, if it is one, for the new user
    to join. No code: fine where signup is open."""
    check_open(mode, code)
    if not code:
        return None
    invitation = memberships.by_code(s, code, email, now)
    if invitation is not None:
        return invitation
    row = s.scalar(select(SignupCode).where(SignupCode.code_hash == token_hash(code)).with_for_update())
    if row is None or row.revoked_at is not None or row.expires_at <= now or row.uses_left <= 0:
        raise Forbidden("invite: not a valid invitation or invite code for this email")
    row.uses_left -= 1
    return None


def create_code(s: Session, who: Principal, uses: int, days: int, note: str, now: datetime) -> tuple[SignupCode, str]:
    """A new operator's invite code; the plain code is returned once and stored only as a hash."""
    if not 1 <= uses <= MAX_USES:
        raise Invalid(f"uses: 1 to {MAX_USES}")
    if not 1 <= days <= MAX_DAYS:
        raise Invalid(f"expires_in_days: 1 to {MAX_DAYS}")
    plain = memberships.CODE_PREFIX + new_secret()
    row = SignupCode(id=new_id("code"), code_hash=token_hash(plain), prefix=plain[:9], note=note[:200],
                     uses_left=uses, created_by=who.user_id, created_at=now, expires_at=now + timedelta(days=days),
                     revoked_at=None)  # fmt: skip
    s.add(row)
    s.flush()
    return row, plain


def codes(s: Session, limit: int = 1000) -> list[SignupCode]:
    return list(s.scalars(select(SignupCode).order_by(SignupCode.created_at.desc()).limit(limit)))


def revoke_code(s: Session, code_id: str, now: datetime) -> SignupCode:
    row = s.get(SignupCode, code_id)
    if row is None:
        raise NotFound(f"invite code {code_id} not found")
    if row.revoked_at is None:
        row.revoked_at = now
    return row
