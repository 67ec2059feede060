"""The workload spec's resources section: GPUs (a count, a range for elastic work, or a MIG slice), GPU model, nodes,
placement, host CPU and memory. Its rules name the field they are about ("gpus: …"), relative to this section.

Pure: no I/O, no clock. `models.WorkloadSpec` holds one of these as `resources`.
"""

from __future__ import annotations

import math
import re
from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from suanli import catalog
from suanli.sched.types import mig_milli
from suanli.workloads.durations import brief

MAX_GPUS = 65536
MAX_NODES = 8192
STRICT_MODEL = ConfigDict(extra="forbid", frozen=True)  # every spec model: unknown fields refused, values immutable


class FieldError(ValueError):
    """A rule that spans fields, raised by a model validator, naming the field (relative to that model) it blames."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _canonical_gpu(name: object) -> str:
    if not isinstance(name, str):
        raise ValueError(f"GPU names must be strings, not {type(name).__name__}")
    try:
        return catalog.gpu(name).name
    except catalog.CatalogError:
        known = ", ".join(g.name for g in catalog.all_gpus())
        raise ValueError(f"unknown GPU {brief(name)}; known: {known}") from None


@cache
def _mig_profiles() -> frozenset[str]:
    return frozenset(p for g in catalog.all_gpus() for p in g.mig_profiles)


class GpuRange(BaseModel):
    """Elastic work: runs on any GPU count in [min, max]; the scheduler may grow or shrink it."""

    model_config = STRICT_MODEL

    min: StrictInt = Field(ge=1, le=MAX_GPUS)
    max: StrictInt = Field(ge=1, le=MAX_GPUS)

    @model_validator(mode="after")
    def _ordered(self) -> GpuRange:
        if self.min > self.max:
            raise FieldError("max", f"must be >= min ({self.min})")
        return self


MAX_CPUS = 4096
CPU_ONLY_CPUS = 1  # what CPU-only work gets unless it asks: 1 core and 2 GiB
CPU_ONLY_MEMORY = "2Gi"
_MEMORY = re.compile(r"^\s*(\d{1,10}(?:\.\d{1,6})?)\s*([KMGT])(i?)B?\s*$")  # 1Pi is 1073741824Mi
_MEMORY_MAX_MIB = 1 << 30  # 1 PiB


def parse_memory_mib(v: object) -> int:
    """A memory size with a unit (Ki, Mi, Gi, Ti binary; K, M, G, T decimal; a trailing B allowed) in MiB, rounded
    up."""
    m = _MEMORY.match(v) if isinstance(v, str) else None
    if m is None:
        raise ValueError("must be a size with a unit, like 64Gi, 512Mi or 1.5Ti")
    number, unit, binary = float(m.group(1)), "KMGT".index(m.group(2)) + 1, m.group(3) == "i"
    size = number * (1024**unit if binary else 1000**unit)
    mib = math.ceil(size / 2**20)
    if not 0 < mib <= _MEMORY_MAX_MIB:
        raise ValueError(f"must be more than 0 and at most 1Pi (got {v})")
    return mib


class Resources(BaseModel):
    model_config = STRICT_MODEL

    gpu: str | tuple[str, ...] = "any"
    gpus: int | GpuRange = 1
    slice: str | None = None
    nodes: StrictInt | None = Field(None, ge=1, le=MAX_NODES)
    topology: Literal["nvlink", "leaf", "any", "auto"] = "auto"  # auto: the scheduler may wait a bounded time
    # for a compact placement (where the operator runs `locality`); any: start on any free GPUs at once
    exclusive: StrictBool = False
    cpus: float | None = None  # host CPU cores; unset on GPU work: not counted (nor charged, nor capped)
    memory: str | None = None  # host memory, e.g. 64Gi or 512Mi; unset on GPU work: not counted

    @model_validator(mode="before")
    @classmethod
    def _cpu_only_defaults(cls, data: object) -> object:
        """CPU-only work gets 1 core and 2 GiB unless it asks otherwise, written into the spec: the stored spec,
        `describe`, the bill and the sandbox then all see what it runs with."""
        if isinstance(data, dict) and type(data.get("gpus")) is int and data["gpus"] == 0:
            data = dict(data)
            if data.get("cpus") is None:
                data["cpus"] = CPU_ONLY_CPUS
            if data.get("memory") is None:
                data["memory"] = CPU_ONLY_MEMORY
        return data

    @field_validator("cpus", mode="before")
    @classmethod
    def _cpus(cls, v: object) -> object:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= MAX_CPUS:
            raise ValueError(f"must be a number of CPU cores, more than 0 and at most {MAX_CPUS} (e.g. 16 or 0.5)")
        if round(v * 1000) < 1:
            raise ValueError("must be at least 0.001 cores")
        return float(v)

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, v: object) -> object:
        if v is None:
            return None
        mib = parse_memory_mib(v)
        return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"

    def cpu_milli(self) -> int:
        return 0 if self.cpus is None else round(self.cpus * 1000)

    def memory_mib(self) -> int:
        return 0 if self.memory is None else parse_memory_mib(self.memory)

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu(cls, v: object) -> str | tuple[str, ...]:
        if isinstance(v, str):
            return "any" if v.strip().lower() == "any" else _canonical_gpu(v)
        if isinstance(v, list | tuple):
            if not v:
                raise ValueError("a list of GPU models must not be empty (use 'any')")
            if any(isinstance(x, str) and x.strip().lower() == "any" for x in v):
                raise ValueError("'any' cannot be part of a list; use gpu: any alone")
            names = tuple(_canonical_gpu(x) for x in v)
            dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
            if dup is not None:
                raise ValueError(f"{dup} is listed twice (names and aliases of one model count as one)")
            return names
        raise ValueError("must be 'any', a GPU model name, or a list of names in order of preference")

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, v: object) -> int | GpuRange:
        if isinstance(v, dict | GpuRange):
            return GpuRange.model_validate(v)
        if isinstance(v, int) and not isinstance(v, bool):
            if not 0 <= v <= MAX_GPUS:
                raise ValueError(f"must be 0..{MAX_GPUS} (or {{min: N, max: M}} for elastic work)")
            return v
        raise ValueError(f"must be a whole number of GPUs (0..{MAX_GPUS}) or {{min: N, max: M}} for elastic work")

    @field_validator("slice")
    @classmethod
    def _slice(cls, v: str | None) -> str | None:
        if v is None:
            return None
        profile = v.strip().lower()
        if len(profile) > 32:
            raise ValueError("not a MIG profile (expected e.g. 1g.10gb, 3g.40gb, 7g.80gb)")
        mig_milli(profile)  # ValueError with the expected shape
        known = _mig_profiles()
        if profile not in known:
            raise ValueError(f"no GPU in the catalog offers MIG profile {profile!r}; known: {', '.join(sorted(known))}")
        return profile

    @model_validator(mode="after")
    def _consistent(self) -> Resources:
        if self.slice is not None:
            if isinstance(self.gpus, GpuRange):
                raise FieldError("gpus", "a GPU slice runs on one GPU; gpus must be 1 (or omitted), not a range")
            if self.gpus != 1:
                raise FieldError("gpus", f"must be 1 (or omitted) with a slice (got {self.gpus})")
            if self.exclusive:
                raise FieldError("exclusive", "a GPU slice cannot hold whole nodes")
            for name in self.gpu_names():
                profiles = catalog.gpu(name).mig_profiles
                if not profiles:
                    raise FieldError("gpu", f"{name} does not support MIG slices (slice: {self.slice})")
                if self.slice not in profiles:
                    raise FieldError("slice", f"{name} offers {', '.join(profiles)}, not {self.slice}")
        if self.nodes is not None and self.nodes > 1 and self.gpus == 0:
            raise FieldError("nodes", f"CPU-only work runs on one node (got nodes: {self.nodes}); ask for GPUs to span "
                             "several")  # fmt: skip
        if self.nodes is not None:
            counts = (self.gpus.min, self.gpus.max) if isinstance(self.gpus, GpuRange) else (self.gpus,)
            for what, n in zip(("min", "max") if len(counts) == 2 else ("gpus",), counts, strict=True):
                if n % self.nodes:
                    raise FieldError("nodes", f"{what} ({n}) must be divisible by nodes ({self.nodes})")
        return self

    def gpu_names(self) -> tuple[str, ...]:
        """The named models in order of preference; () for any."""
        return () if self.gpu == "any" else (self.gpu,) if isinstance(self.gpu, str) else self.gpu
