"""The operator's price book: hourly rates by GPU model and billing mode (on demand, spot, usage), slices, host CPU and
memory, storage and plans."""

from __future__ import annotations

from decimal import Decimal
from functools import cache
from importlib import resources
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, ValidationInfo, field_validator

from suanli.billing.money import ZERO, exact

BillingMode = Literal["on-demand", "spot", "usage"]
# Amounts leave as fixed-point strings ("0.00000000", never "0E-8").
Amount = Annotated[Decimal, PlainSerializer(lambda d: format(d, "f"), return_type=str, when_used="json")]
FULL_MILLI = 1000
MIB_PER_GIB = 1024
MAX_PRICE = Decimal(100_000)
# Host prices of a book stored before they existed (and the shipped book's): see default_prices.yaml.
DEFAULT_CPU_CORE_HOUR = exact("0.10")
DEFAULT_MEMORY_GIB_HOUR = exact("0.025")
DEFAULT_USAGE_FLOOR = exact("0.20")  # of the usage price: what an idle GPU-hour costs in `billing: usage`


class PlanPrice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    hours: int = Field(gt=0, le=24 * 366)
    discount: Amount = Field(ge=0, lt=1)


class PriceBook(BaseModel):
    """Prices in `currency`; every amount exact (Decimal)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    currency: str = Field("CNY", min_length=3, max_length=3, pattern=r"^[A-Z]{3}$")
    gpu_hour: dict[str, Amount]
    spot_factor: Amount = Field(Decimal("0.4"), gt=0, le=1)
    slice_premium: Amount = Field(Decimal("1.0"), ge=1, le=10)
    storage_gb_month: Amount = Field(Decimal("0"), ge=0, le=MAX_PRICE)
    cpu_core_hour: Amount = Field(DEFAULT_CPU_CORE_HOUR, ge=0, le=MAX_PRICE)
    memory_gib_hour: Amount = Field(DEFAULT_MEMORY_GIB_HOUR, ge=0, le=MAX_PRICE)
    plans: dict[str, PlanPrice] = Field(default_factory=dict)
    # `billing: usage`: per GPU-hour at full activity, by GPU model (offered while also priced on demand), and the
    # floor: the share of that price an idle GPU-hour costs. A GPU-second at activity a (0..1) costs usage x (floor +
    # (1 - floor) x a) / 3600; see billing/usage.py. A book stored before usage prices existed offers no usage billing.
    usage_gpu_hour: dict[str, Amount] = Field(default_factory=dict)
    usage_floor: Amount = Field(DEFAULT_USAGE_FLOOR, ge=0, le=1)

    @field_validator("cpu_core_hour", "memory_gib_hour", "usage_floor")
    @classmethod
    def _to_internal(cls, v: Decimal) -> Decimal:
        return exact(v)

    @field_validator("gpu_hour", "usage_gpu_hour")
    @classmethod
    def _non_negative(cls, v: dict[str, Decimal], info: ValidationInfo) -> dict[str, Decimal]:
        for model, price in v.items():
            if price < ZERO:
                raise ValueError(f"{info.field_name}.{model}: price cannot be negative")
            if price > MAX_PRICE:
                raise ValueError(
                    f"{info.field_name}.{model}: {price} per GPU-hour is beyond any real price (max {MAX_PRICE})"
                )
        return {k: exact(p) for k, p in v.items()}

    def offered(self, gpu_model: str, mode: BillingMode = "on-demand") -> bool:
        """Whether `gpu_model` can be rented in `mode` (usage: beside on-demand, never alone)."""
        return gpu_model in self.gpu_hour and (mode != "usage" or gpu_model in self.usage_gpu_hour)

    def gpu_rate(self, gpu_model: str, mode: BillingMode = "on-demand") -> Decimal:
        """Per GPU-hour (usage: at full activity)."""
        if mode == "usage":
            if gpu_model not in self.usage_gpu_hour:
                priced = ", ".join(self.usage_gpu_hour) or "none"
                raise KeyError(f"no usage price for GPU model {gpu_model!r}; priced for usage: {priced}")
            return self.usage_gpu_hour[gpu_model]
        if gpu_model not in self.gpu_hour:
            raise KeyError(f"no price for GPU model {gpu_model!r}; priced: {', '.join(self.gpu_hour)}")
        base = self.gpu_hour[gpu_model]
        return exact(base * self.spot_factor) if mode == "spot" else base

    def rate(self, gpu_model: str, gpus: int = 1, mode: BillingMode = "on-demand", milli: int = FULL_MILLI) -> Decimal:
        """Per hour for an allocation: `gpus` whole GPUs, or one slice of `milli`/1000 of a GPU (usage: at full
        activity; a slice has no activity reading of its own, so it is never billed by usage)."""
        if gpus < 0 or not 0 < milli <= FULL_MILLI:
            raise ValueError("gpus must be >= 0 and milli in 1..1000")
        if mode == "usage" and milli < FULL_MILLI:
            raise ValueError("usage billing is for whole GPUs: a slice has no activity reading of its own")
        per_gpu = self.gpu_rate(gpu_model, mode)
        if milli < FULL_MILLI:
            return exact(per_gpu * milli / FULL_MILLI * self.slice_premium)
        return exact(per_gpu * gpus)

    def usage_floor_rate(self, gpu_model: str, gpus: int = 1) -> Decimal:
        """Per hour for `gpus` idle GPUs billed by usage: the floor share of their full-activity rate."""
        return exact(self.rate(gpu_model, gpus, "usage") * self.usage_floor)

    def host_rate(self, cpu_milli: int, memory_mib: int, mode: BillingMode = "on-demand") -> Decimal:
        """Per hour for host CPU (milli-cores) and memory (MiB): cores x cpu_core_hour + GiB x memory_gib_hour,
        exact (a MiB is 1/1024 GiB, a finite decimal), times the spot factor for spot work."""
        if cpu_milli < 0 or memory_mib < 0:
            raise ValueError("cpu_milli and memory_mib must be >= 0")
        rate = Decimal(cpu_milli) / FULL_MILLI * self.cpu_core_hour
        rate += Decimal(memory_mib) / MIB_PER_GIB * self.memory_gib_hour
        return exact(rate * self.spot_factor if mode == "spot" else rate)

    def plan_price(self, plan: str, gpu_model: str, gpus: int) -> Decimal:
        """Upfront price of holding `gpus` GPUs for one period of `plan`."""
        if plan not in self.plans:
            raise KeyError(f"no plan {plan!r}; plans: {', '.join(self.plans)}")
        p = self.plans[plan]
        return exact(self.gpu_rate(gpu_model) * gpus * p.hours * (1 - p.discount))

    def storage_cost(self, nbytes: int, hours: int = 1) -> Decimal:
        """What `nbytes` allocated for `hours` costs: GB of 10^9 bytes, a month of 720 hours, exact to 1e-8."""
        return exact(Decimal(nbytes) * self.storage_gb_month * hours / (Decimal(10**9) * 720))

    def storage_rate_per_hour(self, gb: float | Decimal) -> Decimal:
        return exact(self.storage_gb_month * Decimal(str(gb)) / 720)


@cache
def default_price_book() -> PriceBook:
    text = resources.files("suanli.billing").joinpath("data", "default_prices.yaml").read_text(encoding="utf-8")
    return PriceBook.model_validate(yaml.safe_load(text))
