"""The SDK's calls for endpoints (`suanli deploy`, `suanli endpoints …`, `suanli keys create --endpoint`).

A mixin of `suanli.client.Client` (kept apart so each file stays small). The endpoint itself speaks the OpenAI API
at `SERVER/v1`: use the `openai` client there with a key from `endpoint_key_create`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from suanli.client.models import load


@dataclass(frozen=True)
class EndpointReplica:
    workload_id: str
    name: str
    state: str
    ready: bool
    port: int
    attempt: int
    ready_at: datetime | None


@dataclass(frozen=True)
class EndpointEvent:
    at: datetime
    kind: str  # deploy | scale | replica | ready | error
    reason: str


@dataclass(frozen=True)
class Endpoint:
    id: str
    name: str
    org_id: str
    model: str
    repo_id: str
    runtime: str
    gpu: str | None
    gpus: int
    min_replicas: int
    max_replicas: int
    desired: int
    ready: int
    created_at: datetime
    price_per_1m_tokens: str | None = None
    replicas: list[EndpointReplica] = field(default_factory=list)  # `endpoint()` only: the active ones
    events: list[EndpointEvent] = field(default_factory=list)


@dataclass(frozen=True)
class EndpointKey:
    id: str
    endpoint_id: str
    org_id: str
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    key: str | None = None  # the key itself, once, from `endpoint_key_create`


@dataclass(frozen=True)
class EndpointUsage:
    minute: datetime
    key_id: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    charged_tokens: int = 0  # of these, charged to another org's key
    charged: Decimal = Decimal(0)  # what they cost (exact)


@dataclass(frozen=True)
class ServeQuoteOffer:
    """The cheapest configuration on one offer (cluster, GPU model) that keeps the SLO at the quoted rate."""

    cluster: str
    gpu: str
    gpus_per_replica: int
    tp: int
    pp: int
    ep: int
    precision: str
    replicas: int
    gpus: int
    free_gpus: int
    available_now: bool
    replica_max_rps: float
    ttft_ms: float | None
    itl_ms: float
    rate_per_hour: Decimal  # the endpoint: replicas x replica_per_hour
    replica_per_hour: Decimal
    per_1m_tokens: Decimal  # prompt and output tokens at the rate
    per_1m_output_tokens: Decimal


@dataclass(frozen=True)
class ServeQuote:
    model: str
    rps: Decimal
    input_len: int
    output_len: int
    slo_ttft_ms: Decimal
    slo_itl_ms: Decimal
    billing_mode: str
    currency: str
    offers: list[ServeQuoteOffer]
    cannot_meet_slo: list[str]


def _ref(ref: str) -> str:
    return quote(ref, safe="")


class ServingCalls:
    if TYPE_CHECKING:  # provided by `Client`

        def _get(self, path: str, **params: Any) -> Any: ...
        def _post(self, path: str, body: Any = None, *, auth: bool = True) -> Any: ...
        def call(self, method: str, path: str, body: Any = None, *, params: Any = None, auth: bool = True) -> Any: ...

    def deploy(self, spec: dict[str, Any] | str, org_id: str | None = None) -> Endpoint:
        """Deploy a hub model as an endpoint (`kind: service`): a dict, or YAML text."""
        body: dict[str, Any] = {"spec": spec} if isinstance(spec, dict) else {"spec_yaml": spec}
        if org_id:
            body["org"] = org_id
        return load(Endpoint, self._post("/endpoints", body))

    def quote_serve(self, model: str, rps: Decimal | int | str, **options: Any) -> ServeQuote:
        """Serving a performance-model preset at `rps` requests/s on each offer: replicas, GPUs and price per hour
        and per 1M tokens, cheapest first. Options (server defaults when left out): input_len, output_len,
        slo_ttft_ms, slo_itl_ms, gpu, precision (a list), max_gpus_per_replica, billing_mode (on-demand|spot),
        cpus_per_replica, memory_per_replica ("24Gi")."""
        body = {"model": model, "rps": str(rps),
                **{k: str(v) if isinstance(v, Decimal) else v for k, v in options.items() if v is not None}}  # fmt: skip
        return load(ServeQuote, self._post("/quotes/serve", body))

    def endpoints(self) -> list[Endpoint]:
        return [load(Endpoint, e) for e in self._get("/endpoints")]

    def endpoint(self, ref: str) -> Endpoint:
        """One endpoint with its active replicas and its events (autoscaling decisions among them)."""
        return load(Endpoint, self._get(f"/endpoints/{_ref(ref)}"))

    def endpoint_scale(self, ref: str, replicas: int) -> Endpoint:
        """A fixed replica count (0: scale to zero; a request then starts one)."""
        return load(Endpoint, self._post(f"/endpoints/{_ref(ref)}/scale", {"replicas": replicas}))

    def endpoint_remove(self, ref: str) -> Endpoint:
        return load(Endpoint, self.call("DELETE", f"/endpoints/{_ref(ref)}"))

    def endpoint_key_create(self, ref: str, name: str = "default", password: str | None = None) -> EndpointKey:
        """A key for the endpoint; `key` holds it this once. A key never expires: a client whose token does gives
        the account's `password` (refused without it: 403)."""
        body = {"name": name} if password is None else {"name": name, "password": password}
        return load(EndpointKey, self._post(f"/endpoints/{_ref(ref)}/keys", body))

    def endpoint_keys(self, ref: str) -> list[EndpointKey]:
        return [load(EndpointKey, k) for k in self._get(f"/endpoints/{_ref(ref)}/keys")]

    def endpoint_key_revoke(self, key_id: str) -> EndpointKey:
        return load(EndpointKey, self.call("DELETE", f"/endpoint-keys/{_ref(key_id)}"))

    def endpoint_usage(self, ref: str) -> list[EndpointUsage]:
        """Requests and tokens per key per minute, newest first."""
        return [load(EndpointUsage, u) for u in self._get(f"/endpoints/{_ref(ref)}/usage")]
