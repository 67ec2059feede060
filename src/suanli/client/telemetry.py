"""The SDK's telemetry calls: every GPU's newest reading, the cluster summary, node health events, fault injection,
a node's or a workload's metric series, and the Prometheus exposition.

A mixin of `suanli.client.Client` (kept apart so each file stays small). The answers are the server's JSON as
plain dicts and lists: they are read by tables and dashboards, and their shapes are documented by the API
(`/docs`). Times are ISO 8601 strings; `since` and `until` may be given as `datetime` or ISO text.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import httpx

from suanli.client.requests import _seg

FAULT_KINDS = ("overtemp", "xid", "ecc_dbe", "off_bus", "silent")
RESOLUTIONS = ("auto", "raw", "1m", "1h")
METRICS_PATH = "/metrics"  # outside /api/v1, where Prometheus looks


def _when(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


class TelemetryCalls:
    """GPU telemetry and health: operators see every node, tenants their own workloads' GPUs."""

    if TYPE_CHECKING:  # provided by `Client`

        def request(self, method: str, path: str, **kw: Any) -> httpx.Response: ...
        def _get(self, path: str, **params: Any) -> Any: ...
        def _post(self, path: str, body: Any = None, *, auth: bool = True) -> Any: ...
        def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any: ...

    # ---- operators: the fleet now ----
    def admin_gpus(self) -> list[dict[str, Any]]:
        """Every GPU with its newest reading (reading fields None when it sent none lately), health and holder."""
        return self._get("/admin/gpus")

    def cluster_summary(self) -> dict[str, Any]:
        """GPUs allocated/free/unhealthy by model, utilisation, temperatures, queue, waste and revenue, now."""
        return self._get("/cluster/summary")

    # ---- operators: health ----
    def node_events(self, node: str, limit: int = 200) -> list[dict[str, Any]]:
        """Health events of a node (rules that fired, what was done), oldest first."""
        return self._get(f"/admin/nodes/{_seg(node)}/events", limit=limit)

    def inject_fault(self, node: str, gpu: int, kind: str, xid: int = 0) -> dict[str, Any]:
        """Make a virtual node's simulated GPU report a fault (overtemp, xid, ecc_dbe, off_bus, silent); the
        health rules then act on it. Repair: set the node ready again (`admin_set_node_state(node, "ready")`)."""
        return self._post(f"/admin/nodes/{_seg(node)}/faults", {"gpu": gpu, "kind": kind, "xid": xid})

    # ---- node agents ----
    def post_samples(self, samples: list[Any]) -> dict[str, Any]:
        """Store a node agent's batch of GPU samples (`GpuSample`s or dicts of their fields; the node's agent token,
        or an operator's): how many were stored, which GPUs nobody registered, and the fatal health findings."""
        rows = [s if isinstance(s, dict) else {f: getattr(s, f) for f in s.__slots__} for s in samples]
        return self._post("/telemetry/samples", {"samples": rows})

    def agent_token_create(self, node: str) -> dict[str, Any]:
        """A token for `suanli agent` on `node` (its `token`, shown once): it posts that node's samples only."""
        return self._post(f"/admin/nodes/{_seg(node)}/agent-tokens", {})

    def agent_tokens(self) -> list[dict[str, Any]]:
        """Every node agent's token (id, node, prefix, created, revoked), never the token itself."""
        return self._get("/admin/agent-tokens")

    def agent_token_revoke(self, token_id: str) -> dict[str, Any]:
        return self.call("DELETE", f"/admin/agent-tokens/{_seg(token_id)}")

    # ---- series ----
    def node_metrics(
        self,
        node: str,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        resolution: str = "auto",
    ) -> dict[str, Any]:
        """Every GPU of a node over a range (default: the last 15 minutes): raw points, or min/avg/max per
        minute or hour (`resolution` auto: the finest that covers the range). Operators only."""
        return self._get(f"/nodes/{_seg(node)}/metrics", since=_when(since), until=_when(until), resolution=resolution)

    def workload_metrics(
        self,
        ref: str,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        resolution: str = "auto",
    ) -> dict[str, Any]:
        """The GPUs a workload held, each only while it held them (default: its whole life on GPUs)."""
        return self._get(
            f"/workloads/{_seg(ref)}/metrics", since=_when(since), until=_when(until), resolution=resolution
        )

    # ---- Prometheus ----
    def metrics_text(self) -> str:
        """The Prometheus exposition (`GET /metrics`, an operator token), as text."""
        return self.request("GET", METRICS_PATH).text
