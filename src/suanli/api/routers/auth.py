"""Sign-up, login, the caller, and API tokens."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter

from suanli.api.deps import Auth, Srv, in_thread
from suanli.api.schemas import (
    Credentials,
    MeOut,
    NewTokenOut,
    OrgOut,
    SessionOut,
    SignupOut,
    TokenIn,
    TokenOut,
    UserOut,
)
from suanli.api.strict_json import StrictJSONRoute
from suanli.billing.money import shown
from suanli.control import accounts, ledger, prices
from suanli.control.ids import utcnow

router = APIRouter(route_class=StrictJSONRoute, tags=["accounts"])


@router.post("/signup", status_code=201)
@in_thread
def signup(body: Credentials, srv: Srv) -> SignupOut:
    """A new user with a personal organisation and the trial credit; returns a login token."""
    now = utcnow()
    cfg = srv.settings
    with srv.db.write() as s, s.begin():
        user, org = accounts.create_user(s, body.email, body.password, now, trial_credit=cfg.trial_credit)
        tok, plain = accounts.issue_token(s, user, "login", now, now + timedelta(days=cfg.login_token_days))
        bal = ledger.org_balance(s, org.id)
        currency = prices.current(s)[1].currency
    return SignupOut(
        user=UserOut.model_validate(user), token=plain, token_id=tok.id, expires_at=tok.expires_at,
        org=OrgOut.model_validate(org).model_copy(update={"role": "owner"}), balance=shown(bal), currency=currency,
    )  # fmt: skip


@router.post("/login")
@in_thread
def login(body: Credentials, srv: Srv) -> SessionOut:
    now = utcnow()
    with srv.db.write() as s, s.begin():
        user, tok, plain = accounts.login(s, body.email, body.password, now, srv.settings.login_token_days)
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
