"""The Ray executor's pure half: names, what a rank's bundle reserves, and the gang's rules over its ranks' reports.

A report is what the executor learnt of one rank on a poll: `state` (running/exited/lost), and for an ended rank
its `exit_code`, `reason` (the local executor's words for one rank) and `ended_at` (its node's clock); `drained`
once the server holds the rank's whole log. The rules are the local executor's: the earliest failure (a non-zero
exit, or a lost rank) is the gang's, and the attempt has ended only when no rank runs any more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from suanli.executors.base import Launch, NodeRank, Status
from suanli.executors.ray_nodes import OWN_PREFIX

Report = dict[str, Any]


def group_name(workload_id: str, attempt: int) -> str:
    """The attempt's placement group: `suanli:<workload>:a<attempt>` (`ray_nodes.own_gpus` counts these as ours)."""
    return f"{OWN_PREFIX}{workload_id}:a{attempt}"


def actor_name(workload_id: str, attempt: int, node_rank: int) -> str:
    """A node-rank's actor: `suanli:<workload>:a<attempt>:r<rank>`, in the executor's namespace."""
    return f"{group_name(workload_id, attempt)}:r{node_rank}"


def bundle_for(launch: Launch, rank: NodeRank, cpus_per_rank: float) -> dict[str, float]:
    """What a rank's bundle reserves: its GPUs as a count (Ray numbers them its own way; suanli's indices travel in
    CUDA_VISIBLE_DEVICES) and the rank's share of the workload's CPUs, in tenths, else `cpus_per_rank`."""
    cpus = cpus_per_rank
    req = launch.sandbox
    if req is not None and req.cpu_milli:
        from suanli.sched.state import host_share

        share = host_share(req.cpu_milli, len(rank.gpus), req.gpus_asked) if req.gpus_asked else req.cpu_milli
        cpus = max(cpus_per_rank, math.ceil(share / 100) / 10)
    bundle = {"CPU": float(cpus)}
    if rank.gpus:
        bundle["GPU"] = float(len(rank.gpus))
    return bundle


def first_failure(reports: Mapping[int, Report], world: int, now: float) -> dict[str, Any] | None:
    """The gang's first failure among these reports (earliest end, then the lowest rank), or None."""
    failed: list[tuple[float, int, dict[str, Any]]] = []
    for n, r in sorted(reports.items()):
        if r["state"] == "lost":
            failed.append((now, n, {"state": "lost", "exit_code": None, "reason": r["reason"], "node_rank": n}))
        elif r["state"] == "exited" and r.get("exit_code") not in (0, None):
            at = float(r["ended_at"]) if r.get("ended_at") is not None else now
            where = f" (rank {n})" if world > 1 else ""
            record = {"state": "exited", "exit_code": int(r["exit_code"]), "reason": r["reason"] + where}
            failed.append((at, n, {**record, "node_rank": n}))
    if not failed:
        return None
    return min(failed, key=lambda f: (f[0], f[1]))[2]


def final_record(
    reports: Mapping[int, Report], failure: Mapping[str, Any] | None, stop: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The attempt's final status as JSON once no rank runs and every log is in; None while it is not over."""
    if any(r["state"] == "running" for r in reports.values()) or not all(r.get("drained") for r in reports.values()):
        return None
    note = " (stop requested)" if stop is not None and stop.get("by") == "user" else ""
    ends = [float(r["ended_at"]) for r in reports.values() if r.get("ended_at") is not None]
    ended = max(ends) if ends else None
    if failure is None:
        return {"state": "exited", "exit_code": 0, "reason": "exit code 0" + note, "ended_at": ended}
    if failure["state"] == "lost":
        return {"state": "lost", "exit_code": None, "reason": failure["reason"], "ended_at": None}
    return {"state": "exited", "exit_code": int(failure["exit_code"]), "reason": failure["reason"] + note,
            "ended_at": ended}  # fmt: skip


def status_of(record: Mapping[str, Any]) -> Status:
    return Status(record["state"], record.get("exit_code"), record.get("reason", ""), record.get("ended_at"))
