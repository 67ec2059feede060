"""What the OpenAI gateway reads and writes: the endpoint a key opens, where an endpoint's ready replicas are, and
the load and token usage each gateway process reports (one row per endpoint and process; usage per key per minute,
added up). The gateway itself (`api.gateway`) moves the bytes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from suanli.billing.tokens import part_charge
from suanli.control.accounts import spend_limits
from suanli.control.errors import NotFound
from suanli.control.money import ledger
from suanli.control.serving import endpoints
from suanli.control.serving.endpoints import KeyGrant
from suanli.control.serving.token_billing import price_of
from suanli.db.engine import Database
from suanli.db.models import Membership, Workload
from suanli.db.serving import Endpoint, EndpointKey, EndpointLoad, EndpointReplica, EndpointUsage
from suanli.serving.runtimes import runtime


@dataclass(frozen=True)
class Route:
    """An endpoint as the gateway routes to it."""

    id: str
    name: str
    org_id: str
    runtime: str
    upstream_model: str
    cold_start_s: int
    priced: bool = False  # other orgs' keys pay per token


@dataclass(frozen=True)
class Target:
    workload_id: str
    name: str
    address: str
    port: int
    attempt: int = 0
    secret: str = ""  # what its runtime requires of every request (`serving/replica_guard.py`)

    @property
    def key(self) -> str:
        """This attempt of the replica: a restarted one is not held to its dead attempt's failures."""
        return f"{self.workload_id}.{self.attempt}"


def key(db: Database, secret: str, now: datetime) -> tuple[KeyGrant, Decimal]:
    """The key's grant and what its paying org has left for it: the org's balance, or less where the key's maker
    has a monthly spend limit there (a key of another org is refused on a priced endpoint once this is not above
    zero; its tokens are charged to the maker, as their work is)."""
    with db.read() as s:
        g = endpoints.authenticate_key(s, secret)
        owed, owed_by_maker = _not_charged_yet(s, g, now)
        left = ledger.org_balance(s, g.org_id) - owed
        limit = s.scalar(select(Membership.monthly_spend_limit).where(Membership.org_id == g.org_id,
                                                                     Membership.user_id == g.user_id))  # fmt: skip
        if limit is not None:
            spent = spend_limits.month_to_date(s, g.org_id, now, g.user_id).get(g.user_id, Decimal(0))
            left = min(left, limit - spent - owed_by_maker)
        return g, left


PENDING_S = 3600  # usage rows younger than this may still be charged: what they owe counts against what is left


def _not_charged_yet(s: Session, g: KeyGrant, now: datetime) -> tuple[Decimal, Decimal]:
    """What the paying org's keys (and of them, this key's maker's) used on other orgs' priced endpoints and is not
    charged yet: tokens are charged a minute or two after their minute (`token_billing.SETTLE_S`), and a gateway
    that looked only at the balance let a ¥10 sign-up use ¥40 of tokens before the first charge. Read by the
    endpoints of the org's keys and the last `PENDING_S` (the usage table's (endpoint, minute) index)."""
    keys = {k: (e, maker) for k, e, maker in s.execute(
        select(EndpointKey.id, EndpointKey.endpoint_id, EndpointKey.user_id).where(EndpointKey.org_id == g.org_id)
    )}  # fmt: skip
    if not keys:
        return Decimal(0), Decimal(0)
    u = EndpointUsage
    rows = s.execute(
        select(u.key_id, Endpoint.spec, Endpoint.org_id, u.charged_tokens, u.prompt_tokens + u.completion_tokens)
        .join(Endpoint, Endpoint.id == u.endpoint_id)
        .where(u.endpoint_id.in_({e for e, _ in keys.values()}), u.minute >= now - timedelta(seconds=PENDING_S),
               u.key_id.in_(list(keys)), u.charged_tokens < u.prompt_tokens + u.completion_tokens)
    )  # fmt: skip
    owed = by_maker = Decimal(0)
    for key_id, spec, seller, charged, total in rows:
        price = price_of(spec)
        if price and seller != g.org_id:
            amount = part_charge(charged, total, price)
            owed += amount
            by_maker += amount if keys[key_id][1] == g.user_id else 0
    return owed, by_maker


def route(db: Database, endpoint_id: str) -> Route:
    with db.read() as s:
        e = s.get(Endpoint, endpoint_id)
        if e is None:
            raise NotFound("endpoint removed")
        spec = endpoints.spec_of(e)
        rt = runtime(spec.runtime_name())
        from suanli.serving.runtimes import Replica

        up = rt.upstream_model(Replica(e.repo_id, e.name, 0, spec.gpus()))
        price = spec.price_per_1m_tokens
        return Route(e.id, e.name, e.org_id, rt.name, up, spec.scaling().cold_start_s, bool(price and Decimal(price)))


def ready(db: Database, endpoint_id: str) -> list[Target]:
    """The endpoint's replicas whose runtime answered its probe in their current attempt and that still run."""
    with db.read() as s:
        rows = s.execute(
            select(EndpointReplica.workload_id, Workload.name, EndpointReplica.address, EndpointReplica.port,
                   Workload.attempt, EndpointReplica.secret)
            .join(Workload, Workload.id == EndpointReplica.workload_id)
            .where(EndpointReplica.endpoint_id == endpoint_id, Workload.state == "running",
                   Workload.stop_requested.is_(None), EndpointReplica.ready_attempt == Workload.attempt)
        )  # fmt: skip
        return [Target(*r) for r in rows]


@dataclass(frozen=True)
class Load:
    inflight: int
    waiting: int
    last_request_at: datetime | None


def _insert(s: Session):  # type: ignore[no-untyped-def]
    return pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert


def report(
    db: Database, worker: str, loads: dict[str, Load], usage: Iterable[tuple[str, str, datetime, int, int, int]],
    now: datetime,
) -> None:  # fmt: skip
    """One transaction: this process's load per endpoint (replaced) and its token usage since the last report
    (added to the minute's row)."""
    with db.write() as s, s.begin():
        ins = _insert(s)
        for eid, ld in loads.items():
            stmt = ins(EndpointLoad).values(endpoint_id=eid, worker=worker, inflight=ld.inflight, waiting=ld.waiting,
                                            last_request_at=ld.last_request_at, updated_at=now)  # fmt: skip
            s.execute(stmt.on_conflict_do_update(
                index_elements=["endpoint_id", "worker"],
                set_={"inflight": ld.inflight, "waiting": ld.waiting, "last_request_at": ld.last_request_at,
                      "updated_at": now},
            ))  # fmt: skip
        for eid, kid, minute, n, prompt, completion in usage:
            t = EndpointUsage
            stmt = ins(t).values(endpoint_id=eid, key_id=kid, minute=minute, requests=n, prompt_tokens=prompt,
                                 completion_tokens=completion, charged_tokens=0)  # fmt: skip
            s.execute(stmt.on_conflict_do_update(
                index_elements=["endpoint_id", "key_id", "minute"],
                set_={"requests": t.requests + n, "prompt_tokens": t.prompt_tokens + prompt,
                      "completion_tokens": t.completion_tokens + completion},
            ))  # fmt: skip
