"""Sign-up, login (throttled, passwords checked on their own threads), the caller, and API tokens."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from suanli.api.deps import Auth, Server, Srv, client_address, in_thread
from suanli.api.schemas import (
    Credentials,
    MeOut,
    NewTokenOut,
    OrgOut,
    SessionOut,
    SignupIn,
    SignupOut,
    TokenIn,
    TokenOut,
    UserOut,
)
from suanli.api.strict_json import StrictJSONRoute
from suanli.billing.money import shown
from suanli.control.accounts import accounts, memberships, signups, throttle
from suanli.control.errors import Conflict, Unauthorized
from suanli.control.ids import utcnow
from suanli.control.money import ledger, prices

router = APIRouter(route_class=StrictJSONRoute, tags=["accounts"])


SIGNUP_REFUSED = "signup: cannot sign up with these details (if you have an account here, log in)"


@router.post("/signup", status_code=201)
async def signup(body: SignupIn, request: Request, srv: Srv) -> SignupOut:
    """A new user with a personal organisation and the trial credit; returns a login token. Where the operator
    made signup invite-only, `invite` is an invitation's code (the user then joins that organisation) or an
    operator's invite code. An email that cannot sign up gets one message, whatever the reason."""
    cfg = srv.settings
    email = accounts.check_credentials(body.email, body.password)
    signups.check_open(cfg.signup, body.invite)
    slot = srv.passwords.reserve()
    try:
        await run_in_threadpool(_count_signup, srv, client_address(request))
        hashed = await slot.run(accounts.hash_password, body.password)
    finally:
        slot.release()
    return await run_in_threadpool(_create_user, srv, email, body, hashed)


def _count_signup(srv: Server, address: str) -> None:
    with srv.db.write() as s, s.begin():
        throttle.begin_signup(s, address, throttle.signup_bucket(srv.settings.signup_per_address_per_hour), utcnow())


def _create_user(srv: Server, email: str, body: SignupIn, hashed: str) -> SignupOut:
    now, cfg = utcnow(), srv.settings
    with srv.db.write() as s, s.begin():
        invitation = signups.redeem(s, cfg.signup, email, body.invite, now)
        try:
            user, org = accounts.create_user(s, email, body.password, now, trial_credit=cfg.trial_credit,
                                             password_hash=hashed)  # fmt: skip
        except accounts.EmailTaken:
            raise Conflict(SIGNUP_REFUSED) from None  # not "already registered": see docs/control-plane.md
        if invitation is not None:
            memberships.join(s, user.id, invitation, now)
        tok, plain = accounts.issue_token(s, user, "login", now, now + timedelta(days=cfg.login_token_days))
        bal = ledger.org_balance(s, org.id)
        currency = prices.current(s)[1].currency
    return SignupOut(
        user=UserOut.model_validate(user), token=plain, token_id=tok.id, expires_at=tok.expires_at,
        org=OrgOut.model_validate(org).model_copy(update={"role": "owner"}), balance=shown(bal), currency=currency,
    )  # fmt: skip


@router.post("/login")
async def login(body: Credentials, request: Request, srv: Srv) -> SessionOut:
    """A login token for a correct password. Attempts are throttled per account, per address and per account from
    an address (429 with Retry-After; the rule is in docs/control-plane.md)."""
    email = accounts.normalise_email(body.email)
    slot = srv.passwords.reserve()
    try:
        attempt, stored = await run_in_threadpool(_begin_login, srv, email, client_address(request))
        ok = await slot.run(accounts.verify_password, stored, body.password)
    finally:
        slot.release()
    if not ok:
        raise Unauthorized("wrong email or password")
    return await run_in_threadpool(_finish_login, srv, email, attempt)


def _begin_login(srv: Server, email: str, address: str) -> tuple[throttle.LoginAttempt, str | None]:
    with srv.db.write() as s, s.begin():
        return throttle.begin_login(s, email, address, utcnow()), accounts.password_hash_of(s, email)


def _finish_login(srv: Server, email: str, attempt: throttle.LoginAttempt) -> SessionOut:
    now = utcnow()
    with srv.db.write() as s, s.begin():
        user, tok, plain = accounts.finish_login(s, email, now, srv.settings.login_token_days)
        throttle.login_succeeded(s, attempt, now)
        return SessionOut(user=UserOut.model_validate(user), token=plain, token_id=tok.id, expires_at=tok.expires_at)


@router.post("/logout", status_code=204)
@in_thread
def logout(ctx: Auth) -> None:
    """Revoke the token this request carries."""
    with ctx.db.write() as s, s.begin():
        accounts.revoke_token(s, ctx.who, ctx.who.token_id, ctx.now)
    ctx.srv.tokens.forget_all()


@router.get("/me")
@in_thread
def me(ctx: Auth) -> MeOut:
    with ctx.db.read() as s:
        user = accounts.user(s, ctx.who)
        orgs = [OrgOut.model_validate(o).model_copy(update={"role": r}) for o, r in accounts.orgs_of(s, ctx.who)]
    return MeOut(user=UserOut.model_validate(user), orgs=orgs)


@router.get("/tokens")
@in_thread
def list_tokens(ctx: Auth) -> list[TokenOut]:
    with ctx.db.read() as s:
        return [TokenOut.model_validate(t) for t in accounts.list_tokens(s, ctx.who)]


@router.post("/tokens", status_code=201)
@in_thread
def create_token(body: TokenIn, ctx: Auth) -> NewTokenOut:
    expires = ctx.now + timedelta(days=body.expires_in_days) if body.expires_in_days else None
    with ctx.db.write() as s, s.begin():
        user = accounts.user(s, ctx.who)
        tok, plain = accounts.issue_token(s, user, body.name, ctx.now, expires)
    return NewTokenOut(**TokenOut.model_validate(tok).model_dump(), token=plain)


@router.delete("/tokens/{token_id}")
@in_thread
def revoke_token(token_id: str, ctx: Auth) -> TokenOut:
    with ctx.db.write() as s, s.begin():
        out = TokenOut.model_validate(accounts.revoke_token(s, ctx.who, token_id, ctx.now))
    ctx.srv.tokens.forget_all()
    return out
