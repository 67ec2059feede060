"""The telemetry loop: sample every GPU the platform runs (simulated ones of virtual nodes, and this host's real
ones through NVML), store the samples, judge their health and act on it, and compact old samples.

One leader at a time (a database lease), like the workload loop: the simulated GPUs have state (temperature
with inertia) that must live in one place, and the health judge counts consecutive hot samples.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from suanli.control import leases
from suanli.control.ids import utcnow
from suanli.control.money import usage
from suanli.control.scheduling import inventory
from suanli.control.settings import Settings
from suanli.control.telemetry import health, telemetry
from suanli.control.telemetry.telemetry import FleetIndex
from suanli.db.engine import Database
from suanli.db.models import Allocation, ClusterRow, Gpu, Node, Workload
from suanli.db.telemetry import InjectedFault
from suanli.telemetry.health import Finding, HealthJudge
from suanli.telemetry.nvml_sampler import NvmlSampler
from suanli.telemetry.samples import GpuSample
from suanli.telemetry.simulated import Fault, Load, SimGpu, SimulatedCollector
from suanli.topology import Cluster
from suanli.workloads.models import WorkloadSpec
from suanli.workloads.runtime import load_profile

log = logging.getLogger("suanli.telemetry")
DEFAULT_LOAD = Load(busy=0.97, compute=0.8)  # a training job whose model the spec does not name
STARTING_LOAD = Load(busy=0.05, compute=1.0)  # placed, its processes not running yet
COMPACT_EVERY_S = 60.0
INGEST_CHUNK = 1000  # samples per write transaction (~20 ms on SQLite)
COMPACT_SLICE_S = 10  # seconds of raw samples deleted per compaction transaction


@dataclass
class TickReport:
    sampled: int = 0
    stored: int = 0
    findings: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)


@dataclass
class Fleet:
    """Virtual GPUs and where their nodes sit, rebuilt when the fleet changes."""

    version: int = -1
    gpus: list[SimGpu] = field(default_factory=list)
    where: dict[str, tuple[str, int]] = field(default_factory=dict)  # node name -> (cluster id, spec index)
    topologies: dict[str, Cluster | None] = field(default_factory=dict)
    topology_keys: dict[str, tuple[str, str]] = field(default_factory=dict)  # what each topology was built from
    local: str | None = None  # this host's registered node with GPUs, sampled through NVML


class TelemetryTicker:
    """One tick's work, without threads, so tests can drive it with their own clock."""

    LEASE = "telemetry"

    def __init__(self, db: Database, settings: Settings, owner: str, nvml: Any = None) -> None:
        self.db, self.settings, self.owner = db, settings, owner
        self.sim = SimulatedCollector(seed=settings.sim_seed, fault_rate_per_gpu_hour=settings.sim_fault_rate)
        self.judge = HealthJudge(health.rules_of(settings))
        self.keep = telemetry.retention_of(settings)
        self.index = FleetIndex()
        self.fleet = Fleet()
        self.nvml_module = nvml
        self.nvml: NvmlSampler | None = None
        self.profiles: dict[tuple[str, int], Load] = {}
        self.started: datetime | None = None
        self.sim_next: datetime | None = None
        self.compacted: datetime | None = None
        self.leader = False
        self.last = TickReport()

    def tick(self, now: datetime | None = None) -> TickReport:
        now = now or utcnow()
        lease_s = max(30.0, 6 * self.settings.telemetry_interval_s)
        self.leader = leases.acquire(self.db, self.LEASE, self.owner, now, lease_s,
                                     {"sampled": self.last.sampled, "stored": self.last.stored})  # fmt: skip
        if not self.leader:
            self.started = None
            return TickReport()
        self.started = self.started or now
        report = TickReport()
        with self.db.read() as s:
            self._refresh_fleet(s)
            loads = self._loads(s)
            faults, one_shot = self._faults(s)
        samples = []
        if self.fleet.gpus and (self.sim_next is None or now >= self.sim_next):
            samples = self.sim.sample(self.fleet.gpus, loads, faults, now.timestamp())
            self.sim_next = now + timedelta(seconds=self.sim_period_s() * 0.999)
        else:
            one_shot = []  # reported when the virtual fleet is next sampled
        samples += self._local(now)
        report.sampled = len(samples)
        with self.db.read() as s:  # outside the write transactions: on SQLite they hold the only write lock
            index = self.index.refresh(s)
        findings, acted = self._act(samples, one_shot, now, index)  # before storing: findings never wait
        for i in range(0, len(samples), INGEST_CHUNK):  # short write transactions: requests wait less
            with self.db.write() as s, s.begin():
                stored, _ = telemetry.ingest(s, samples[i : i + INGEST_CHUNK], index)
                report.stored += stored.stored
        report.findings = [f"{f.node}/{f.gpu}: {f.reason}" for f in findings if f.fatal]
        report.stopped = acted.workloads_stopped
        for f in findings:
            if f.fatal:
                log.warning("health: %s GPU %s: %s", f.node, f.gpu, f.reason)
        if self.compacted is None or (now - self.compacted).total_seconds() >= COMPACT_EVERY_S:
            with self.db.read() as s:  # readings that usage billing has yet to charge stay (control/money/usage.py)
                needed = usage.oldest_reading_needed_ms(s, now, usage.policy_of(self.settings).span_s)
            for _ in range(10_000):  # in slices, each its own transaction
                with self.db.write() as s, s.begin():
                    if not telemetry.compact(s, now, self.keep, slice_s=COMPACT_SLICE_S, keep_raw_from_ms=needed).more:
                        break
            self.compacted = now
        self.last = report
        return report

    def _act(
        self, samples: list[GpuSample], one_shot: list[int], now: datetime, index: FleetIndex
    ) -> tuple[list[Finding], Any]:
        """Judge the samples, then act on what is fatal in one transaction with marking one-shot faults reported.
        Judging only reads, so a tick with nothing to act on takes no write lock. If acting fails, the judge and
        the simulator forget this tick, so the next one finds the same faults again."""
        memory = self.judge.memory()
        try:
            with self.db.read() as s:
                findings = health.findings_of(self.judge, samples, index, self._heartbeats(s, now, samples))
            if not one_shot and not health.calls_for_action(findings):
                return findings, health.HealthReport()
            with self.db.write() as s, s.begin():
                if one_shot:
                    s.execute(update(InjectedFault).where(InjectedFault.id.in_(one_shot)).values(cleared_at=now))
                return findings, health.apply(s, findings, now)
        except Exception:
            self.judge.restore(memory)
            self.sim.rearm()
            raise

    def _heartbeats(self, s: Session, now: datetime, samples: list[GpuSample]) -> list[Finding]:
        """Nodes (not taken down) that stopped reporting; only once this leader has run long enough for all to
        report. This tick's samples count, though they are stored after."""
        assert self.started is not None
        if (now - self.started).total_seconds() < self.settings.health_heartbeat_s:
            return []
        period = self.sim_period_s()
        slack = 3 * period if period > self.settings.telemetry_interval_s else 0.0  # a stretched period is no loss
        q = select(Node.name, Node.last_seen_at).where(Node.last_seen_at.is_not(None), Node.state != "down")
        seen = {n: t.timestamp() for n, t in s.execute(q)}
        for x in samples:
            if x.node in seen:
                seen[x.node] = max(seen[x.node], x.t)
        late = {n: t for n, t in seen.items() if now.timestamp() - t > slack}
        return self.judge.heartbeats(late, now.timestamp())

    def sim_period_s(self) -> float:
        """The sampling period, stretched for a virtual fleet too big to simulate at it (100,000 GPUs are read
        every 25 s at the default 4,000 samples/s): simulation must not crowd out the platform it feeds."""
        return max(self.settings.telemetry_interval_s, len(self.fleet.gpus) / self.settings.sim_samples_per_s)

    # ---- what to sample ---------------------------------------------------------------------------------------
    def _refresh_fleet(self, s: Session) -> None:
        version = inventory.fleet_version(s)
        if version == self.fleet.version:
            return
        fleet = Fleet(version=version)
        host = inventory.host_node_name(socket.gethostname())
        for name, kind, state, cid, idx, gpu, uuid, model in s.execute(
            select(Node.name, Node.kind, Node.state, Node.cluster_id, Node.index, Gpu.index, Gpu.uuid, Gpu.model)
            .join(Gpu, Gpu.node_id == Node.id).order_by(Node.cluster_id, Node.index, Gpu.index)
        ):  # fmt: skip
            fleet.where[name] = (cid, idx)
            if kind == "virtual" and state != "down":  # a node taken down is switched off: it reports nothing
                fleet.gpus.append(SimGpu(name, gpu, uuid, model))
            elif kind == "local" and name == host:
                fleet.local = name
        for row in s.scalars(select(ClusterRow)):
            key = inventory.topology_key(row)
            same = self.fleet.topology_keys.get(row.id) == key
            fleet.topologies[row.id] = self.fleet.topologies.get(row.id) if same else inventory.cluster_topology(row)
            fleet.topology_keys[row.id] = key
        for gone in set(self.fleet.where) - set(fleet.where):  # removed nodes: drop what was remembered of them
            self.sim.forget(gone)
            self.judge.forget(gone)
        self.fleet = fleet

    def _loads(self, s: Session) -> dict[tuple[str, int], Load]:
        """What each held GPU is doing: running work at its predicted compute/communication mix."""
        out: dict[tuple[str, int], Load] = {}
        live: set[tuple[str, int]] = set()
        rows = s.execute(
            select(Allocation.placement, Workload.id, Workload.attempt, Workload.state)
            .join(Workload, Workload.id == Allocation.workload).where(Allocation.stopped_at.is_(None))
        ).all()  # fmt: skip
        missing = [(wid, att) for _, wid, att, st in rows if st == "running" and (wid, att) not in self.profiles]
        specs = dict(s.execute(select(Workload.id, Workload.spec).where(Workload.id.in_([w for w, _ in missing[:200]]))
                               ).all()) if missing else {}  # fmt: skip
        for placement, wid, attempt, state in rows:
            key = (wid, attempt)
            live.add(key)
            if state != "running":
                load = STARTING_LOAD
            else:
                if key not in self.profiles and wid in specs:
                    self.profiles[key] = self._profile(specs[wid], placement or {})
                load = self.profiles.get(key, DEFAULT_LOAD)
            for node, idx in (placement or {}).items():
                for g in idx:
                    out[(node, int(g))] = load
        self.profiles = {k: v for k, v in self.profiles.items() if k in live}
        return out

    def _profile(self, spec_doc: dict[str, Any], placement: dict[str, list[int]]) -> Load:
        try:
            spec = WorkloadSpec.model_validate(spec_doc)
            first = next(iter(placement), None)
            cid = self.fleet.where.get(first)[0] if first in self.fleet.where else None  # type: ignore[index]
            cluster = self.fleet.topologies.get(cid) if cid else None
            if spec.model is None or cluster is None:
                return DEFAULT_LOAD
            gpus = [cluster.gpus_of_node(self.fleet.where[n][1]).start + int(g)
                    for n, idx in placement.items() if n in self.fleet.where for g in idx]  # fmt: skip
            mix = load_profile(spec, cluster, gpus)
        except Exception:  # a profile is a nicety: never let it stop sampling
            log.exception("load profile failed")
            return DEFAULT_LOAD
        return Load(busy=0.97 * mix[0], compute=mix[1]) if mix else DEFAULT_LOAD

    def _faults(self, s: Session) -> tuple[list[Fault], list[int]]:
        rows = s.execute(
            select(InjectedFault.id, InjectedFault.kind, InjectedFault.gpu, InjectedFault.xid, Node.name)
            .join(Node, Node.id == InjectedFault.node_id).where(InjectedFault.cleared_at.is_(None))
        ).all()  # fmt: skip
        faults = []
        for _, kind, gpu, xid, node in rows:
            if kind == "silent":  # the node's agent stopped: none of its GPUs report
                faults += [Fault(kind, node, g.gpu) for g in self.fleet.gpus if g.node == node]
            else:
                faults.append(Fault(kind, node, gpu, xid))
        return faults, [fid for fid, kind, *_ in rows if kind in health.ONE_SHOT]

    def _local(self, now: datetime) -> list[GpuSample]:
        if self.fleet.local is None:
            return []
        if self.nvml is None or self.nvml.node != self.fleet.local:
            if self.nvml is not None:
                self.nvml.close()
            self.nvml = NvmlSampler(self.fleet.local, self.nvml_module)
        return self.nvml.sample(now.timestamp())

    def release(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
        if self.leader:
            leases.release(self.db, self.LEASE, self.owner)


class TelemetryLoop:
    def __init__(self, db: Database, settings: Settings, owner: str) -> None:
        self.ticker = TelemetryTicker(db, settings, owner)
        self.interval = settings.telemetry_interval_s
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, name="suanli-telemetry", daemon=True)

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.ticker.tick()
            except Exception:
                log.exception("telemetry pass failed")
            self.stop_event.wait(self.interval)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)
        try:
            self.ticker.release()
        except Exception:
            log.exception("releasing the telemetry lease failed")
