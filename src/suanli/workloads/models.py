"""The workload spec's models: every field rule, normalisation, and the mapping to a scheduler request.

Every rule lives here so the API, the CLI and the simulator refuse the same things with the same words; each
error names the field it is about ("resources.gpus: …"). Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from decimal import Decimal
from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from suanli.perf import MODEL_PRESETS
from suanli.perf.training import TrainPrecision
from suanli.sched.state import host_share
from suanli.sched.types import FULL, ModelHint, PriorityClass, Request, mig_milli
from suanli.workloads.durations import brief, format_duration, parse_duration
from suanli.workloads.resources import STRICT_MODEL, FieldError, GpuRange, Resources
from suanli.workloads.volumes import VolumeMount, VolumeRuleError, check_mounts

MAX_COMMAND = 10_000
MAX_ENV = 256
MAX_ENV_VALUE = 32 * 1024  # bytes of UTF-8
MAX_PORTS = 8
PORT_RANGE = (1024, 65535)  # a sandbox holds no capability: it cannot listen below 1024
RESERVED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK"})  # fmt: skip
RESERVED_ENV_PREFIX = "SUANLI_"
_NAME = re.compile(r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?")
_IMAGE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
HUB_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")  # a hub entry's name (`suanli hub models`); '..' refused too
MAX_HUB = 16  # models, and datasets, one workload names
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
_BILLING = re.compile(r"on-demand|spot|usage|plan:[A-Za-z0-9_-]{1,32}")

Kind = Literal["job", "instance"]
Priority = Literal["low", "normal", "high"]
BillingMode = Literal["on-demand", "spot", "usage", "plan"]
RetryCause = Literal["node-failure", "preemption", "failure"]
PRIORITY_RANK: dict[str, int] = {"low": 0, "normal": 1, "high": 2}
CLASS_OF_BILLING: dict[str, PriorityClass] = {"plan": "reserved", "on-demand": "on-demand", "usage": "on-demand",
                                              "spot": "spot"}  # fmt: skip


def _seconds(value: object) -> float:
    return parse_duration(value)


Duration = Annotated[float, BeforeValidator(_seconds)]


class Retry(BaseModel):
    model_config = STRICT_MODEL

    on: tuple[RetryCause, ...] = ("node-failure", "preemption")
    limit: StrictInt = Field(0, ge=0, le=20)

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: object) -> object:
        """YAML 1.1 loaders (plain yaml.safe_load) read the key `on` as True, and JSON then writes it "true"."""
        if isinstance(data, dict) and "on" not in data:
            return {("on" if k is True or k == "true" else k): v for k, v in data.items()}
        return data

    @field_validator("on", mode="before")
    @classmethod
    def _unique(cls, v: object) -> object:
        if isinstance(v, str):
            v = [v]
        if isinstance(v, list | tuple) and all(isinstance(x, str) for x in v):
            return tuple(dict.fromkeys(v))
        return v


class ModelSpec(BaseModel):
    model_config = STRICT_MODEL

    preset: str
    precision: TrainPrecision = "bf16"
    # At most 1e15 tokens (~70× the largest public pre-training runs): a bound every predicted runtime can hold.
    tokens: Annotated[float, Field(gt=0, le=1e15, allow_inf_nan=False, strict=True)] | None = None

    @field_validator("preset")
    @classmethod
    def _preset(cls, v: str) -> str:
        key = v.strip().lower()
        if key not in MODEL_PRESETS:
            raise ValueError(f"unknown model preset {brief(v)}; presets: {', '.join(MODEL_PRESETS)}")
        return key


class WorkloadSpec(BaseModel):
    """A validated, normalised workload spec; `model_dump(mode="json")` is the normalised form and parses back."""

    model_config = STRICT_MODEL

    name: str
    kind: Kind = "job"
    command: str | None = None
    workdir: str = "."
    env: dict[str, str] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    billing: str = "on-demand"
    priority: Priority = "normal"
    max_duration: Duration | None = None
    duration: Duration | None = None
    max_price_per_hour: Decimal | None = Field(None, gt=0, le=10**9, decimal_places=8)
    retry: Retry = Field(default_factory=Retry)
    model: ModelSpec | None = None
    # host: the node's network (NCCL over nodes needs it); private: a namespace of its own with a way out (pasta);
    # none: loopback only (private and none run on one node); auto: the operator's default (`network` setting)
    # where the work can have it (`control.workloads.sandboxes.resolve_network`), host otherwise.
    network: Literal["auto", "host", "private", "none"] = "auto"
    image: str | None = None  # a named environment the operator published (`suanli environments`)
    jupyter: StrictBool = False  # an instance starts JupyterLab, reached through the server's proxy
    ports: tuple[StrictInt, ...] = ()  # loopback ports served through the proxy at /i/<id>/port/<N>/
    models: tuple[str, ...] = ()  # hub models bound read-only into the sandbox (`suanli hub models`)
    datasets: tuple[str, ...] = ()  # hub datasets, likewise (`suanli hub datasets`)

    @model_validator(mode="before")
    @classmethod
    def _one_node_network(cls, data: object) -> object:
        """A private network or none is one node's: ranks on two nodes could never meet. GPU work says so in its
        spec (`resources.nodes: 1`), so the scheduler places it on one node and `describe` shows it."""
        if not isinstance(data, dict) or data.get("network") not in ("private", "none"):
            return data
        res = data.get("resources", {})
        if not isinstance(res, dict):
            return data  # refused as it is, by its own field
        nodes = res.get("nodes")
        if type(nodes) is int and nodes > 1:
            raise FieldError("network", f"{data['network']} runs on one node (got resources.nodes: {nodes}); work "
                             "over several nodes needs network: host")  # fmt: skip
        if nodes is None and res.get("gpus", 1) != 0:
            return {**data, "resources": {**res, "nodes": 1}}
        return data

    @field_validator("models", "datasets", mode="before")
    @classmethod
    def _hub_names(cls, v: object) -> object:
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list | tuple):
            raise ValueError("must be a list of hub names, e.g. [qwen2.5-0.5b-instruct]")
        if len(v) > MAX_HUB:
            raise ValueError(f"at most {MAX_HUB} names (got {len(v)})")
        for name in v:
            if not isinstance(name, str) or not HUB_NAME.fullmatch(name) or ".." in name:
                raise ValueError(f"each must be a hub name: 1-63 of a-z, 0-9, '.', '_', '-' (got {brief(name)})")
        if len(set(v)) != len(v):
            raise ValueError("names must not repeat")
        return tuple(v)

    volumes: tuple[VolumeMount, ...] = ()  # the org's volumes (or `name@N` versions) bound into the sandbox

    @field_validator("volumes", mode="before")
    @classmethod
    def _volumes_list(cls, v: object) -> object:
        if not isinstance(v, list | tuple):
            raise ValueError("must be a list of {name, path, read_only}, e.g. [{name: data, path: /data}]")
        return v

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, v: tuple[VolumeMount, ...]) -> tuple[VolumeMount, ...]:
        try:
            check_mounts(v)
        except VolumeRuleError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("ports", mode="before")
    @classmethod
    def _ports(cls, v: object) -> object:
        if not isinstance(v, list | tuple):
            raise ValueError("must be a list of port numbers, e.g. [6006]")
        if len(v) > MAX_PORTS:
            raise ValueError(f"at most {MAX_PORTS} ports (got {len(v)})")
        low, high = PORT_RANGE
        for p in v:
            if not isinstance(p, int) or isinstance(p, bool) or not low <= p <= high:
                raise ValueError(f"each port must be a whole number from {low} to {high} (got {brief(p)})")
        if len(set(v)) != len(v):
            raise ValueError("ports must not repeat")
        return tuple(sorted(v))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(
                f"must be 1-63 lowercase letters, digits and '-', starting with a letter and not ending in '-' (got {brief(v)})"
            )
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and not _IMAGE.fullmatch(v):
            raise ValueError(
                f"must be the name of a published environment: 1-63 of a-z, 0-9, '.', '_', '-' (got {brief(v)})"
            )
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if "\x00" in v:
            raise ValueError("must not contain NUL characters")
        if not v.strip():
            raise ValueError("must not be empty")
        if len(v) > MAX_COMMAND:
            raise ValueError(f"must be at most {MAX_COMMAND} characters (got {len(v)})")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str) -> str:
        base = "must be a relative path inside the uploaded directory"
        why = (
            "NUL is not allowed" if "\x00" in v
            else "backslashes are not allowed" if "\\" in v
            else "it must not be empty (use '.')" if not v.strip()
            else "'~' is not allowed" if v.startswith("~")
            else "an absolute path is not allowed" if v.startswith("/")
            else "'..' is not allowed" if ".." in PurePosixPath(v).parts
            else "it is too long" if len(v) > 4096
            else "a name in it is longer than 255 bytes" if any(len(n.encode("utf-8", "surrogatepass")) > 255
                                                                for n in PurePosixPath(v).parts)
            else None
        )  # fmt: skip
        if why:
            raise ValueError(f"{base}; {why}")
        return str(PurePosixPath(v))

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: object) -> object:
        if not isinstance(v, dict):
            raise ValueError("must be a mapping of NAME: value")
        if len(v) > MAX_ENV:
            raise ValueError(f"at most {MAX_ENV} variables (got {len(v)})")
        out: dict[str, str] = {}
        for key, value in v.items():
            if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
                raise ValueError(
                    f"{brief(key)} is not a variable name (letters, digits, '_'; not starting with a digit)"
                )
            if key.startswith(RESERVED_ENV_PREFIX) or key in RESERVED_ENV:
                reserved = ", ".join((f"{RESERVED_ENV_PREFIX}*", *sorted(RESERVED_ENV)))
                raise FieldError(key, f"is set by the platform; reserved: {reserved}")
            if (isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**100) or (
                isinstance(value, float) and math.isfinite(value)
            ):
                value = str(value)  # EPOCHS: 3 means "3"
            if not isinstance(value, str):
                raise FieldError(key, "must be a string (quote it)")
            if "\x00" in value:
                raise FieldError(key, "must not contain NUL characters")
            if len(value.encode()) > MAX_ENV_VALUE:
                raise FieldError(key, f"must be at most {MAX_ENV_VALUE // 1024} KiB")
            out[key] = value
        return out

    @field_validator("billing")
    @classmethod
    def _billing(cls, v: str) -> str:
        if not _BILLING.fullmatch(v):
            raise ValueError(
                f"must be on-demand, spot, usage or plan:<id> (id: 1-32 of A-Z a-z 0-9 _ -); got {brief(v)}"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadSpec:
        if self.kind == "job" and self.command is None:
            raise FieldError("command", "is required for a job (kind: job)")
        if self.jupyter and self.kind != "instance":
            raise FieldError("jupyter", "is for instances (kind: instance); a job's ports go in `ports`")
        if self.ports and self.network == "none":
            raise FieldError("ports", "need a network: a sandbox with network: none cannot be reached")
        if self.billing == "usage" and (self.resources.slice is not None or self.gpu_count() == 0):
            what = (
                "a GPU slice has no activity reading of its own" if self.resources.slice else "CPU-only work has none"
            )
            raise FieldError("billing", f"usage is billed by whole GPUs' measured activity; {what} (use on-demand)")
        if self.duration is not None and self.max_duration is not None and self.duration > self.max_duration:
            longest, declared = format_duration(self.max_duration), format_duration(self.duration)
            raise FieldError("duration", f"must not exceed max_duration ({longest}); got {declared}")
        return self

    # ---- what the control plane and the scheduler read ----------------------------------------------------------
    def gpu_preference(self) -> tuple[str, ...] | None:
        """Canonical GPU model names in order of preference; None when any model will do."""
        return self.resources.gpu_names() or None

    @property
    def elastic(self) -> bool:
        return isinstance(self.resources.gpus, GpuRange)

    def gpu_range(self) -> tuple[int, int] | None:
        """(min, max) for elastic work, else None."""
        g = self.resources.gpus
        return (g.min, g.max) if isinstance(g, GpuRange) else None

    def gpu_count(self) -> int:
        """The GPUs the scheduler is asked for: the count, or the minimum of an elastic range."""
        g = self.resources.gpus
        return g.min if isinstance(g, GpuRange) else g

    def milli(self) -> int:
        """Share of one GPU, in milli-GPUs: FULL, or the MIG slice's share."""
        return mig_milli(self.resources.slice) if self.resources.slice else FULL

    def billing_mode(self) -> BillingMode:
        return "plan" if self.billing.startswith("plan:") else self.billing  # type: ignore[return-value]

    def plan_id(self) -> str | None:
        return self.billing.removeprefix("plan:") if self.billing.startswith("plan:") else None

    def priority_class(self) -> PriorityClass:
        """The scheduler's class: a plan's reserved capacity outranks on-demand (and usage, which is not preemptible
        either), which outranks spot."""
        return CLASS_OF_BILLING[self.billing_mode()]

    def priority_rank(self) -> int:
        """Order within an org's own queue: low 0, normal 1, high 2."""
        return PRIORITY_RANK[self.priority]

    def nodes_for(self, gpus_per_node: int, gpus: int | None = None) -> int:
        """Node-ranks to launch: `nodes` when given, else the fewest nodes of that size holding the GPUs.

        `gpus` overrides the count (an elastic workload placed at more than its minimum).
        """
        if gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1 (got {gpus_per_node})")
        if self.resources.nodes is not None:
            return self.resources.nodes
        count = self.gpu_count() if gpus is None else gpus
        return max(1, math.ceil(count / gpus_per_node))

    def host_request(self, gpus_here: int | None = None) -> tuple[int, int]:
        """(milli-cores, MiB) of host CPU and memory the workload gets: all of it at the GPU count it asks for
        (None), or what a node-rank holding `gpus_here` of its GPUs gets, its share per GPU (`sched.host_share`,
        rounded up), as the scheduler counts it. CPU-only work is one node-rank with all of it (1 core and 2 GiB
        unless it asks otherwise). A 0 is not asked for: not counted, charged or capped (GPU work that names no
        cpus or memory)."""
        cpu, mem = self.resources.cpu_milli(), self.resources.memory_mib()
        asked = self.gpu_count()
        if gpus_here is None or asked == 0:
            return cpu, mem
        return host_share(cpu, gpus_here, asked), host_share(mem, gpus_here, asked)

    def host_held(self, gpus_per_rank: Iterable[int]) -> tuple[int, int]:
        """(milli-cores, MiB) over the node-ranks of a placement (GPUs on each): what its allocation holds and pays
        for, elastic work grown or shrunk included."""
        cpu = mem = 0
        for n in gpus_per_rank:
            c, m = self.host_request(n)
            cpu, mem = cpu + c, mem + m
        return cpu, mem

    def to_request(
        self, id: str, submit_time: float, tenant: str, attained: float = 0.0, queued_since: float | None = None
    ) -> Request:
        """The scheduler's view of this workload: `submit_time` is its place in the queue, `queued_since` (when it
        differs) when it last joined the queue."""
        g = self.resources.gpus
        lo_hi = (g.min, g.max) if isinstance(g, GpuRange) else (None, None)
        return Request(
            id=id,
            gpus=self.gpu_count(),
            submit_time=submit_time,
            tenant=tenant,
            gpu_type=self.gpu_preference(),
            milli=self.milli(),
            min_gpus=lo_hi[0],
            max_gpus=lo_hi[1],
            topology=self.resources.topology,
            exclusive=self.resources.exclusive,
            nodes=self.resources.nodes if self.milli() == FULL and self.gpu_count() > 0 else None,
            priority=self.priority_class(),
            est_runtime=self.duration,
            attained=attained,
            cpu_milli=self.resources.cpu_milli(),
            memory_mib=self.resources.memory_mib(),
            queued_since=queued_since if queued_since != submit_time else None,
            model=ModelHint(preset=self.model.preset, precision=self.model.precision) if self.model else None,
        )
