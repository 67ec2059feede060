"""What every route gets: the server's state and the authenticated caller."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, ParamSpec, TypeVar

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from suanli.api.schemas import NUL_MESSAGE
from suanli.control.accounts import accounts
from suanli.control.accounts.accounts import Principal
from suanli.control.accounts.passwords import PasswordPool
from suanli.control.caches import FleetCache, PriceCache, TokenCache
from suanli.control.errors import Invalid, Unauthorized
from suanli.control.ids import token_hash, utcnow
from suanli.control.money.offers import OfferCache
from suanli.control.settings import Settings
from suanli.control.telemetry.telemetry import FleetIndex
from suanli.control.workloads import admission
from suanli.db.engine import Database
from suanli.db.group_commit import GroupCommit
from suanli.mail import Mailer
from suanli.telemetry.health import HealthJudge

P = ParamSpec("P")
R = TypeVar("R")


def in_thread(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """Run a sync route body in the thread pool in ONE hop. FastAPI would otherwise also validate the response
    of a sync route in the pool: two hops, which cost more than a cached read itself."""

    @functools.wraps(fn)
    async def route(*args: P.args, **kwargs: P.kwargs) -> R:
        return await run_in_threadpool(fn, *args, **kwargs)

    route.__signature__ = inspect.signature(fn, eval_str=True)  # type: ignore[attr-defined]
    return route


bearer = HTTPBearer(auto_error=False, description="an API token (`suanli login` or `suanli tokens create`)")


@dataclass
class Server:
    settings: Settings
    db: Database
    offers: OfferCache = field(default_factory=OfferCache)
    tokens: TokenCache = field(default_factory=TokenCache)
    prices: PriceCache = field(default_factory=PriceCache)
    fleet: FleetCache = field(default_factory=FleetCache)
    fleet_index: FleetIndex = field(default_factory=FleetIndex)  # GPU rows and holders, for samples agents post
    judge: HealthJudge = field(default_factory=HealthJudge)  # health of posted samples (this process's share)
    submissions: GroupCommit[admission.Submission, dict[str, Any]] = field(init=False)  # checked and written
    # in batches by one thread
    passwords: PasswordPool = field(init=False)  # argon2 on threads of its own, behind a bounded queue
    mailer: Mailer | None = None  # e-mail verification; None: no `smtp_url`, the trial credit comes at signup

    def __post_init__(self) -> None:
        if self.mailer is None and self.settings.smtp_url:
            from suanli.mail.smtp import SmtpMailer

            self.mailer = SmtpMailer(self.settings.smtp_url, self.settings.mail_from)
        self.passwords = PasswordPool(self.settings.password_threads, self.settings.password_queue)
        admit = admission.Admission(self.settings.admission_hold_minutes, self.fleet, self.prices,
                                    self.settings.max_queued_per_org)  # fmt: skip
        self.submissions = GroupCommit(self.db, admission.enqueue_many, prepare=admit, name="submissions")


# Dependencies that do no I/O are `async def`: FastAPI runs sync dependencies in its thread pool, and each
# hop there costs more than the work itself on the hot read path.
async def server(request: Request) -> Server:
    return request.app.state.server


async def no_nul(request: Request) -> None:
    """Refuse NUL in path and query parameters before they reach a query: PostgreSQL cannot store or compare
    them and would fail the request with a server error."""
    for where, params in (("path", request.path_params.items()), ("query", request.query_params.multi_items())):
        for name, value in params:
            if isinstance(value, str) and "\x00" in value:
                raise Invalid(f"{where}.{name}: {NUL_MESSAGE}")


def client_address(request: Request) -> str:
    """The caller's address as uvicorn saw it (behind a reverse proxy: from X-Forwarded-For when the proxy is one
    uvicorn trusts, FORWARDED_ALLOW_IPS, by default 127.0.0.1)."""
    return request.client.host if request.client is not None else "unknown"


@dataclass(frozen=True)
class Caller:
    who: Principal
    srv: Server
    now: datetime

    @property
    def db(self) -> Database:
        return self.srv.db


def _authenticate(srv: Server, token: str, now: datetime) -> Principal:
    with srv.db.read() as s:
        return accounts.authenticate(s, token, now)


async def caller(
    srv: Annotated[Server, Depends(server)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    """The authenticated caller; a token verified in the last few seconds is not looked up again."""
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise Unauthorized("missing bearer token: log in (suanli login) and send 'Authorization: Bearer <token>'")
    now = utcnow()
    accounts.check_token_format(creds.credentials)
    key = token_hash(creds.credentials)
    who = srv.tokens.get(key, now)
    if who is None:
        who = await run_in_threadpool(_authenticate, srv, creds.credentials, now)
        srv.tokens.put(key, who, who.token_expires_at, now)
    return Caller(who, srv, now)


Auth = Annotated[Caller, Depends(caller)]
Srv = Annotated[Server, Depends(server)]
