"""The SDK's typed results: frozen dataclasses loaded from the server's JSON (`load`) and back (`jsonable`).

Kept apart from `suanli.client` (the HTTP calls) so each stays small; `suanli.client` re-exports all of it.
Money is `Decimal` (the server sends strings), times are `datetime`; fields the server adds later are ignored.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


# ---- accounts, market and operators ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class User:
    id: str
    email: str
    is_admin: bool
    personal_org_id: str
    created_at: datetime


@dataclass(frozen=True)
class Org:
    id: str
    name: str
    personal: bool
    quota_gpus: int | None
    role: str | None = None
    quota_cpus: int | None = None  # host CPU cores held at once; None: no limit
    quota_memory_gib: int | None = None  # host memory held at once, GiB; None: no limit


@dataclass(frozen=True)
class Member:
    user_id: str
    email: str
    role: str  # owner | admin | member | viewer
    monthly_spend_limit: Decimal | None = None  # most they may spend of the org's money a month; None: no limit
    month_to_date: Decimal = Decimal(0)  # their charges to the org this calendar month (UTC)


@dataclass(frozen=True)
class Invitation:
    """An invitation to join an org with a role; the invitee accepts or declines it."""

    id: str
    org_id: str
    org_name: str
    email: str
    role: str
    monthly_spend_limit: Decimal | None
    state: str  # pending | accepted | declined | cancelled
    invited_by: str  # the inviter's email
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class NewInvitation(Invitation):
    code: str = field(default="", repr=False)  # shown once: signs the invitee up where signup is invite-only


@dataclass(frozen=True)
class InviteCode:
    """An operator's invite code (where signup is invite-only); the code itself is shown once, at creation."""

    id: str
    prefix: str
    note: str
    uses_left: int
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True)
class NewInviteCode(InviteCode):
    code: str = field(default="", repr=False)


@dataclass(frozen=True)
class Session:
    """A login: the bearer token is shown once."""

    user: User
    token: str = field(repr=False)
    token_id: str
    expires_at: datetime | None


@dataclass(frozen=True)
class Signup(Session):
    org: Org | None = None
    balance: Decimal = Decimal(0)
    currency: str = ""
    trial_pending: bool = False  # the trial credit waits for the link mailed to the address (`verify_email`)


@dataclass(frozen=True)
class PasswordSet:
    email: str
    revoked_tokens: int  # the user's other tokens (logins, console sessions, API tokens) revoked
    removed_ssh_keys: int = 0  # the user's SSH keys removed (a reset removes them; a change does not)
    revoked_endpoint_keys: int = 0  # endpoint API keys the user made, revoked (a reset; a change does not)


@dataclass(frozen=True)
class Me:
    user: User
    orgs: tuple[Org, ...]
    email_verified: bool = False
    trial_pending: bool = False  # verifying the e-mail would release the trial credit


@dataclass(frozen=True)
class Token:
    id: str
    name: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


@dataclass(frozen=True)
class NewToken(Token):
    token: str = field(default="", repr=False)


@dataclass(frozen=True)
class SshKey:
    id: str
    name: str
    algorithm: str
    fingerprint: str
    public_key: str
    created_at: datetime


@dataclass(frozen=True)
class SshInfo:
    enabled: bool
    port: int | None
    host_key: str | None
    host_key_fingerprint: str | None


@dataclass(frozen=True)
class ProxyLink:
    """A single-use link into a running workload's JupyterLab or port, valid until `expires_at` (a minute)."""

    url: str  # absolute: open it in a browser
    expires_at: datetime
    target: str  # lab | port:N
    started_jupyter: bool = False


@dataclass(frozen=True)
class Balance:
    org_id: str
    balance: Decimal  # two decimals, as shown
    exact: Decimal  # internal precision (1e-8)
    currency: str
    held_per_hour: Decimal  # hourly rate of everything the org runs now


@dataclass(frozen=True)
class Transaction:
    id: int
    key: str
    kind: str
    memo: str
    amount: Decimal  # net effect on the org's balance
    allocation_id: str | None
    created_at: datetime


@dataclass(frozen=True)
class StatementRow:
    """One transaction of an org's statement, with the balance after it."""

    id: int
    created_at: datetime
    kind: str  # topup, trial_credit, usage, plan_purchase, refund, credit, adjustment
    amount: Decimal  # net effect on the org's balance
    balance: Decimal  # after it
    workload: str | None  # what it paid for (usage, and what settling gave back)
    workload_name: str | None
    allocation: str | None
    memo: str
    key: str


@dataclass(frozen=True)
class Statement:
    """Transactions of an org, oldest first: one page, or all of them (`next_after_id` None)."""

    org_id: str
    currency: str
    opening_balance: Decimal  # before the first row
    closing_balance: Decimal  # after the last row
    rows: list[StatementRow]
    next_after_id: int | None


@dataclass(frozen=True)
class Plan:
    id: str
    org_id: str
    plan: str
    gpu_model: str
    gpus: int
    price: Decimal
    starts_at: datetime
    ends_at: datetime
    active: bool


@dataclass(frozen=True)
class Offer:
    gpu: str
    memory_gb: float
    total: int
    free: int
    largest_free_nvlink: int
    largest_free_leaf: int
    nodes: int
    currency: str
    on_demand_per_gpu_hour: Decimal | None  # None: not priced, so not for rent
    spot_per_gpu_hour: Decimal | None
    plans_per_gpu_hour: dict[str, Decimal]
    slices_per_hour: dict[str, Decimal] = field(default_factory=dict)  # one MIG slice, by profile
    cpu_per_core_hour: Decimal | None = None  # host CPU work asks for (CPU-only work pays only these), on demand
    memory_per_gib_hour: Decimal | None = None
    reserved: int = 0  # GPUs active plans reserve; those their work leaves idle are not in `free`
    usage_per_gpu_hour: Decimal | None = None  # billing: usage, a GPU-hour fully active; None: not offered by usage
    usage_floor_per_gpu_hour: Decimal | None = None  # billing: usage, a GPU-hour idle


@dataclass(frozen=True)
class Quote:
    cluster: str
    gpu: str
    gpus: int
    plan: dict[str, Any]
    step_time_s: float
    tokens_per_s: float
    mfu: float
    total_time_s: float
    rate_per_hour: Decimal
    cost: Decimal
    currency: str
    available_now: bool
    host_rate_per_hour: Decimal = Decimal(0)  # the host CPU and memory part of rate_per_hour
    floor_rate_per_hour: Decimal | None = None  # billing: usage: with the GPUs idle (rate_per_hour: fully active)
    floor_cost: Decimal | None = None


@dataclass(frozen=True)
class WorkloadQuote:
    """What a workload spec would pay on one GPU model (`gpu` None: CPU-only work)."""

    gpu: str | None
    gpus: int
    cpu_milli: int  # host CPU it gets, 1000 a core
    memory_mib: int
    billing_mode: str
    gpu_rate_per_hour: Decimal
    host_rate_per_hour: Decimal
    rate_per_hour: Decimal
    duration_s: float | None  # the spec's duration, else max_duration
    cost: Decimal | None  # of duration_s, as metering charges it
    currency: str
    floor_rate_per_hour: Decimal | None = None  # billing: usage: with its GPUs idle (rate_per_hour: fully active)
    floor_cost: Decimal | None = None


@dataclass(frozen=True)
class Cluster:
    id: str
    name: str
    source: str
    nodes: int
    gpus: int
    created_at: datetime


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_mode: bool
    healthy: bool = True
    health_reason: str = ""  # why a health rule marked it unhealthy (until its node is set ready)


@dataclass(frozen=True)
class Node:
    id: str
    name: str
    cluster_id: str
    kind: str
    state: str
    state_reason: str
    gpu_model: str | None
    gpu_count: int
    nvlink_domain: int
    leaf: int
    spine: int
    cpu_count: int
    memory_mib: int
    labels: dict[str, Any]
    gpus: tuple[Gpu, ...] = ()  # filled by `admin_node` only
    last_seen_at: datetime | None = None  # its GPUs' newest sample
    unhealthy_gpus: int = 0


@dataclass(frozen=True)
class LedgerCheck:
    ok: bool
    mismatches: dict[str, tuple[Decimal, ...]]  # account -> (stored balance, recomputed from entries)


def _unwrap_optional(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else Any
    return tp


@cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _amount(value: Any) -> Decimal:
    """An exact amount as the server sends it; one that is no number, or has more than 40 digits or an exponent
    past 40 either way, is refused: a hostile server's `1E+999999999` made `suanli balance` format a billion
    digits."""
    from suanli.client.client import ApiError

    text = str(value)
    try:
        d = Decimal(text) if len(text) <= 100 else None
    except ArithmeticError:
        d = None
    if d is None or not d.is_finite() or len(d.as_tuple().digits) > 40 or abs(d.adjusted()) > 40:
        raise ApiError(0, f"the server sent an amount that is not one: {text[:40]!r}")
    return d


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    tp = _unwrap_optional(tp)
    origin = get_origin(tp)
    if tp is Decimal:
        return _amount(value)
    if tp is datetime:
        return datetime.fromisoformat(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return load(tp, value)
    if origin is tuple:
        return tuple(_convert(get_args(tp)[0], v) for v in value)
    if origin is list:
        return [_convert(get_args(tp)[0], v) for v in value]
    if origin is dict:
        return {k: _convert(get_args(tp)[1], v) for k, v in value.items()}
    return value


def load(cls: type[T], doc: dict[str, Any]) -> T:
    """A result dataclass from a JSON object; fields the server adds later are ignored."""
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: _convert(hints[k], v) for k, v in doc.items() if k in names})


def jsonable(obj: Any) -> Any:
    """The JSON shape of a result (money back to strings, times to ISO 8601), for printing or storing."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Decimal):
        return f"{obj:f}"  # never exponent notation ("0E-8")
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    return obj
