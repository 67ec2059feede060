"""The caller's own password, asked again before an act a stolen token must not do alone (changing the password,
making a token that outlives the caller's). Checked as a login is: on the password pool, counted by the login
throttle (429 with Retry-After), refused naming the field."""

from __future__ import annotations

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from suanli.api.deps import Server, client_address
from suanli.control.accounts import accounts, throttle
from suanli.control.errors import Invalid
from suanli.control.ids import utcnow


def begin(srv: Server, email: str, address: str) -> tuple[throttle.LoginAttempt, str | None]:
    """Count the attempt (or refuse it, 429) and read the stored hash."""
    with srv.db.write() as s, s.begin():
        return throttle.begin_login(s, email, address, utcnow()), accounts.password_hash_of(s, email)


async def confirm(srv: Server, email: str, request: Request, password: str, field: str) -> throttle.LoginAttempt:
    """The attempt to forgive (`throttle.login_succeeded`) in the act's own transaction; a wrong password: 422."""
    slot = srv.passwords.reserve()
    try:
        attempt, stored = await run_in_threadpool(begin, srv, email, client_address(request))
        ok = await slot.run(accounts.verify_password, stored, password)
    finally:
        slot.release()
    if not ok or stored is None:
        raise Invalid(f"{field}: wrong password")
    return attempt
