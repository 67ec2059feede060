"""The caller's own password, asked again before an act a stolen token must not do alone: changing the password, or
making a credential that outlives the caller's token (an API token expiring later, an SSH key, an endpoint key).
Checked as a login is: on the password pool, counted by the login throttle (429 with Retry-After), refused naming
the field; and the hash it was checked against must still be the account's when the act commits (a password
changed meanwhile: 409), as a login's must."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from suanli.api.deps import Caller, Server, client_address
from suanli.control.accounts import accounts, throttle
from suanli.control.errors import Conflict, Forbidden, Invalid
from suanli.control.ids import utcnow


@dataclass(frozen=True)
class Proof:
    """A password checked for this act: the attempt to forgive, and the hash it matched."""

    attempt: throttle.LoginAttempt
    checked: str


def begin(srv: Server, email: str, address: str) -> tuple[throttle.LoginAttempt, str | None]:
    """Count the attempt (or refuse it, 429) and read the stored hash: a login's first step too."""
    with srv.db.write() as s, s.begin():
        return throttle.begin_login(s, email, address, utcnow()), accounts.password_hash_of(s, email)


async def confirm(srv: Server, email: str, request: Request, password: str, field: str) -> Proof:
    """The password checked; a wrong one: 422 naming `field`."""
    slot = srv.passwords.reserve()
    try:
        attempt, stored = await run_in_threadpool(begin, srv, email, client_address(request))
        ok = await slot.run(accounts.verify_password, stored, password)
    finally:
        slot.release()
    if not ok or stored is None:
        raise Invalid(f"{field}: wrong password")
    return Proof(attempt, stored)


def _check_live(ctx: Caller) -> None:
    with ctx.db.write() as s, s.begin():
        accounts.check_live(s, ctx.who)


async def gate(
    ctx: Caller, request: Request, password: str | None, what: str, *, needed: bool, hint: str = ""
) -> Proof | None:
    """None when the act needs no password (`needed` false: what it makes does not outlive the caller's token);
    else the password's proof: a token revoked meanwhile 401 first, no password 403 naming `password`."""
    if not needed:
        return None
    await run_in_threadpool(_check_live, ctx)  # a token revoked meanwhile: 401, before any password is tried
    if password is None:
        until = f"{ctx.who.token_expires_at:%Y-%m-%d %H:%M} UTC" if ctx.who.token_expires_at else "never"
        raise Forbidden(f"password: {what} outlives the token making it (it expires {until}) and needs your "
                        f"password{hint}")  # fmt: skip
    return await confirm(ctx.srv, ctx.who.email, request, password, "password")


def settle(s: Session, ctx: Caller, proof: Proof | None, now: datetime) -> None:
    """In the act's own transaction: the password checked is still the account's (FOR SHARE waits for a new one
    being set, then reads it; changed: 409), and the attempt is forgiven."""
    if proof is None:
        return
    if not accounts.password_still(s, ctx.who.user_id, proof.checked):
        raise Conflict("password: the password was changed meanwhile; log in again")
    throttle.login_succeeded(s, proof.attempt, now)
