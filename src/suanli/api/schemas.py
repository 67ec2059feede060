"""Wire schemas: what requests may carry (unknown fields refused, every number bounded) and what comes back.

Money travels as strings ("10.00" shown, exact amounts with 8 decimals), never as floats."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from suanli.billing.money import INTERNAL
from suanli.billing.prices import DEFAULT_CPU_CORE_HOUR, DEFAULT_MEMORY_GIB_HOUR, DEFAULT_USAGE_FLOOR
from suanli.perf.training import TrainPrecision
from suanli.workloads.models import parse_memory_mib


def _not_float(value: object) -> object:
    """JSON numbers with a fraction are floats before pydantic sees them: 0.1 is not exactly a tenth."""
    if isinstance(value, float):
        raise ValueError('money must be a string such as "1.50" (or a whole number), not a JSON number with a fraction')
    return value


Amount = Annotated[Decimal, BeforeValidator(_not_float)]
NUL_MESSAGE = "NUL characters (\\u0000) are not allowed"


MAX_DEPTH = 32


def check_strings(value: object) -> None:
    """Refuse a NUL in any string (PostgreSQL text cannot hold one) and documents nested deeper than MAX_DEPTH
    (whatever walks them later must not run out of stack); iterative, so a hostile document cannot either. The
    message names where in the document the NUL is (`billing`, `env.X`, `args[2]`)."""
    stack: list[tuple[object, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, at = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise ValueError(f"{NUL_MESSAGE} (at {at})" if at else NUL_MESSAGE)
        elif isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
            if isinstance(item, dict):
                for k, v in item.items():
                    name = f"{at}.{_key(k)}" if at else _key(k)
                    stack.extend(((k, depth + 1, f"{name} (its name)"), (v, depth + 1, name)))
            else:
                stack.extend((child, depth + 1, f"{at}[{i}]") for i, child in enumerate(item))


def _key(k: object) -> str:
    return repr(k)[:64] if not isinstance(k, str) or "\x00" in k or len(k) > 64 else k


def _as_utc(t: datetime) -> datetime:
    """Times without a zone are UTC; a time whose UTC equivalent falls outside years 1-9999 is refused."""
    if t.tzinfo is None:
        return t.replace(tzinfo=UTC)
    try:
        return t.astimezone(UTC)
    except OverflowError as e:
        raise ValueError("out of range once converted to UTC") from e


UtcTime = Annotated[datetime, AfterValidator(_as_utc)]


class In(BaseModel):
    model_config = ConfigDict(extra="forbid", str_max_length=4096)

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: object) -> object:
        if type(value) not in (int, float, bool) and value is not None:  # numbers hold no strings (hot: samples)
            check_strings(value)
        return value


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


# ---- errors -------------------------------------------------------------------------------------------------
class ErrorOut(Out):
    detail: str = Field(description="one line that names the field or object at fault")


class ErrorItem(Out):
    loc: list[str]
    msg: str
    type: str


class ValidationErrorOut(ErrorOut):
    errors: list[ErrorItem] = Field(default_factory=list, description="each field at fault (request validation)")


# ---- accounts -----------------------------------------------------------------------------------------------
class Credentials(In):
    email: str = Field(min_length=3, max_length=254)
    password: str = Field(min_length=1, max_length=1024)


class SignupIn(Credentials):
    invite: str | None = Field(
        None, min_length=1, max_length=128, description="an invitation's code or an operator's invite code"
    )


class UserOut(Out):
    id: str
    email: str
    is_admin: bool
    personal_org_id: str
    created_at: datetime


class OrgOut(Out):
    id: str
    name: str
    personal: bool
    quota_gpus: int | None
    quota_cpus: int | None = Field(None, description="most host CPU cores held at once; null: no limit")
    quota_memory_gib: int | None = Field(None, description="most host memory (GiB) held at once; null: no limit")
    role: str | None = None


class SessionOut(Out):
    user: UserOut
    token: str = Field(description="bearer token; shown once")
    token_id: str
    expires_at: datetime | None


class SignupOut(SessionOut):
    org: OrgOut
    balance: str
    currency: str
    trial_pending: bool = Field(
        False, description="the trial credit waits until the e-mail is verified (a link was mailed)"
    )


class MeOut(Out):
    user: UserOut
    orgs: list[OrgOut]
    email_verified: bool = Field(False, description="the user redeemed a verification link mailed to them")
    trial_pending: bool = Field(False, description="verifying the e-mail would release the trial credit")


class VerifyIn(In):
    token: str = Field(min_length=1, max_length=128, description="the token of the link in the verification e-mail")


class VerifyOut(Out):
    user_id: str
    email: str
    email_verified: bool
    credited: str = Field(description="trial credit granted now (0 where it had been granted already)")
    balance: str
    currency: str


class ResendOut(Out):
    sent_to: str


class TokenIn(In):
    name: str = Field(min_length=1, max_length=128)
    expires_in_days: int | None = Field(None, ge=1, le=3650)


class TokenOut(Out):
    id: str
    name: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class NewTokenOut(TokenOut):
    token: str = Field(description="bearer token; shown once, stored only as a hash")


class SshKeyIn(In):
    model_config = ConfigDict(extra="forbid", str_max_length=8192)
    public_key: str = Field(min_length=1, max_length=8192, description="one OpenSSH public key (the .pub file)")
    name: str | None = Field(None, min_length=1, max_length=128, description="default: the key's comment")


class SshKeyOut(Out):
    id: str
    name: str
    algorithm: str
    fingerprint: str = Field(description="SHA256, as `ssh-keygen -l` prints it")
    public_key: str
    created_at: datetime


class SshInfoOut(Out):
    enabled: bool
    port: int | None = Field(description="the gateway's port on the server's host; None when it is off")
    host_key: str | None = Field(description="its public host key (OpenSSH form), for known_hosts")
    host_key_fingerprint: str | None


class OrgIn(In):
    name: str = Field(min_length=1, max_length=128)


Role = Literal["owner", "admin", "member", "viewer"]
SpendLimit = Annotated[Decimal, BeforeValidator(_not_float), Field(ge=0, le=Decimal("1000000000"), decimal_places=8)]


class InvitationIn(In):
    email: str = Field(min_length=3, max_length=254)
    role: Role = "member"
    monthly_spend_limit: SpendLimit | None = Field(None, description="most they may spend a month; null: no limit")


class MemberPatch(In):
    """Only the fields given change; `monthly_spend_limit: null` removes the limit."""

    role: Role | None = None
    monthly_spend_limit: SpendLimit | None = None

    @field_validator("role")
    @classmethod
    def _a_role(cls, v: str | None) -> str | None:
        if v is None:  # given as null: there is no "no role"
            raise ValueError("one of owner, admin, member, viewer")
        return v

    @model_validator(mode="after")
    def _some(self) -> MemberPatch:
        if not self.model_fields_set:
            raise ValueError("give role and/or monthly_spend_limit")
        return self


class MemberOut(Out):
    user_id: str
    email: str
    role: str
    monthly_spend_limit: str | None = Field(None, description="most they may spend a month; null: no limit")
    month_to_date: str = Field("0.00000000", description="their charges to the org this calendar month (UTC)")


class InvitationOut(Out):
    id: str
    org_id: str
    org_name: str
    email: str
    role: str
    monthly_spend_limit: str | None
    state: str = Field(description="pending, accepted, declined or cancelled")
    invited_by: str = Field(description="the inviter's email")
    created_at: datetime
    expires_at: datetime


class NewInvitationOut(InvitationOut):
    code: str = Field(description="shown once: where signup is invite-only, the invitee signs up with it")


# ---- money --------------------------------------------------------------------------------------------------
class BalanceOut(Out):
    org_id: str
    balance: str = Field(description="two decimals, as shown")
    exact: str = Field(description="internal precision (1e-8)")
    currency: str
    held_per_hour: str = Field(description="hourly rate of everything the org runs now")


class EntryOut(Out):
    account: str
    amount: str


class TransactionOut(Out):
    id: int
    key: str
    kind: str
    memo: str
    amount: str = Field(description="net effect on the org's balance")
    allocation_id: str | None
    created_at: datetime


class StatementRowOut(Out):
    id: int = Field(description="the ledger transaction's id, in posting order")
    created_at: datetime
    kind: str = Field(description="topup, trial_credit, usage, plan_purchase, refund, credit, adjustment")
    amount: str = Field(description="net effect on the org's balance, exact")
    balance: str = Field(description="the org's balance after this transaction, exact")
    workload: str | None = Field(description="the workload it paid for (usage and what settling gave back)")
    workload_name: str | None
    allocation: str | None
    memo: str
    key: str = Field(description="the transaction's idempotency key")


class StatementOut(Out):
    org_id: str
    currency: str
    opening_balance: str = Field(description="before the first row")
    closing_balance: str = Field(description="after the last row")
    rows: list[StatementRowOut]
    next_after_id: int | None = Field(description="pass as after_id for the next page; null: this was the last")


class MoveIn(In):
    amount: Amount = Field(gt=0, le=Decimal("1000000000"), decimal_places=8)
    kind: Literal["topup", "credit", "refund"] = "topup"
    memo: str = Field("", max_length=500)
    key: str | None = Field(None, min_length=1, max_length=150, description="idempotency key; a retry posts nothing")


class QuotaIn(In):
    """Only the quotas named change; null removes that limit."""

    gpus: int | None = Field(None, description="most GPUs held at once", ge=0, le=1_000_000)
    cpus: int | None = Field(None, description="most host CPU cores held at once", ge=0, le=100_000_000)
    memory_gib: int | None = Field(None, description="most host memory held at once, GiB", ge=0, le=1_000_000_000)

    @model_validator(mode="after")
    def _some(self) -> QuotaIn:
        if not self.model_fields_set:
            raise ValueError("give at least one of gpus, cpus and memory_gib")
        return self

    def limits(self) -> dict[str, int | None]:
        return {k: getattr(self, k) for k in ("gpus", "cpus", "memory_gib") if k in self.model_fields_set}


# ---- market -------------------------------------------------------------------------------------------------
class OfferOut(Out):
    gpu: str
    memory_gb: float
    total: int
    free: int = Field(description="on ready nodes, held by no work and not reserved by a plan")
    largest_free_nvlink: int
    largest_free_leaf: int
    nodes: int
    currency: str
    reserved: int = Field(0, description="GPUs active plans reserve (in use by their work or not)")
    on_demand_per_gpu_hour: str | None
    spot_per_gpu_hour: str | None
    plans_per_gpu_hour: dict[str, str]
    slices_per_hour: dict[str, str] = Field(description="one MIG slice, by profile")
    usage_per_gpu_hour: str | None = Field(
        None, description="billing: usage: a GPU-hour fully active (null: not offered by usage)"
    )
    usage_floor_per_gpu_hour: str | None = Field(
        None, description="billing: usage: a GPU-hour idle, the least a held GPU costs"
    )
    cpu_per_core_hour: str = Field(description="host CPU asked for, on demand (spot: times the spot factor)")
    memory_per_gib_hour: str = Field(description="host memory asked for, on demand (spot: times the spot factor)")


class QuoteIn(In):
    model: str = Field(min_length=1, max_length=64, description="model preset, e.g. llama3.1-8b")
    precision: TrainPrecision = "bf16"
    seq_len: int = Field(4096, ge=128, le=1_048_576)
    global_batch: int = Field(256, ge=1, le=65_536)
    tokens: float | None = Field(None, gt=0, le=1e15, description="tokens to train on (or give steps)")
    steps: int | None = Field(None, ge=1, le=1_000_000_000)
    gpu: str = Field("any", min_length=1, max_length=64, description="GPU model, or 'any'")
    gpus: int | None = Field(None, ge=1, le=100_000, description="GPU count; default: try a range")
    billing_mode: Literal["on-demand", "spot", "usage"] = "on-demand"
    rank: Literal["cheapest", "fastest"] = "cheapest"
    limit: int = Field(10, ge=1, le=100)
    cpus_per_gpu: Decimal | None = Field(None, gt=0, le=4096, decimal_places=3, description="host CPU cores a GPU")
    memory_per_gpu: str | None = Field(None, max_length=32, description="host memory a GPU, e.g. 64Gi")

    @field_validator("memory_per_gpu")
    @classmethod
    def _memory(cls, v: str | None) -> str | None:
        if v is not None:
            parse_memory_mib(v)  # ValueError naming the expected shape
        return v

    def host_per_gpu(self) -> tuple[int, int]:
        """(milli-cores, MiB) a GPU."""
        cpu = int(self.cpus_per_gpu * 1000) if self.cpus_per_gpu is not None else 0
        return cpu, parse_memory_mib(self.memory_per_gpu) if self.memory_per_gpu is not None else 0

    @model_validator(mode="after")
    def _one_size(self) -> QuoteIn:
        if (self.tokens is None) == (self.steps is None):
            raise ValueError("give exactly one of tokens and steps")
        return self

    @property
    def n_tokens(self) -> float:
        return self.tokens if self.tokens is not None else float(self.steps or 0) * self.global_batch * self.seq_len


class QuoteOut(Out):
    cluster: str
    gpu: str
    gpus: int
    plan: dict[str, int | str | bool | None]
    step_time_s: float
    tokens_per_s: float
    mfu: float
    total_time_s: float
    rate_per_hour: str
    cost: str
    currency: str
    available_now: bool
    host_rate_per_hour: str = Field("0.00000000", description="the host CPU and memory part of rate_per_hour")
    floor_rate_per_hour: str | None = Field(
        None, description="billing: usage: the rate with the GPUs idle (rate_per_hour: fully active); else null"
    )
    floor_cost: str | None = Field(None, description="billing: usage: the cost with the GPUs idle throughout")


class WorkloadQuoteIn(In):
    """A workload spec to price, as `POST /workloads` takes it (without a workdir)."""

    model_config = ConfigDict(extra="forbid", str_max_length=256 * 1024)
    spec: dict[str, object] | None = Field(None, description="the workload spec as JSON")
    spec_yaml: str | None = Field(None, max_length=256 * 1024, description="…or as YAML text")
    org: str | None = Field(None, max_length=64, description="the org that would pay (its plans); default: yours")

    @model_validator(mode="after")
    def _one_spec(self) -> WorkloadQuoteIn:
        if (self.spec is None) == (self.spec_yaml is None):
            raise ValueError("give exactly one of spec (JSON) or spec_yaml (YAML text)")
        return self


class WorkloadQuoteOut(Out):
    gpu: str | None = Field(description="GPU model; null for CPU-only work")
    gpus: int
    cpu_milli: int = Field(description="host CPU it gets, 1000 a core")
    memory_mib: int = Field(description="host memory it gets")
    billing_mode: str
    gpu_rate_per_hour: str
    host_rate_per_hour: str
    rate_per_hour: str
    duration_s: float | None = Field(description="the spec's duration, else max_duration; null: neither")
    cost: str | None = Field(description="rate x duration_s as metering bills it (to the nearest second)")
    currency: str
    floor_rate_per_hour: str | None = Field(
        None, description="billing: usage: the rate with its GPUs idle (rate_per_hour: fully active); else null"
    )
    floor_cost: str | None = Field(None, description="billing: usage: the cost with its GPUs idle throughout")


GpuName = Annotated[str, Field(min_length=1, max_length=64)]
HourlyPrice = Annotated[Amount, Field(ge=0, le=Decimal("100000"), decimal_places=8)]


class PlanPriceIn(In):
    hours: int = Field(gt=0, le=24 * 366)
    discount: Amount = Field(ge=0, lt=1, decimal_places=8)


class PriceBookIn(In):
    """The whole price book (`GET /prices` without `version`, which is accepted and ignored)."""

    version: int | None = Field(None, description="ignored: the server numbers versions")
    currency: str = Field("CNY", pattern=r"^[A-Z]{3}$")
    gpu_hour: dict[GpuName, HourlyPrice]
    spot_factor: Amount = Field(Decimal("0.4"), gt=0, le=1, decimal_places=8)
    slice_premium: Amount = Field(Decimal("1.0"), ge=1, le=10, decimal_places=8)
    storage_gb_month: Amount = Field(Decimal("0"), ge=0, le=Decimal("100000"), decimal_places=8)
    cpu_core_hour: HourlyPrice = Field(DEFAULT_CPU_CORE_HOUR, description="host CPU, per core-hour")
    memory_gib_hour: HourlyPrice = Field(DEFAULT_MEMORY_GIB_HOUR, description="host memory, per GiB-hour")
    usage_gpu_hour: dict[GpuName, HourlyPrice] = Field(
        default_factory=dict, description="billing: usage: per GPU-hour fully active (each model priced on demand too)"
    )
    usage_floor: Amount = Field(
        DEFAULT_USAGE_FLOOR, ge=0, le=1, decimal_places=8, description="the share of it an idle GPU-hour costs"
    )
    plans: dict[Annotated[str, Field(min_length=1, max_length=32)], PlanPriceIn] = Field(default_factory=dict)


class PriceGpuIn(In):
    on_demand: Amount | None = Field(None, ge=0, le=Decimal("100000"), decimal_places=8)
    remove: bool = False


class PriceUsageIn(In):
    """Usage prices to change (`billing: usage`): per GPU-hour fully active by GPU model (null: no longer offered by
    usage), and/or the floor, the share of that price an idle GPU-hour costs."""

    gpu_hour: dict[GpuName, HourlyPrice | None] = Field(default_factory=dict, max_length=256)
    floor: Amount | None = Field(None, ge=0, le=1, decimal_places=8)

    @model_validator(mode="after")
    def _some(self) -> PriceUsageIn:
        if not self.gpu_hour and self.floor is None:
            raise ValueError("give gpu_hour, floor or both")
        return self


class PriceHostIn(In):
    """Host prices to change (at least one); the other stays as it is."""

    cpu_core_hour: HourlyPrice | None = None
    memory_gib_hour: HourlyPrice | None = None

    @model_validator(mode="after")
    def _some(self) -> PriceHostIn:
        if self.cpu_core_hour is None and self.memory_gib_hour is None:
            raise ValueError("give cpu_core_hour, memory_gib_hour or both")
        return self


# ---- inventory ----------------------------------------------------------------------------------------------
class ClusterIn(In):
    preset: str | None = Field(None, max_length=128, description="topology preset or NxG[:MODEL] (virtual nodes)")
    spec: dict[str, object] | None = Field(None, description="a cluster spec document (virtual nodes)")
    local: bool = Field(False, description="this server's host, discovered through NVML")
    name: str | None = Field(None, min_length=1, max_length=128)

    @model_validator(mode="after")
    def _one_source(self) -> ClusterIn:
        if sum([self.preset is not None, self.spec is not None, self.local]) != 1:
            raise ValueError("give exactly one of preset, spec and local")
        return self


class ClusterOut(Out):
    id: str
    name: str
    source: str
    nodes: int
    gpus: int
    created_at: datetime


class GpuOut(Out):
    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_mode: bool
    healthy: bool
    health_reason: str
    health_since: datetime | None


class NodeOut(Out):
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
    labels: dict[str, object]
    last_seen_at: datetime | None = Field(None, description="when its GPUs last reported a sample")
    unhealthy_gpus: int = Field(0, description="GPUs a health rule marked unhealthy (until the node is set ready)")


class NodeDetailOut(NodeOut):
    gpus: list[GpuOut]


class NodeStateIn(In):
    state: Literal["ready", "draining", "down"]
    reason: str = Field("", max_length=1000)


class AdminUserIn(Credentials):
    admin: bool = False
    trial_credit: bool = Field(False, description="grant the sign-up trial credit")


class AdminUserPatch(In):
    admin: bool


class CheckOut(Out):
    ok: bool
    mismatches: dict[str, list[str]]


def money(value: Decimal) -> str:
    """Fixed-point at internal precision: "0.00000000", never "0E-8"."""
    return format(value.quantize(INTERNAL), "f")
