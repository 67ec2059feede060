"""Passwords after signup: change one's own (knowing it), ask for a reset link by mail, redeem it. Every new
password signs the user out everywhere else (`control.accounts.password_resets`)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, BackgroundTasks, Request
from fastapi.concurrency import run_in_threadpool

from suanli.api import reauth
from suanli.api.deps import Auth, Server, Srv, client_address
from suanli.api.schemas import (
    PasswordChangeIn,
    PasswordResetAskIn,
    PasswordResetAskOut,
    PasswordResetIn,
    PasswordSetOut,
)
from suanli.api.strict_json import StrictJSONRoute
from suanli.control.accounts import accounts, password_resets, throttle, verification
from suanli.control.errors import Conflict, Invalid
from suanli.control.ids import utcnow
from suanli.mail import outbox

router = APIRouter(route_class=StrictJSONRoute, tags=["accounts"])
log = logging.getLogger("suanli.mail")

ASKED = ("if an account has this address, a link to reset its password was mailed to it; it works once, within "
         "the hour")  # fmt: skip


def _check_then_hash(stored: str | None, current: str, new: str) -> str | None:
    """On the password pool's thread: the new password's hash, or None when `current` is wrong."""
    if not accounts.verify_password(stored, current):
        return None
    return accounts.hash_password(new)


@router.put("/me/password")
async def change_password(body: PasswordChangeIn, request: Request, ctx: Auth) -> PasswordSetOut:
    """Set a new password, given the current one. Every other token of the caller (logins, console sessions and
    API tokens) is revoked and their instance proxy sessions end; the one that made this request stays, and so do
    their SSH keys. A wrong current password is counted like a failed login (the same throttle, 429 with
    Retry-After) and refused naming `current_password`; a new password set meanwhile (a reset): 409."""
    accounts.check_password(body.new_password, "new_password")
    if body.new_password == body.current_password:
        raise Invalid("new_password: the same as the current one")
    srv, email = ctx.srv, ctx.who.email
    slot = srv.passwords.reserve()
    try:
        attempt, stored = await run_in_threadpool(reauth.begin, srv, email, client_address(request))
        hashed = await slot.run(_check_then_hash, stored, body.current_password, body.new_password)
    finally:
        slot.release()
    if hashed is None or stored is None:
        raise Invalid("current_password: wrong password")
    return await run_in_threadpool(_finish_change, srv, ctx.who, attempt, stored, hashed)


def _finish_change(srv: Server, who: accounts.Principal, attempt: throttle.LoginAttempt, stored: str,
                   hashed: str) -> PasswordSetOut:  # fmt: skip
    now = utcnow()
    with srv.db.write() as s, s.begin():
        out = password_resets.set_password(s, who.user_id, hashed, now, keep_token_id=who.token_id,
                                           expected_hash=stored)  # fmt: skip
        throttle.login_succeeded(s, attempt, now)
    srv.tokens.forget_all()
    return PasswordSetOut(email=who.email, revoked_tokens=out.tokens, removed_ssh_keys=out.ssh_keys)


@router.post("/password/forgot", status_code=202)
async def ask_reset(
    body: PasswordResetAskIn, request: Request, srv: Srv, later: BackgroundTasks
) -> PasswordResetAskOut:
    """Mail a link to reset the password of the account with this address. The answer is the same, in words and
    in work, whether or not an account has it: only the throttle is counted before it, and the link is made and
    mailed after it. 429 past 3 links for one address (then one every 20 minutes) or 10 asks from one client
    address (then 10 an hour); 409 where this server sends no mail (an operator sets passwords then: `suanli admin
    set-password`)."""
    if srv.mailer is None:
        raise Conflict("email: this server sends no mail (no smtp_url); ask the operator to set a new password")
    email = accounts.check_email(body.email)
    await run_in_threadpool(_count_ask, srv, email, client_address(request))
    later.add_task(_issue_and_mail, srv, email)
    return PasswordResetAskOut(detail=ASKED)


def _count_ask(srv: Server, email: str, address: str) -> None:
    with srv.db.write() as s, s.begin():
        password_resets.count_ask(s, email, address, utcnow())


def _issue_and_mail(srv: Server, email: str) -> None:
    """After the answer: the link, if anyone has the address, and its mail (off this thread). A database that
    fails now loses this one link, said in the log; the user may ask again."""
    try:
        with srv.db.write() as s, s.begin():
            found = password_resets.issue(s, email, utcnow())
        if found is not None and srv.mailer is not None:
            to, token = found
            outbox.send_later(srv.mailer, password_resets.message(to, srv.settings.site_url, token))
    except Exception:  # the answer is gone: nobody to tell but the log
        log.warning("password reset link not made or not queued", exc_info=True)


@router.post("/password/reset")
async def reset_password(body: PasswordResetIn, srv: Srv) -> PasswordSetOut:
    """Redeem a reset link's token and set a new password: every token of the user is revoked (log in again with
    the new password) and their SSH keys are removed (whoever held the account may have added one). An unknown or
    expired token: 422 naming `token`; a used one (or one outdated by a newer password): 409."""
    accounts.check_password(body.new_password, "new_password")
    token = body.token.strip()
    await run_in_threadpool(_check_known, srv, token)
    slot = srv.passwords.reserve()
    try:
        hashed = await slot.run(accounts.hash_password, body.new_password)
    finally:
        slot.release()
    return await run_in_threadpool(_finish_reset, srv, token, hashed)


def _check_known(srv: Server, token: str) -> None:
    with srv.db.read() as s:
        password_resets.check_known(s, token)


def _finish_reset(srv: Server, token: str, hashed: str) -> PasswordSetOut:
    now = utcnow()
    with srv.db.write() as s, s.begin():
        user = password_resets.redeem(s, token, now)
        out = password_resets.set_password(s, user.id, hashed, now, drop_ssh_keys=True)
        verification.proven(s, user, now, srv.settings.trial_credit)  # the link proves the mailbox
        email = user.email
    srv.tokens.forget_all()
    return PasswordSetOut(email=email, revoked_tokens=out.tokens, removed_ssh_keys=out.ssh_keys,
                          revoked_endpoint_keys=out.endpoint_keys)  # fmt: skip
