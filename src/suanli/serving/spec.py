"""The endpoint spec (`kind: service`, or `suanli deploy`): every field bounded, each error naming its field.

An endpoint serves one hub model, or a checkpoint directory of a volume (`vol:NAME[@N]/PATH`), through an
OpenAI-compatible runtime; its replicas are ordinary workloads built from it (`replica_spec`). Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from suanli.workloads.durations import brief
from suanli.workloads.models import HUB_NAME, WorkloadSpec
from suanli.workloads.resources import FieldError, Resources
from suanli.workloads.spec import SpecError, load_yaml, spec_errors
from suanli.workloads.volumes import VolumeRuleError, clean_path, parse_ref

_NAME = re.compile(r"[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?")
_CFG = ConfigDict(extra="forbid", frozen=True)
MAX_REPLICAS = 16
MAX_TARGET = 1024  # concurrent requests per replica
MAX_MODEL_LEN = 1 << 20
MAX_PRICE = 10**6  # per 1M tokens
VOLUME_PREFIX = "vol:"
MODEL_MOUNT = "/mnt/model"  # where a replica's checkpoint volume is mounted, read-only
MAX_MODEL_PATH = 200  # characters of the checkpoint's path in the sandbox (the endpoint keeps it)


@dataclass(frozen=True)
class VolumeModel:
    """`vol:NAME[@N]/PATH`: the directory PATH of volume NAME (or of its read-only version N)."""

    ref: str  # NAME or NAME@N
    path: str  # inside the volume, cleaned ("" is its root)

    @property
    def sandbox_path(self) -> str:
        """The checkpoint directory as the runtime sees it: the volume is mounted at `MODEL_MOUNT`."""
        return f"{MODEL_MOUNT}/{self.path}" if self.path else MODEL_MOUNT

    def __str__(self) -> str:
        return f"{VOLUME_PREFIX}{self.ref}/{self.path}" if self.path else f"{VOLUME_PREFIX}{self.ref}"


def volume_model(model: str) -> VolumeModel | None:
    """The volume checkpoint `model` names, or None for a hub model; ValueError naming what is wrong."""
    if not model.startswith(VOLUME_PREFIX):
        return None
    ref, _, path = model[len(VOLUME_PREFIX) :].partition("/")
    try:
        parse_ref(ref)
        vm = VolumeModel(ref, clean_path(path))
    except VolumeRuleError as e:
        raise ValueError(f"vol:VOLUME[@N]/PATH: {e}") from None
    if len(vm.sandbox_path) > MAX_MODEL_PATH:
        raise ValueError(f"vol:VOLUME[@N]/PATH: the path is longer than {MAX_MODEL_PATH - len(MODEL_MOUNT) - 1} "
                         "characters")  # fmt: skip
    return vm


class Autoscale(BaseModel):
    """Replicas between `min_replicas` (0: scale to zero when idle) and `max_replicas`, aiming at `target` concurrent
    requests per replica; down after `idle_s` seconds without the load that needed more."""

    model_config = _CFG

    min_replicas: StrictInt = Field(1, ge=0, le=MAX_REPLICAS)
    max_replicas: StrictInt = Field(1, ge=1, le=MAX_REPLICAS)
    target: StrictInt = Field(8, ge=1, le=MAX_TARGET)
    idle_s: StrictInt = Field(300, ge=5, le=86_400)
    cold_start_s: StrictInt = Field(120, ge=1, le=900)  # how long a request at zero waits for a replica

    @model_validator(mode="after")
    def _ordered(self) -> Autoscale:
        if self.min_replicas > self.max_replicas:
            raise FieldError("max_replicas", f"must be >= min_replicas ({self.min_replicas})")
        return self


class EndpointSpec(BaseModel):
    """A validated endpoint spec; `model_dump(mode="json")` is its stored form and parses back."""

    model_config = _CFG

    name: str
    kind: Literal["service"] = "service"
    model: str
    runtime: Literal["vllm", "transformers"] | None = None  # default: vllm on GPUs, transformers on CPU (vLLM's
    # CPU backend may be asked for by name)
    resources: Resources = Field(default_factory=lambda: Resources(gpus=1))
    replicas: StrictInt | None = Field(None, ge=0, le=MAX_REPLICAS)  # a fixed count: min = max = replicas
    autoscale: Autoscale | None = None
    max_model_len: StrictInt | None = Field(None, ge=16, le=MAX_MODEL_LEN)
    billing: Literal["on-demand", "spot"] = "on-demand"
    image: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    price_per_1m_tokens: str | None = None  # what other orgs' keys pay the owner (exact decimal text)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(f"must be 1-63 lowercase letters, digits and '-', starting with a letter (got {brief(v)})")
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: object) -> object:
        """The workload spec's rules for env (names, reserved names, sizes), worded for this field."""
        try:
            return WorkloadSpec.model_validate({"name": "x", "command": "x", "env": v}).env
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, FieldError):
                raise FieldError(cause.field, cause.message) from None
            raise ValueError(str(cause or err.get("msg", "invalid"))) from None

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        vm = volume_model(v)
        if vm is not None:
            return str(vm)
        if not HUB_NAME.fullmatch(v) or ".." in v:
            raise ValueError(f"must be a hub model's name: 1-63 of a-z, 0-9, '.', '_', '-' (got {brief(v)})")
        return v

    @field_validator("price_per_1m_tokens", mode="before")
    @classmethod
    def _price(cls, v: object) -> object:
        from decimal import Decimal, InvalidOperation

        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, str | int):
            raise ValueError("must be a decimal amount as text, e.g. '2.50'")
        try:
            d = Decimal(str(v))
        except InvalidOperation:
            raise ValueError(f"must be a decimal amount, e.g. '2.50' (got {brief(v)})") from None
        if not d.is_finite() or d < 0 or d > MAX_PRICE or d.as_tuple().exponent < -8:  # type: ignore[operator]
            raise ValueError(f"must be 0 to {MAX_PRICE} with at most 8 decimals (got {brief(v)})")
        return format(d, "f")

    @model_validator(mode="after")
    def _consistent(self) -> EndpointSpec:
        if self.replicas is not None and self.autoscale is not None:
            raise FieldError("replicas", "give replicas (a fixed count) or autoscale, not both")
        if not isinstance(self.resources.gpus, int):
            raise FieldError("resources.gpus", "a replica runs on a fixed number of GPUs, not a range")
        if self.resources.slice is not None:
            raise FieldError("resources.slice", "a replica runs on whole GPUs")
        return self

    def gpus(self) -> int:
        g = self.resources.gpus
        return g if isinstance(g, int) else g.min

    def runtime_name(self) -> str:
        return self.runtime or ("vllm" if self.gpus() > 0 else "transformers")

    def scaling(self) -> Autoscale:
        """The autoscaling bounds: a fixed `replicas` is min = max (1 when neither is given)."""
        if self.autoscale is not None:
            return self.autoscale
        n = 1 if self.replicas is None else self.replicas
        return Autoscale(min_replicas=n, max_replicas=max(n, 1))


def parse_endpoint(source: str | dict[str, Any]) -> EndpointSpec:
    """Validate a spec (YAML/JSON text or a mapping); raises `SpecError` naming each field (the workload spec's
    loader and wording)."""
    data: Any = load_yaml(source) if isinstance(source, str) else source
    if not isinstance(data, dict):
        raise SpecError([{"field": "spec", "message": "must be a mapping (name: …, kind: service, model: …)"}])
    try:
        return EndpointSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(spec_errors(e)) from None


def replica_spec(spec: EndpointSpec, index: int, command: str, port: int, env: dict[str, str]) -> WorkloadSpec:
    """The workload one replica runs: the runtime's command line on `port`, the endpoint's GPUs in one NVLink domain
    (a tensor-parallel replica), the hub model (or the checkpoint's volume, at `MODEL_MOUNT`) mounted read-only,
    retried on failures like any workload."""
    res = spec.resources.model_dump(mode="json", exclude_none=True)
    if spec.gpus() > 1:
        res["topology"] = "nvlink"
    doc: dict[str, Any] = {
        "name": f"{spec.name}-r{index}"[:63].rstrip("-"),
        "kind": "job",
        "command": command,
        "env": {**spec.env, **env},
        "resources": res,
        "billing": spec.billing,
        "ports": [port],
        "network": "host",  # the serving gateway reaches replicas on the host network
        "retry": {"on": ["node-failure", "failure", "preemption"], "limit": 3},
    }
    vm = volume_model(spec.model)
    if vm is None:
        doc["models"] = [spec.model]
    else:  # the runtime loads a local directory; offline, so nothing it lacks is fetched from the internet
        doc["volumes"] = [{"name": vm.ref, "path": MODEL_MOUNT, "read_only": True}]
        doc["env"] = {**doc["env"], "HF_HUB_OFFLINE": "1"}
    if spec.image is not None:
        doc["image"] = spec.image
    return WorkloadSpec.model_validate(doc)
