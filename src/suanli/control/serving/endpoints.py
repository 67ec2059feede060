"""Endpoints as tenants see them: deploy, list, describe, scale, remove; their API keys and events.

An endpoint's replicas are ordinary workloads (placed, billed, stopped and retried like any), submitted by the
serving pass (`control.serving.serving`) as the user who deployed it, for the endpoint's org. This module holds what
requests do; the serving pass keeps the replicas at the count wanted.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from suanli.billing.tokens import cost_of_tokens
from suanli.control.accounts import accounts, memberships
from suanli.control.accounts.accounts import Principal
from suanli.control.caches import FleetCache, PriceCache
from suanli.control.errors import Conflict, Invalid, NotFound, Unauthorized
from suanli.control.ids import new_id, token_hash
from suanli.control.serving.token_billing import price_of
from suanli.control.storage import hub
from suanli.control.workloads import admission, workloads
from suanli.db.models import Membership, Org, User, Workload
from suanli.db.serving import Endpoint, EndpointEvent, EndpointKey, EndpointLoad, EndpointReplica, EndpointUsage
from suanli.db.volumes import Volume, VolumeVersion
from suanli.serving.runtimes import Replica, runtime
from suanli.serving.spec import MAX_REPLICAS, EndpointSpec, VolumeModel, parse_endpoint, replica_spec, volume_model
from suanli.storage import volume_versions as versions_store
from suanli.storage import volumes as volume_store
from suanli.workloads.spec import SpecError, WorkloadSpec

KEY_PREFIX = "sk-sl-"
MAX_KEYS = 100  # live keys per endpoint that its own org pays for
MAX_KEYS_PER_BUYER = 10  # live keys per endpoint that one other org pays for
MAX_ENDPOINTS = 20  # per org, unless the operator says otherwise (settings `endpoints_per_org`)
EVENTS_SHOWN = 200


def parse(source: str | dict) -> EndpointSpec:
    try:
        return parse_endpoint(source)
    except SpecError as e:
        raise Invalid(str(e)) from e


@dataclass(frozen=True)
class Admitting:
    """What submitting a replica needs (the API's and the loop's caches and hold)."""

    hold_minutes: int
    fleet: FleetCache
    prices: PriceCache
    check: Callable[[WorkloadSpec], None] | None = None  # the sandbox policy's (a published `image:`)
    volumes_root: Path | None = None  # where volumes' files are: a `vol:` checkpoint's directory is looked for there
    per_org: int = MAX_ENDPOINTS  # endpoints an org may have (settings `endpoints_per_org`)


def principal_of(s: Session, user_id: str) -> Principal:
    u = s.get(User, user_id)
    if u is None:
        raise NotFound(f"user {user_id} not found")
    return Principal(u.id, u.email, u.is_admin, u.personal_org_id, "")


def replica_workload(
    e: Endpoint, spec: EndpointSpec, index: int, port: int, key: str = ""
) -> tuple[Replica, WorkloadSpec]:
    """The runtime's view of a replica and its workload spec (`key`: the secret its runtime requires)."""
    rt = runtime(spec.runtime_name())
    r = Replica(e.repo_id, spec.name, port, spec.gpus(), spec.max_model_len, key)
    return r, replica_spec(spec, index, rt.command(r), port, rt.env(r))


def create(
    s: Session, who: Principal, spec: EndpointSpec, now: datetime, admitting: Admitting, org_id: str | None = None
) -> Endpoint:
    """Deploy: the hub model must exist, and one replica must be admissible now (GPUs registered, priced, within
    the org's quota and balance: the same checks as any submission), else a 4xx naming the field."""
    if org_id is not None and org_id != who.personal_org_id:
        org_id = memberships.require(s, who, org_id, "submit", "spend").org.id
    org_id = org_id or who.personal_org_id
    s.get(Org, org_id, with_for_update=True)  # an org's endpoints are counted one deployment at a time
    count = s.scalar(select(func.count()).select_from(Endpoint).where(Endpoint.org_id == org_id)) or 0
    if count >= admitting.per_org:
        raise Conflict(f"name: the organisation has {count} endpoints, the most it may have (endpoints_per_org)")
    vm = volume_model(spec.model)
    if vm is not None:
        repo_id = vm.sandbox_path
        _check_checkpoint(s, org_id, vm, admitting.volumes_root)
    else:
        try:
            repo_id = hub.entry(s, "model", spec.model).repo_id
        except NotFound:
            raise Invalid(
                f"model: no model called {spec.model!r} in the hub (`suanli hub models` lists them)"
            ) from None
    rt = runtime(spec.runtime_name())
    probe = Replica(repo_id, spec.name, 1024, spec.gpus(), spec.max_model_len)
    trial = replica_spec(spec, 0, rt.command(probe), 1024, rt.env(probe))
    hub.check_spec(s, trial)
    if admitting.check is not None:
        admitting.check(trial)
    # (a checkpoint's volume: the same rules as a workload's mount, here the caller's right to read it)
    admission.admit(s, who, trial, now, hold_minutes=admitting.hold_minutes, fleet=admitting.fleet,
                    prices=admitting.prices, org_id=org_id)  # fmt: skip
    if s.scalar(select(Endpoint.id).where(Endpoint.org_id == org_id, Endpoint.name == spec.name)) is not None:
        raise Conflict(f"name: an endpoint called {spec.name} exists in this organisation")
    scaling = spec.scaling()
    e = Endpoint(id=new_id("ep"), org_id=org_id, user_id=who.user_id, name=spec.name,
                 spec=spec.model_dump(mode="json", exclude_none=True), repo_id=repo_id,
                 min_replicas=scaling.min_replicas, max_replicas=scaling.max_replicas, desired=scaling.min_replicas,
                 created_at=now, changed_at=now)  # fmt: skip
    s.add(e)
    event(s, e.id, "deploy", f"deployed by {who.email}: {spec.model} ({repo_id}) on {spec.runtime_name()}, "
          f"{spec.gpus()} GPU(s) per replica, {scaling.min_replicas}-{scaling.max_replicas} replicas", now)  # fmt: skip
    return e


def _check_checkpoint(s: Session, org_id: str, vm: VolumeModel, root: Path | None) -> None:
    """A `vol:` checkpoint: the volume (and version) is the endpoint org's, and, where this process sees the
    volumes' files, the path is a directory inside it (a link out of the volume does not count)."""
    name, _, version = vm.ref.partition("@")
    v = s.scalar(select(Volume).where(Volume.org_id == org_id, Volume.name == name))
    if v is None:
        raise Invalid(f"model: no volume called {name} in this organisation (`suanli volumes ls`)")
    if version and s.get(VolumeVersion, (v.id, int(version))) is None:
        raise Invalid(f"model: volume {name} has no version {version}")
    if root is None:
        return
    p = volume_store.paths(root, v.org_id, v.id, v.org_uid)
    base = (versions_store.tree(p, int(version)) if version else p.data).resolve()
    where = (base / vm.path).resolve()
    if not (where == base or base in where.parents) or not where.is_dir():
        raise Invalid(f"model: {vm.path or '/'} is not a directory in volume {vm.ref}")


def spec_of(e: Endpoint) -> EndpointSpec:
    return EndpointSpec.model_validate(e.spec)


def event(s: Session, endpoint_id: str, kind: str, reason: str, now: datetime) -> None:
    s.add(EndpointEvent(endpoint_id=endpoint_id, at=now, kind=kind, reason=reason[:2000]))


def _visible(s: Session, who: Principal) -> list[str]:
    return [o.id for o, _ in accounts.orgs_of(s, who)]


def get(s: Session, who: Principal, ref: str, *, lock: bool = False) -> Endpoint:
    """By id, or by name in the caller's orgs (the personal org first). Another org's endpoint does not exist."""
    orgs = _visible(s, who)
    e = s.get(Endpoint, ref, with_for_update=lock, populate_existing=lock)
    if e is None:
        rows = list(s.scalars(select(Endpoint).where(Endpoint.name == ref, Endpoint.org_id.in_(orgs))))
        rows.sort(key=lambda x: x.org_id != who.personal_org_id)
        e = rows[0] if rows else None
        if e is not None and lock:
            s.refresh(e, with_for_update=True)
    if e is None or e.org_id not in orgs:
        raise NotFound(f"endpoint {ref} not found")
    return e


def listing(s: Session, who: Principal) -> list[Endpoint]:
    return list(s.scalars(select(Endpoint).where(Endpoint.org_id.in_(_visible(s, who))).order_by(Endpoint.name)))


def replicas(s: Session, endpoint_id: str) -> list[tuple[EndpointReplica, Workload]]:
    rows = s.execute(select(EndpointReplica, Workload).join(Workload, Workload.id == EndpointReplica.workload_id)
                     .where(EndpointReplica.endpoint_id == endpoint_id).order_by(EndpointReplica.created_at))  # fmt: skip
    return [(r, w) for r, w in rows]


def is_ready(r: EndpointReplica, w: Workload) -> bool:
    return w.state == "running" and not w.stop_requested and r.ready_attempt == w.attempt


def events(s: Session, endpoint_id: str) -> list[EndpointEvent]:
    q = select(EndpointEvent).where(EndpointEvent.endpoint_id == endpoint_id).order_by(EndpointEvent.id.desc())
    return list(reversed(s.scalars(q.limit(EVENTS_SHOWN)).all()))


def _rights_over(who: Principal, maker: str, right: str) -> tuple[str, ...]:
    """What acting on what another member made takes, as for their workloads (`memberships.check_work`): `others`
    too. An endpoint's replicas run as its deployer and are charged to them (their spend limit too), and its keys
    act for their makers: a plain member scaled a colleague's endpoint up on the colleague's money, or removed it."""
    return (right,) if maker == who.user_id else (right, "others")


def scale(s: Session, who: Principal, ref: str, count: int, now: datetime) -> Endpoint:
    """A fixed count: min = max = desired = count (0 stops every replica; requests then wait for none)."""
    if not 0 <= count <= MAX_REPLICAS:
        raise Invalid(f"replicas: must be 0..{MAX_REPLICAS} (got {count})")
    e = get(s, who, ref, lock=True)
    memberships.require(s, who, e.org_id, *_rights_over(who, e.user_id, "submit"))
    before = e.desired
    e.min_replicas = e.max_replicas = e.desired = count
    e.max_replicas = max(1, count)
    e.changed_at = now
    event(s, e.id, "scale", f"scaled by {who.email} to {count} replica(s): {before} → {count}", now)
    return e


def stop_replica(s: Session, w: Workload, why: str, now: datetime) -> None:
    """Stop a replica's workload as the platform (no principal): pending work at once, running work by request."""
    from suanli.control.money import metering

    if w.state in ("pending", "scheduled"):
        if w.allocation_id is not None and w.state == "scheduled":
            metering.close_allocation(s, w.allocation_id, now)
        workloads.transition(s, w, "stopped", why, now)
    elif w.state in ("starting", "running") and w.stop_requested is None:
        w.stop_requested = why
        workloads.event(s, w, f"stop requested: {why}", now)


def remove(s: Session, who: Principal, ref: str, now: datetime) -> Endpoint:
    """Stop every replica and delete the endpoint with its keys (its replicas stay as finished workloads)."""
    e = get(s, who, ref, lock=True)
    memberships.require(s, who, e.org_id, *_rights_over(who, e.user_id, "submit"))
    for _, w in replicas(s, e.id):
        stop_replica(s, w, f"endpoint {e.name} removed by {who.email}", now)
    for table in (EndpointKey, EndpointLoad, EndpointEvent, EndpointReplica):
        s.execute(delete(table).where(table.endpoint_id == e.id))
    s.delete(e)
    return e


@dataclass(frozen=True)
class UsageRow:
    minute: datetime
    key_id: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    charged_tokens: int  # of this row's tokens, those another org's key has paid for
    charged: Decimal  # what they cost at the endpoint's per-token price now (`billing.tokens.cost_of_tokens`)


def usage(s: Session, who: Principal, ref: str, limit: int = 10_000) -> list[UsageRow]:
    """Per key per minute, newest first, with what other orgs' keys were charged for it."""
    e = get(s, who, ref)
    q = select(EndpointUsage).where(EndpointUsage.endpoint_id == e.id)
    rows = s.scalars(q.order_by(EndpointUsage.minute.desc(), EndpointUsage.key_id).limit(limit))
    price = price_of(e.spec)
    buyers = set(
        s.scalars(select(EndpointKey.id).where(EndpointKey.endpoint_id == e.id, EndpointKey.org_id != e.org_id))
    )
    # (the endpoint's own keys have their tokens marked as settled too, but pay nothing per token)
    return [UsageRow(u.minute, u.key_id, u.requests, u.prompt_tokens, u.completion_tokens,
                     paid := u.charged_tokens if u.key_id in buyers and price else 0,
                     cost_of_tokens(paid, price) if paid and price else Decimal(0))
            for u in rows]  # fmt: skip


# ---- keys -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyGrant:
    key_id: str
    endpoint_id: str
    org_id: str  # pays
    user_id: str = ""  # made it: their place in the paying org (and their spend limit there) binds the key


def create_key(
    s: Session, who: Principal, ref: str, name: str, now: datetime, org_id: str | None = None
) -> tuple[EndpointKey, str]:
    """A key for one endpoint, shown once; only its SHA-256 is kept. A member of the endpoint's org gets one for
    that org. Another org's member gets one only for an endpoint with a price (`price_per_1m_tokens`), named by id,
    for an org of theirs that then pays the endpoint's org per token (`control.serving.token_billing`)."""
    if not name or len(name) > 128 or not name.isprintable():
        raise Invalid("name: 1-128 printable characters")
    e = s.get(Endpoint, ref)
    mine = _visible(s, who)
    if e is None or e.org_id in mine:
        e = get(s, who, ref)
        payer = org_id or e.org_id
        if payer != e.org_id:
            memberships.require(s, who, payer, "spend")
        memberships.require(s, who, e.org_id, "submit")
    else:
        price = spec_of(e).price_per_1m_tokens
        if price is None or Decimal(price) <= 0:
            raise NotFound(f"endpoint {ref} not found")  # not offered: it does not exist for other orgs
        payer = org_id or who.personal_org_id
        if payer != who.personal_org_id:
            memberships.require(s, who, payer, "spend")
    # Counted per paying org: a buyer's keys never take the owner's room, nor another buyer's.
    most = MAX_KEYS if payer == e.org_id else MAX_KEYS_PER_BUYER
    s.get(Org, payer, with_for_update=True)  # the paying org's keys counted one at a time
    live = s.scalar(select(func.count()).select_from(EndpointKey).where(
        EndpointKey.endpoint_id == e.id, EndpointKey.org_id == payer, EndpointKey.revoked_at.is_(None)))  # fmt: skip
    if (live or 0) >= most:
        raise Conflict(f"endpoint: {e.name} has {most} live keys paid by this org; revoke some first")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    row = EndpointKey(id=new_id("ek"), endpoint_id=e.id, org_id=payer, user_id=who.user_id, name=name,
                      token_hash=token_hash(secret), prefix=secret[: len(KEY_PREFIX) + 6], created_at=now)  # fmt: skip
    s.add(row)
    return row, secret


def keys(s: Session, who: Principal, ref: str) -> list[EndpointKey]:
    e = get(s, who, ref)
    return list(s.scalars(select(EndpointKey).where(EndpointKey.endpoint_id == e.id).order_by(EndpointKey.created_at)))


def revoke_key(s: Session, who: Principal, key_id: str, now: datetime) -> EndpointKey:
    """By a member of the paying org, or of the endpoint's (an owner may cut a buyer off)."""
    row = s.get(EndpointKey, key_id)
    e = s.get(Endpoint, row.endpoint_id) if row is not None else None
    mine = _visible(s, who)
    if row is None or (row.org_id not in mine and (e is None or e.org_id not in mine)):
        raise NotFound(f"key {key_id} not found")
    where = row.org_id if row.org_id in mine else e.org_id  # type: ignore[union-attr]
    memberships.require(s, who, where, *_rights_over(who, row.user_id, "submit"))
    if row.revoked_at is None:
        row.revoked_at = now
    return row


def authenticate_key(s: Session, secret: str) -> KeyGrant:
    """The endpoint a key opens; 401 for anything else (malformed, unknown, revoked: the same words)."""
    if not secret.startswith(KEY_PREFIX) or len(secret) > 128:
        raise Unauthorized("invalid API key")
    row = s.scalar(select(EndpointKey).where(EndpointKey.token_hash == token_hash(secret)))
    if row is None or row.revoked_at is not None:
        raise Unauthorized("invalid API key")
    # A key acts for its maker in the org that pays: one who left it, or may no longer do what making it took
    # (use the org's endpoint, or spend its money on another's), made a key that no longer works.
    owner = s.scalar(select(Endpoint.org_id).where(Endpoint.id == row.endpoint_id))
    role = s.scalar(select(Membership.role).where(Membership.org_id == row.org_id, Membership.user_id == row.user_id))
    right = "submit" if row.org_id == owner else "spend"
    if (role is None or right not in memberships.RIGHTS[role]) and not s.scalar(
        select(User.is_admin).where(User.id == row.user_id)
    ):  # an operator's key (made for any org) stands while they are an operator
        raise Unauthorized("this key's maker may no longer use it for its organisation; a member makes a new one")
    return KeyGrant(row.id, row.endpoint_id, row.org_id, row.user_id)
