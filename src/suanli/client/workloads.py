"""The SDK's workload calls (submit, list, describe, logs, stop, start, wait) and the workload results they return.

A mixin of `suanli.client.Client` (kept apart so each file stays small).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from suanli.client.models import load
from suanli.client.requests import _params, _seg, _spec_body
from suanli.workdir_upload import pack_workdir

if TYPE_CHECKING:
    import httpx


# ---- workloads ----
TERMINAL_STATES = frozenset({"succeeded", "failed", "stopped", "preempted"})
"""States a workload ends in (an instance that is stopped may be started again, a new lifetime)."""


@dataclass(frozen=True)
class WorkloadEvent:
    at: datetime
    state: str
    reason: str = ""


@dataclass(frozen=True)
class PendingInfo:
    """Why a pending workload waits (the scheduler's words) and its place in the queue (1: next)."""

    reason: str
    position: int | None = None


@dataclass(frozen=True)
class WorkloadAllocation:
    id: str
    gpu_model: str | None
    gpus: int
    milli: int  # thousandths of a GPU each (1000: whole GPUs; less: a slice)
    nodes: dict[str, tuple[int, ...]]  # node name -> GPU indices on it
    rate_per_hour: Decimal
    billing_mode: str
    started_at: datetime | None = None
    stopped_at: datetime | None = None
    cpu_milli: int = 0  # host CPU held, 1000 a core (0: not asked for)
    memory_mib: int = 0
    host_rate_per_hour: Decimal = Decimal(0)  # the host CPU and memory part of rate_per_hour


@dataclass(frozen=True)
class Workload:
    """A job or an instance; `events` and `spec` come with `Client.workload` only, not with the list."""

    id: str
    name: str
    kind: str  # job | instance
    state: str  # pending scheduled starting running succeeded failed stopped preempted
    org_id: str = ""
    user_id: str = ""
    reason: str = ""
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    gpu: str | None = None
    gpus: int = 0
    nodes: int = 0
    attempt: int = 0
    exit_code: int | None = None
    pending: PendingInfo | None = None
    allocation: WorkloadAllocation | None = None
    cost: Decimal = Decimal(0)
    rate_per_hour: Decimal | None = None
    currency: str = ""
    events: list[WorkloadEvent] = field(default_factory=list)
    spec: dict[str, Any] | None = None
    scale_to: int | None = None  # the GPU count its owner scaled it to (`Client.scale`), while it runs

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class LogChunk:
    """Log text from `offset` on; `done`: the workload has finished and this reaches the end of its log."""

    data: str
    next_offset: int
    done: bool


class WorkloadCalls:
    if TYPE_CHECKING:  # provided by `Client`

        def _get(self, path: str, **params: Any) -> Any: ...
        def _post(self, path: str, body: Any = None, *, auth: bool = True) -> Any: ...
        def request(self, method: str, path: str, **kw: Any) -> httpx.Response: ...

    def submit(
        self, spec: str | dict[str, Any] | Path, *, workdir: Path | str | None = None, org_id: str | None = None
    ) -> Workload:
        """Submit a job or an instance: `spec` is YAML text, a dict, or a Path to a YAML file. `workdir` is
        packed (`pack_workdir`) and uploaded first (`POST /workdirs`), then named by the submission; `org_id` None:
        the caller's personal org."""
        if isinstance(spec, str) and "\n" not in spec and spec.strip().endswith((".yaml", ".yml")):
            raise ValueError(f"spec {spec!r} looks like a file name; pass Path({spec!r}) to submit a file")
        body = _spec_body(spec, org_id)
        if workdir is not None:
            packed = pack_workdir(workdir)
            up = self.request("POST", "/workdirs", params=_params(org=org_id), content=packed,
                              content_type="application/octet-stream")  # fmt: skip
            body["workdir_upload"] = up.json()["id"]
        return load(Workload, self._post("/workloads", body))

    def workloads(self, *, all: bool = False, org_id: str | None = None) -> list[Workload]:
        """The caller's workloads (in all their orgs, or in `org_id`), newest first; `all`: finished ones too."""
        return [load(Workload, w) for w in self._get("/workloads", all="true" if all else None, org=org_id)]

    def environments(self) -> list[str]:
        """Names of the environments the operator published, for a spec's `image:`."""
        return [str(e["name"]) for e in self._get("/environments")]

    def workload(self, ref: str) -> Workload:
        """One workload with its events and spec; `ref` is an id or a name (the newest of that name)."""
        return load(Workload, self._get(f"/workloads/{_seg(ref)}"))

    def logs(self, ref: str, offset: int = 0, rank: int = 0) -> LogChunk:
        """Node-rank `rank`'s log from byte `offset` on (what there is so far)."""
        return load(LogChunk, self._get(f"/workloads/{_seg(ref)}/logs", offset=offset, rank=rank))

    def follow_logs(self, ref: str, rank: int = 0, poll_s: float = 1.0, offset: int = 0) -> Iterator[str]:
        """Log text as it is written, until the workload has finished and its log is read to the end."""
        ref = self.workload(ref).id  # a name could come to mean a newer workload while we follow
        while True:
            chunk = self.logs(ref, offset, rank)
            if chunk.data:
                yield chunk.data
            if chunk.done:
                return
            if chunk.next_offset == offset:
                time.sleep(poll_s)
            offset = chunk.next_offset

    def stop(self, ref: str) -> Workload:
        """Ask a workload to stop (a grace period, then it is killed); pending ones are cancelled."""
        return load(Workload, self._post(f"/workloads/{_seg(ref)}/stop"))

    def start(self, ref: str, *, no_gpu: bool = False) -> Workload:
        """Start a stopped instance again (the server refuses jobs: 409); `no_gpu`: CPU-only this time, to reach
        its disk at CPU price (its GPUs come back on the next start)."""
        return load(Workload, self._post(f"/workloads/{_seg(ref)}/start", {"no_gpu": True} if no_gpu else None))

    def wait(
        self,
        ref: str,
        states: Collection[str] = TERMINAL_STATES,
        timeout: float | None = None,
        poll_s: float = 1.0,
    ) -> Workload:
        """Poll until the workload is in one of `states` (default: finished); TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            w = self.workload(ref)
            if w.state in states:
                return w
            ref = w.id
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"workload {w.id} is still {w.state} after {timeout:g} s")
                time.sleep(min(poll_s, left))
            else:
                time.sleep(poll_s)
