"""A new password: the user changes theirs (knowing the current one), redeems a reset link mailed to them, or an
operator sets it (`suanli admin set-password`). Whichever way, every other session ends: all of the user's API
tokens but the one that made the change are revoked, so a token stolen with the old password dies with it; their
instance proxy sessions (JupyterLab's cookies) end; and the reset links still out are spent. A reset and the
operator's command also remove the user's SSH keys: whoever had the account before (a thief, or someone who signed
up with another's address first) may have added one, and the owner who regains it by mail has not seen them.

A reset link's token is 256 random bits, stored as its SHA-256 only, good once and for `TOKEN_TTL`. Asking for a
link answers the same whether or not the address belongs to anyone, so the route cannot tell who is registered; it
is throttled per address asked about (`ASK_EMAIL`) and per client address (`ASK_ADDRESS`), the same for a
registered address as for any other, so it cannot flood a mailbox either.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from suanli.control.accounts import links, throttle
from suanli.control.errors import Conflict, Unauthorized
from suanli.control.ids import new_secret, token_hash
from suanli.db.access import PasswordReset
from suanli.db.models import ApiToken, ProxySession, SshKey, User
from suanli.db.serving import EndpointKey
from suanli.mail import Mail

TOKEN_TTL = timedelta(hours=1)
ASK_EMAIL = throttle.Bucket(3, 1200.0)  # links one address may be sent: 3 at once, then one every 20 minutes
ASK_ADDRESS = throttle.Bucket(10, 360.0)  # asks from one client address: 10 at once, then 10 an hour
PATH = "/reset"  # the console's page a link lands on (GET shows the form; only its POST redeems)
UNKNOWN = "token: not a password reset token (copy the whole link from the e-mail)"

__all__ = ["PATH", "TOKEN_TTL", "SignedOut", "check_known", "count_ask", "issue", "message", "redeem",
           "set_password"]  # fmt: skip


@dataclass(frozen=True)
class SignedOut:
    """What a new password ended: the user's other tokens, and (on a reset) their SSH keys and endpoint keys."""

    tokens: int
    ssh_keys: int
    endpoint_keys: int = 0


def set_password(
    s: Session, user_id: str, hashed: str, now: datetime, *, keep_token_id: str | None = None,
    expected_hash: str | None = None, drop_ssh_keys: bool = False,
) -> SignedOut:  # fmt: skip
    """Store the new hash, revoke every token of the user but `keep_token_id` (401 if that one was revoked
    meanwhile), end their instance proxy sessions, spend their reset links, and with `drop_ssh_keys` remove their
    SSH keys and revoke the endpoint keys they made (whoever had the account may have made one, paid by one of its
    orgs, to an endpoint of their own: it kept charging after the reset). `expected_hash`: the hash the current
    password was checked against; 409 when another new password was set meanwhile (a change never undoes a reset
    that landed while it was hashing). The user's row is locked first, as `redeem` locks it: a change and a reset
    at once take turns rather than deadlock."""
    q = update(User).where(User.id == user_id)
    if expected_hash is not None:
        q = q.where(User.password_hash == expected_hash)
    if s.execute(q.values(password_hash=hashed).execution_options(synchronize_session=False)).rowcount != 1:
        raise Conflict("current_password: the password was changed meanwhile; log in again"
                       if expected_hash is not None else "the user no longer exists")  # fmt: skip
    if keep_token_id is not None:
        kept = s.execute(select(ApiToken.revoked_at).where(ApiToken.id == keep_token_id).with_for_update()).first()
        if kept is None or kept.revoked_at is not None:
            raise Unauthorized("token revoked; log in again")
    revoke = update(ApiToken).where(ApiToken.user_id == user_id, ApiToken.revoked_at.is_(None))
    if keep_token_id is not None:
        revoke = revoke.where(ApiToken.id != keep_token_id)
    tokens = s.execute(revoke.values(revoked_at=now).execution_options(synchronize_session=False)).rowcount
    s.execute(delete(ProxySession).where(ProxySession.user_id == user_id))  # JupyterLab's cookies: a shell each
    keys = s.execute(delete(SshKey).where(SshKey.user_id == user_id)).rowcount if drop_ssh_keys else 0
    bought = 0
    if drop_ssh_keys:
        made = update(EndpointKey).where(EndpointKey.user_id == user_id, EndpointKey.revoked_at.is_(None))
        bought = s.execute(made.values(revoked_at=now).execution_options(synchronize_session=False)).rowcount
    s.execute(
        update(PasswordReset)
        .where(PasswordReset.user_id == user_id, PasswordReset.used_at.is_(None))
        .values(used_at=now)
        .execution_options(synchronize_session=False)
    )
    return SignedOut(int(tokens or 0), int(keys or 0), int(bought or 0))


def count_ask(s: Session, email: str, address: str, now: datetime) -> None:
    """Count an ask for a link to `email` (normalised) from `address`, or refuse it with 429: the same for an
    address nobody has."""
    throttle.count(s, ("reset-address", throttle.counted_address(address)), ASK_ADDRESS, now,
                   "too many password resets asked for from your address")  # fmt: skip
    throttle.count(s, ("reset-email", email), ASK_EMAIL, now, "email: too many reset links asked for this address")


def issue(s: Session, email: str, now: datetime) -> tuple[str, str] | None:
    """A new link for the user with this (normalised) address: their address and the token to mail, or None when
    nobody has it. Run after the answer was sent (`count_ask` decided it), so its work does not time the answer."""
    user = s.scalar(select(User).where(User.email == email))
    if user is None:
        return None
    plain = new_secret()
    s.add(PasswordReset(token_hash=token_hash(plain), user_id=user.id, created_at=now,
                        expires_at=now + TOKEN_TTL, used_at=None))  # fmt: skip
    s.flush()
    return user.email, plain


def check_known(s: Session, token: str) -> None:
    """422 for a token not of our shape or matching no link: checked on a read, before the new password is hashed,
    so garbage sent to the unauthenticated route costs neither the write lock nor a hash."""
    links.check_known(s, PasswordReset, token, UNKNOWN)


def redeem(s: Session, token: str, now: datetime) -> User:
    """Spend the link: the user it was mailed to, or 422/409 naming `token`. The user's row is locked first, as
    `set_password` takes it (`links.spend`); the caller then sets the password in the same transaction."""
    used = "token: this link was used already (or a newer password was set); ask for a new one"
    row = links.spend(s, PasswordReset, token, now, unknown=UNKNOWN, used=used,
                      expired="token: this link has expired; ask for a new one")  # fmt: skip
    user = s.get(User, row.user_id)
    assert user is not None  # `links.spend` refused a link whose user is gone
    return user


def message(to: str, site_url: str, token: str) -> Mail:
    link = f"{site_url}{PATH}?token={token}"
    minutes = int(TOKEN_TTL.total_seconds() // 60)
    body = (
        "Someone (we hope you) asked to reset the password of the suanli account with this address.\n\n"
        f"Open this link to choose a new password:\n\n    {link}\n\n"
        f"The link works once, for {minutes} minutes. Setting a new password signs you out everywhere else. "
        "If you did not ask, ignore this message: your password stays as it is.\n"
    )
    return Mail(to=to, subject="Reset your suanli password", body=body)
