"""Sign-up, login (throttled, passwords checked on their own threads), the caller, and API tokens."""

from __future__ import annotations

from datetime import datetime, timedelta

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from suanli.api import reauth
from suanli.api.deps import Auth, Caller, Server, Srv, client_address, in_thread
from suanli.api.schemas import (
    Credentials,
    MeOut,
    NewTokenOut,
    OrgOut,
    ResendOut,
    SessionOut,
    SignupIn,
    SignupOut,
    TokenIn,
    TokenOut,
    UserOut,
    VerifyIn,
    VerifyOut,
)
from suanli.api.strict_json import StrictJSONRoute
from suanli.billing.money import shown
from suanli.control.accounts import accounts, memberships, signups, throttle, trials, verification
from suanli.control.errors import Conflict, Unauthorized
from suanli.control.ids import utcnow
from suanli.control.money import ledger, prices
from suanli.mail import outbox

router = APIRouter(route_class=StrictJSONRoute, tags=["accounts"])


SIGNUP_REFUSED = (
    "signup: cannot sign up with these details (if you have an account here, log in; if its password is "
    "lost, ask for a reset link: `suanli forgot-password` or the login page's link)"
)


@router.post("/signup", status_code=201)
async def signup(body: SignupIn, request: Request, srv: Srv) -> SignupOut:
    """A new user with a personal organisation and the trial credit; returns a login token. Where the operator
    made signup invite-only, `invite` is an invitation's code (the user then joins that organisation) or an
    operator's invite code. An email that cannot sign up gets one message, whatever the reason. Where the server
    sends mail (`smtp_url`), the trial credit waits for the link mailed to the address (`trial_pending`)."""
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
    now, cfg, mailer = utcnow(), srv.settings, srv.mailer
    link: str | None = None
    with srv.db.write() as s, s.begin():
        invitation = signups.redeem(s, cfg.signup, email, body.invite, now)
        try:
            user, org = accounts.create_user(s, email, body.password, now, password_hash=hashed)
        except accounts.EmailTaken:
            raise Conflict(SIGNUP_REFUSED) from None  # not "already registered": see docs/control-plane.md
        if invitation is not None:
            memberships.join(s, user.id, invitation, now)
        pending = mailer is not None and cfg.trial_credit > 0 and not trials.mailbox_had_one(s, email)
        if mailer is None:
            trials.grant(s, user, cfg.trial_credit, now)
        else:
            link = verification.issue(s, user, now, grants_trial=cfg.trial_credit > 0)
        tok, plain = accounts.issue_token(s, user, "login", now, now + timedelta(days=cfg.login_token_days))
        bal = ledger.org_balance(s, org.id)
        currency = prices.current(s)[1].currency
    if mailer is not None and link is not None:  # committed: now the mail, off this thread
        outbox.send_later(mailer, verification.message(user.email, cfg.site_url, link, trial=pending))
    return SignupOut(
        user=UserOut.model_validate(user), token=plain, token_id=tok.id, expires_at=tok.expires_at,
        org=OrgOut.model_validate(org).model_copy(update={"role": "owner"}), balance=shown(bal), currency=currency,
        trial_pending=pending,
    )  # fmt: skip


@router.post("/verify")
async def verify_email(body: VerifyIn, srv: Srv) -> VerifyOut:
    """Redeem the token of a verification link: its user's e-mail is verified and their trial credit granted, once.
    No login needed: the token proves the mailbox, and it verifies the user it was mailed to, whoever sends it.
    An unknown, expired or used token: 422 or 409 naming `token`."""
    return await run_in_threadpool(_verify, srv, body.token)


def _verify(srv: Server, token: str) -> VerifyOut:
    now = utcnow()
    with srv.db.read() as s:
        verification.check_known(s, token)
    with srv.db.write() as s, s.begin():
        done = verification.redeem(s, token, now, srv.settings.trial_credit)
        bal = ledger.org_balance(s, done.org_id)
        currency = prices.current(s)[1].currency
    return VerifyOut(user_id=done.user_id, email=done.email, email_verified=True, credited=shown(done.credited),
                     balance=shown(bal), currency=currency)  # fmt: skip


@router.post("/verify/resend", status_code=202)
@in_thread
def resend_verification(ctx: Auth) -> ResendOut:
    """Mail the caller a new verification link: 409 when verified already or when this server sends no mail, 429
    past 3 at once and then one every 20 minutes. 202: the mail is sent after this answer."""
    mailer = ctx.srv.mailer
    if mailer is None:
        raise Conflict("email: this server sends no mail (no smtp_url); there is nothing to verify")
    with ctx.db.write() as s, s.begin():
        user = accounts.user(s, ctx.who)
        link = verification.begin_resend(s, user, utcnow())
        email = user.email
        trial = verification.trial_pending(s, user, ctx.srv.settings.trial_credit)
    outbox.send_later(mailer, verification.message(email, ctx.srv.settings.site_url, link, trial=trial))
    return ResendOut(sent_to=email)


@router.post("/login")
async def login(body: Credentials, request: Request, srv: Srv) -> SessionOut:
    """A login token for a correct password. Attempts are throttled per account, per address and per account from
    an address (429 with Retry-After; the rule is in docs/control-plane.md)."""
    email = accounts.normalise_email(body.email)
    slot = srv.passwords.reserve()
    try:
        attempt, stored = await run_in_threadpool(reauth.begin, srv, email, client_address(request))
        ok = await slot.run(accounts.verify_password, stored, body.password)
    finally:
        slot.release()
    if not ok or stored is None:
        raise Unauthorized("wrong email or password")
    return await run_in_threadpool(_finish_login, srv, email, attempt, stored)


def _finish_login(srv: Server, email: str, attempt: throttle.LoginAttempt, checked: str) -> SessionOut:
    now = utcnow()
    with srv.db.write() as s, s.begin():
        user, tok, plain = accounts.finish_login(s, email, now, srv.settings.login_token_days, checked)
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
        verified = verification.is_verified(s, user.id)
        pending = (ctx.srv.mailer is not None and not verified
                   and verification.trial_pending(s, user, ctx.srv.settings.trial_credit))  # fmt: skip
    return MeOut(user=UserOut.model_validate(user), orgs=orgs, email_verified=verified, trial_pending=pending)


@router.get("/tokens")
@in_thread
def list_tokens(ctx: Auth) -> list[TokenOut]:
    with ctx.db.read() as s:
        return [TokenOut.model_validate(t) for t in accounts.list_tokens(s, ctx.who)]


@router.post("/tokens", status_code=201)
async def create_token(body: TokenIn, request: Request, ctx: Auth) -> NewTokenOut:
    """A new token. One that would expire later than the token making it (or never, while that one expires) needs
    the account's `password`: without it 403, a wrong one 422, both naming `password`; wrong ones are counted like
    failed logins (429). So a stolen day-long console session is not a way to a key that never expires."""
    expires = ctx.now + timedelta(days=body.expires_in_days) if body.expires_in_days else None
    needed = accounts.outlives(expires, ctx.who.token_expires_at)
    proof = await reauth.gate(ctx, request, body.password, "a token expiring later than this one", needed=needed,
                              hint="; or ask for fewer expires_in_days")  # fmt: skip
    return await run_in_threadpool(_issue, ctx, body.name, expires, proof)


def _issue(ctx: Caller, name: str, expires: datetime | None, proof: reauth.Proof | None) -> NewTokenOut:
    with ctx.db.write() as s, s.begin():
        accounts.check_live(s, ctx.who)
        reauth.settle(s, ctx, proof, ctx.now)
        user = accounts.user(s, ctx.who)
        tok, plain = accounts.issue_token(s, user, name, ctx.now, expires)
    return NewTokenOut(**TokenOut.model_validate(tok).model_dump(), token=plain)


@router.delete("/tokens/{token_id}")
@in_thread
def revoke_token(token_id: str, ctx: Auth) -> TokenOut:
    with ctx.db.write() as s, s.begin():
        out = TokenOut.model_validate(accounts.revoke_token(s, ctx.who, token_id, ctx.now))
    ctx.srv.tokens.forget_all()
    return out
