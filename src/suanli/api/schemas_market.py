"""Wire schemas of the market (offers, quotes, the price book's edits) and of the inventory (clusters, nodes, GPUs):
the rest of `suanli.api.schemas`, kept apart so each file stays small. Same rules: unknown fields refused, every
number bounded, money as strings."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from suanli.api.schemas import Amount, In, MemorySize, Out
from suanli.billing.prices import DEFAULT_CPU_CORE_HOUR, DEFAULT_MEMORY_GIB_HOUR, DEFAULT_USAGE_FLOOR
from suanli.perf.training import TrainPrecision
from suanli.workloads.resources import parse_memory_mib


# ---- market ------------------------------------------------------------------------------------------------
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
    memory_per_gpu: MemorySize | None = Field(None, description="host memory a GPU, e.g. 64Gi")

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
