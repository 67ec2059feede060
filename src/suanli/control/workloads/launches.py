"""Launching an attempt: the `Launch` an executor gets for a workload (its ranks on the allocation's nodes, its
workdir, sandbox and environment), virtual workloads launched a chunk at a time, the handle file a restarted server
re-attaches from, and when the supervisor must look again (`max_duration`, a plan's end).

A mixin of `control.workloads.supervisor.Supervisor`, kept apart so each file stays small.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from suanli.control.accounts import sandbox_uids
from suanli.control.scheduling.clock import seconds
from suanli.control.storage import hub, volumes
from suanli.control.workloads import proxy
from suanli.control.workloads.sandboxes import SandboxPolicy, gpu_share_limits, resolve_network
from suanli.db.models import Allocation, Node, Plan, User, Workload, WorkloadEvent
from suanli.db.volumes import Volume
from suanli.executors import Executor, Launch, NodeRank
from suanli.sandbox.bwrap import SandboxError
from suanli.storage import volumes as vstore
from suanli.storage import workdirs
from suanli.storage.s3 import S3Backend, S3Config
from suanli.workloads.spec import WorkloadSpec


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Launches:
    if TYPE_CHECKING:  # provided by `Supervisor`
        home: Path
        volumes_root: Path | None
        volumes_s3: S3Config | None
        pulls: dict[str, list[tuple[str, str, int | None]]]
        grace_s: float
        sandboxes: SandboxPolicy

        def executor(self, name: str) -> Executor: ...

    def _launch_virtual(self, s: Session, ids: list[str], now: datetime) -> int:
        """Launch placed workloads on the virtual executor, a chunk at a time: no processes to lose, so one
        transaction may cover many (thousands launch in a few statements when a big queue is placed at once)."""
        w = Workload
        q = (
            select(w.id, w.state, w.stop_requested, w.spec, w.attempt, w.name, w.predicted_s, w.restart_reason,
                   Allocation.placement)
            .join(Allocation, Allocation.id == w.allocation_id)
            .where(w.id.in_(ids))
        )  # fmt: skip
        if s.get_bind().dialect.name == "postgresql":
            q = q.with_for_update(of=w.__table__)
        ex = self.executor("virtual")
        updates, events = [], []
        for r in s.execute(q):
            if r.state != "scheduled" or r.stop_requested:
                continue
            spec = WorkloadSpec.model_validate(r.spec)
            log_dir = workdirs.log_dir(self.home, r.id, r.attempt)  # the virtual executor creates it when it writes
            ranks = tuple(NodeRank(n, i, tuple(g)) for i, (n, g) in enumerate(r.placement.items()))
            duration = r.predicted_s if r.predicted_s is not None else spec.duration
            extra = {"SUANLI_RESTART_REASON": r.restart_reason} if r.restart_reason else {}
            launch = Launch(workload_id=r.id, attempt=r.attempt, command=spec.command or "", workdir=log_dir,
                            env={}, ranks=ranks, log_dir=log_dir, duration_s=duration, extra_env=extra)  # fmt: skip
            handle = {**ex.launch(launch, seconds(now)), "attempt": r.attempt, "length_s": duration}
            deadline = _deadline(s, spec, now)
            ends = now + timedelta(seconds=duration) if duration is not None else None
            updates.append({"wid": r.id, "h": handle, "t": now, "d": deadline, "e": ends})
            events += [{"workload_id": r.id, "at": now, "state": "starting",
                        "reason": f"launching {len(ranks)} node-rank(s) on the virtual executor"},
                       {"workload_id": r.id, "at": now, "state": "running", "reason": "running"}]  # fmt: skip
        if updates:
            t = w.__table__.c
            s.execute(
                update(w.__table__).where(t.id == bindparam("wid"))
                .values(state="running", reason="running", handle=bindparam("h"), started_at=bindparam("t"),
                        deadline_at=bindparam("d"), ends_at=bindparam("e")),
                updates,
            )  # fmt: skip
            s.execute(insert(WorkloadEvent.__table__), events)
        return len(updates)

    def _volume_mounts(self, s: Session, w: Workload, spec: WorkloadSpec) -> list[tuple[str, str, bool]]:
        root = self.volumes_root or self.home / "volumes"
        names = {m.ref.name for m in spec.volumes}
        self.pulls[w.id] = [(v.org_id, v.id, v.org_uid) for v in s.scalars(select(Volume).where(
            Volume.org_id == w.org_id, Volume.name.in_(names), Volume.backend == "s3"))]  # fmt: skip
        return _volume_mounts_of(s, w, spec, root, datetime.now(UTC))

    def _pull_volumes(self, wid: str) -> None:
        """Before the launch, outside any transaction: the s3 volumes it mounts, brought up to the bucket's copy."""
        wanted = self.pulls.pop(wid, [])
        if not wanted:
            return
        if self.volumes_s3 is None:
            raise SandboxError("a volume it mounts is on S3, and this server has no S3 backend (volume_s3_bucket)")
        backend = S3Backend(self.volumes_s3)
        root = self.volumes_root or self.home / "volumes"
        for org_id, vid, uid in wanted:
            backend.pull(vstore.paths(root, org_id, vid, uid), org_id, vid)

    def _launch_of(self, s: Session, w: Workload, duration_s: float | None = None) -> Launch:
        spec = WorkloadSpec.model_validate(w.spec)
        alloc = s.get(Allocation, w.allocation_id) if w.allocation_id else None
        placement = alloc.placement if alloc is not None else {}
        where: dict[str, dict[str, Any]] = {}
        if w.executor in ("ray", "slurm"):  # the engine's handle of each node, and its address
            where = dict(s.execute(select(Node.name, Node.labels).where(Node.name.in_(list(placement)))).all())
        ranks = tuple(
            NodeRank(node, i, tuple(int(g) for g in gpus), str((where.get(node) or {}).get("engine_host", "")),
                     str((where.get(node) or {}).get("address", "")))
            for i, (node, gpus) in enumerate(placement.items())
        )  # fmt: skip
        master = ranks[0].address if ranks and ranks[0].address else "127.0.0.1"
        log_dir = workdirs.log_dir(self.home, w.id, w.attempt)
        log_dir.mkdir(parents=True, exist_ok=True)
        if spec.kind == "instance":
            cwd = workdirs.instance_disk(self.home, w.id)
        else:
            upload = workdirs.upload_dir(self.home, w.id)
            cwd = upload / spec.workdir if w.has_workdir else upload
        cwd.mkdir(parents=True, exist_ok=True)
        sandbox = None
        if w.executor != "virtual":
            user = s.get(User, w.user_id)
            admin = bool(user is not None and user.is_admin)
            sandbox = self.sandboxes.request(spec, sandbox_uids.of(s, w.org_id), admin)
            if sandbox is not None:
                reachable = w.executor == "local" and os.geteuid() == 0  # the proxy enters a namespace (root only)
                net = resolve_network(spec.network, len(placement), spec.ports, self.sandboxes.network, reachable)
                sandbox = replace(sandbox, network=net)
            if sandbox is not None and placement:
                sizes = s.execute(select(Node.cpu_count, Node.memory_mib, Node.gpu_count)
                                  .where(Node.name.in_(list(placement)))).all()  # fmt: skip
                sandbox = gpu_share_limits(sandbox, [(int(c), int(m), int(g)) for c, m, g in sizes])
            if sandbox is not None and spec.volumes:
                sandbox = replace(sandbox, mounts=(*sandbox.mounts, *self._volume_mounts(s, w, spec)))
        if sandbox is not None and sandbox.network in ("private", "none"):
            master = "127.0.0.1"  # one node's ranks share one namespace; the node's address may not be in it
        command = spec.command or "exec sleep infinity"
        extra_env = {"SUANLI_WORKLOAD_NAME": w.name, "SUANLI_KIND": spec.kind}
        if w.restart_reason:  # resize, preemption, failure or node-failure: the ranks may resume from a checkpoint
            extra_env["SUANLI_RESTART_REASON"] = w.restart_reason
        if w.executor != "virtual":  # hub models and datasets, read-only, with the Hugging Face variables
            binds = hub.sandbox_binds(s, hub.store_of(self.sandboxes.hub_dir, self.home), spec, sandbox is not None)
            extra_env.update(binds.env)
            if sandbox is not None and binds.mounts:
                sandbox = replace(sandbox, mounts=(*sandbox.mounts, *binds.mounts))
        if spec.kind == "instance" and w.executor == "local":  # reachable through the server's proxy
            access = proxy.prepare_launch(self.home, w, spec, log_dir, command, sandbox is not None,
                                          sandbox.uid if sandbox is not None else None)  # fmt: skip
            command, extra_env = access.command, {**extra_env, **access.env}
            if sandbox is not None and access.mount is not None:
                sandbox = replace(sandbox, mounts=(*sandbox.mounts, access.mount))
        return Launch(
            workload_id=w.id, attempt=w.attempt, command=command, workdir=cwd,
            env=dict(spec.env), ranks=ranks, log_dir=log_dir, master_addr=master, master_port=free_port(),
            grace_s=self.grace_s,
            duration_s=duration_s if duration_s is not None else _length(w, spec),
            extra_env=extra_env, sandbox=sandbox,
        )  # fmt: skip


def _volume_mounts_of(
    s: Session, w: Workload, spec: WorkloadSpec, root: Path, now: datetime
) -> list[tuple[str, str, bool]]:
    """The spec's volumes as (host path, path in the sandbox, writable); one bound read-only against the spec's word
    (its org's money ran out, or it is over its size) says so in the workload's events."""
    out = []
    for m in volumes.host_mounts(s, root, w.org_id, spec.volumes):
        if m.note:
            s.add(WorkloadEvent(workload_id=w.id, at=now, state=w.state, reason=m.note))
        out.append((m.source, m.dest, m.writable))
    return out


def _length(w: Workload, spec: WorkloadSpec) -> float | None:
    """How long a whole run lasts on its allocation (virtual executor): the pass's figure, else the spec's."""
    return w.predicted_s if w.predicted_s is not None else spec.duration


def _plan_end(s: Session, spec: WorkloadSpec) -> datetime | None:
    plan_id = spec.plan_id()
    plan = s.get(Plan, plan_id) if plan_id else None
    return plan.ends_at if plan is not None else None


def _deadline(s: Session, spec: WorkloadSpec, now: datetime) -> datetime | None:
    """When the supervisor must look again without being asked: `max_duration` is up, or the plan ends."""
    times = [now + timedelta(seconds=spec.max_duration)] if spec.max_duration is not None else []
    end = _plan_end(s, spec)
    if end is not None:
        times.append(end)
    return min(times, default=None)


HANDLE_FILE = "handle.json"


def _write_handle(log_dir: Path, handle: dict[str, Any]) -> None:
    tmp = log_dir / f".{HANDLE_FILE}.tmp"
    tmp.write_text(json.dumps(handle), encoding="utf-8")
    os.replace(tmp, log_dir / HANDLE_FILE)


def _read_handle(log_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((log_dir / HANDLE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
