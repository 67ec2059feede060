"""The serving pass, run by the workload loop's leader after the supervisor: for every endpoint, probe replicas that
run but have not answered yet, let the autoscaler decide the replica count from the load the gateways report, and
keep that many replica workloads (submit new ones, stop extras). Every decision is an endpoint event.

A replica is ready once its runtime answers the runtime's probe (`GET /health` or `/v1/models`) on its port, and
only while a process of that replica's own sandbox holds the listening socket (the rule the instance proxy uses:
on the shared host network a port number alone would reach whoever listens there).
"""

from __future__ import annotations

import logging
import secrets
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import delete, select

from suanli.control.errors import ServiceError
from suanli.control.serving import endpoints, token_billing
from suanli.control.workloads import admission, workloads
from suanli.db.engine import Database
from suanli.db.models import Workload
from suanli.db.serving import Endpoint, EndpointLoad, EndpointReplica
from suanli.sandbox.listeners import host_listener, owned_listener
from suanli.serving.autoscale import Observed, decide
from suanli.serving.runtimes import runtime

log = logging.getLogger("suanli.serving")
LOAD_FRESH_S = 10.0  # a gateway's load report older than this counts as no load
STALE_LOAD_S = 86_400.0  # a report this old is of a gateway process long gone: removed (its last request time with it)
PROBE_TIMEOUT_S = 1.0
RECHECK_S = 5.0  # a ready replica's listener is checked to still be its sandbox's this often
CHARGE_EVERY_S = 10.0
REFUSAL_EVERY_S = 60.0  # a replica that cannot be submitted is said once a minute, not every pass


def free_port(taken: set[int]) -> int:
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in taken and port >= 1024:
            return port
    raise RuntimeError("no free port")


def listener_of(w: Workload, port: int) -> str | None:
    """The address a replica's runtime listens on, if a process of its own sandbox holds the socket."""
    rank0 = next((r for r in (w.handle or {}).get("ranks", []) if int(r.get("node_rank", -1)) == 0), {})
    box = rank0.get("sandbox_file")
    return owned_listener(Path(box), port) if box else host_listener(port)


def probe(address: str, port: int, path: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    host = f"[{address}]" if ":" in address else address
    try:
        return httpx.get(f"http://{host}:{port}{path}", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class ServingPass:
    admitting: endpoints.Admitting
    refused_at: dict[str, float] = field(default_factory=dict)  # endpoint -> when a refusal was last recorded
    checked_at: dict[str, float] = field(default_factory=dict)  # replica -> when its listener was last checked
    charged_at: float = float("-inf")

    def run(self, db: Database, now: datetime) -> int:
        """One pass over every endpoint; how many replicas changed state (ready, added, stopped). Tokens are
        charged every `CHARGE_EVERY_S`."""
        with db.read() as s:
            ids = list(s.scalars(select(Endpoint.id)))
        mono = time.monotonic()
        if mono - self.charged_at >= CHARGE_EVERY_S:
            self.charged_at = mono
            try:
                token_billing.charge(db, now)
            except Exception:
                log.exception("charging tokens failed")
        changed = 0
        for eid in ids:
            try:
                changed += self._probe(db, eid, now)
                changed += self._scale(db, eid, now)
            except Exception:
                log.exception("serving pass for %s failed", eid)
        return changed

    # ---- readiness ----------------------------------------------------------------------------------------
    def _probe(self, db: Database, eid: str, now: datetime) -> int:
        with db.read() as s:
            e = s.get(Endpoint, eid)
            if e is None:
                return 0
            path = runtime(endpoints.spec_of(e).runtime_name()).probe_path
            reps = endpoints.replicas(s, eid)
            lost = [w.id for r, w in reps if r.ready_attempt is not None and not endpoints.is_ready(r, w)]
            todo = [(r.workload_id, r.port, w.attempt, r.ready_attempt == w.attempt, w)
                    for r, w in reps if w.state == "running" and w.handle]  # fmt: skip
        mono, changed = time.monotonic(), 0
        for wid in lost:  # a ready replica whose workload ended, is retried or is stopping: said once, with why
            with db.write() as s, s.begin():
                r, w = s.get(EndpointReplica, wid, with_for_update=True), s.get(Workload, wid)
                if r is None or w is None or r.ready_attempt is None or endpoints.is_ready(r, w):
                    continue
                r.ready_attempt = None
                why = w.stop_requested or w.reason
                endpoints.event(s, eid, "replica", f"replica {w.name} not ready: {w.state} ({why})", now)
                changed += 1
        for wid, port, attempt, ready, w in todo:
            if ready and mono - self.checked_at.get(wid, 0.0) < RECHECK_S:
                continue
            addr = listener_of(w, port)
            self.checked_at[wid] = mono
            ok = addr is not None and (ready or probe(addr, port, path))
            if ok == ready:
                continue
            with db.write() as s, s.begin():
                r = s.get(EndpointReplica, wid, with_for_update=True)
                cur = s.get(Workload, wid)
                if r is None or cur is None or cur.attempt != attempt:
                    continue
                if ok:
                    r.ready_attempt, r.ready_at, r.address = attempt, now, addr or "127.0.0.1"
                    took = (now - cur.started_at).total_seconds() if cur.started_at else 0.0
                    endpoints.event(s, eid, "ready", f"replica {cur.name} ready on port {port} after {took:.1f} s",
                                    now)  # fmt: skip
                else:
                    r.ready_attempt = None
                    endpoints.event(s, eid, "replica", f"replica {cur.name}: nothing of its sandbox listens on port "
                                    f"{port} any more; not ready", now)  # fmt: skip
            changed += 1
        return changed

    # ---- autoscaling and replica count --------------------------------------------------------------------
    def _scale(self, db: Database, eid: str, now: datetime) -> int:
        """Decide and reconcile in a write transaction only when something may change: a pass over idle endpoints
        reads and writes nothing (on SQLite every write holds the database's one write lock)."""
        if not self._due(db, eid, now):
            return 0
        with db.write() as s, s.begin():
            e = s.get(Endpoint, eid, with_for_update=True, populate_existing=True)
            if e is None:
                return 0
            spec = endpoints.spec_of(e)
            scaling = spec.scaling()
            fresh = now - timedelta(seconds=LOAD_FRESH_S)
            rows = list(s.scalars(select(EndpointLoad).where(EndpointLoad.endpoint_id == eid)))
            load = sum(r.inflight + r.waiting for r in rows if r.updated_at >= fresh)
            last = max((r.last_request_at for r in rows if r.last_request_at is not None), default=None)
            s.execute(delete(EndpointLoad).where(EndpointLoad.endpoint_id == eid,
                                                 EndpointLoad.updated_at < now - timedelta(seconds=STALE_LOAD_S)))  # fmt: skip
            target = scaling.target
            if load > 0 and -(-load // target) >= e.desired:
                e.busy_at = now
            o = Observed(e.desired, load, _age(now, last), _age(now, e.changed_at), _age(now, e.busy_at))
            d = decide(o, e.min_replicas, e.max_replicas, target, scaling.idle_s)
            if d is not None:
                e.desired, e.changed_at = d.replicas, now
                endpoints.event(s, eid, "scale", d.reason, now)
            return self._reconcile(s, e, spec, now)

    def _due(self, db: Database, eid: str, now: datetime) -> bool:
        with db.read() as s:
            e = s.get(Endpoint, eid)
            if e is None:
                return False
            scaling = endpoints.spec_of(e).scaling()
            rows = list(s.scalars(select(EndpointLoad).where(EndpointLoad.endpoint_id == eid)))
            fresh = now - timedelta(seconds=LOAD_FRESH_S)
            load = sum(r.inflight + r.waiting for r in rows if r.updated_at >= fresh)
            last = max((r.last_request_at for r in rows if r.last_request_at is not None), default=None)
            if load > 0 and -(-load // scaling.target) >= e.desired:
                return True  # busy: record it
            o = Observed(e.desired, load, _age(now, last), _age(now, e.changed_at), _age(now, e.busy_at))
            if decide(o, e.min_replicas, e.max_replicas, scaling.target, scaling.idle_s) is not None:
                return True
            if any(r.updated_at < now - timedelta(seconds=STALE_LOAD_S) for r in rows):
                return True  # a gateway process that went away: its row goes
            live = sum(1 for _, w in endpoints.replicas(s, eid) if w.state in workloads.ACTIVE and not w.stop_requested)
            return live != e.desired

    def _reconcile(self, s, e: Endpoint, spec, now: datetime) -> int:  # type: ignore[no-untyped-def]
        """Submit replicas up to `desired`; stop the extras (not-ready ones first, then the newest)."""
        reps = endpoints.replicas(s, e.id)
        live = [(r, w) for r, w in reps if w.state in workloads.ACTIVE and not w.stop_requested]
        changed = 0
        if len(live) > e.desired:
            live.sort(key=lambda rw: (endpoints.is_ready(*rw), -rw[0].created_at.timestamp()))
            for _, w in live[: len(live) - e.desired]:
                s.refresh(w, with_for_update=True)
                endpoints.stop_replica(s, w, f"endpoint {e.name} scaled to {e.desired} replica(s)", now)
                endpoints.event(s, e.id, "replica", f"stopping replica {w.name}: scaled to {e.desired}", now)
                changed += 1
            return changed
        missing = e.desired - len(live)
        if missing <= 0:
            return 0
        taken = {r.port for r, w in reps if w.state in workloads.ACTIVE}
        used = {w.name for _, w in reps}
        for _ in range(missing):
            # the first index whose name is free; a long endpoint name truncates them all alike (names may repeat)
            index = next((i for i in range(len(used) + 1) if f"{e.name}-r{i}"[:63].rstrip("-") not in used), len(used))
            port = free_port(taken)
            secret = secrets.token_urlsafe(32)  # 43 characters
            _, wspec = endpoints.replica_workload(e, spec, index, port, secret)
            try:
                with s.begin_nested():
                    row = admission.admit(s, endpoints.principal_of(s, e.user_id), wspec, now,  # type: ignore[arg-type]
                                          hold_minutes=self.admitting.hold_minutes, fleet=self.admitting.fleet,
                                          prices=self.admitting.prices, org_id=e.org_id)  # fmt: skip
                    admission.enqueue_many(s, [row])
                    s.add(EndpointReplica(workload_id=row["id"], endpoint_id=e.id, port=port, created_at=now,
                                          secret=secret))  # fmt: skip
            except ServiceError as err:
                mono = time.monotonic()
                if mono - self.refused_at.get(e.id, -REFUSAL_EVERY_S) >= REFUSAL_EVERY_S:
                    self.refused_at[e.id] = mono
                    endpoints.event(s, e.id, "error", f"cannot add a replica: {err.message}", now)
                break
            taken.add(port)
            used.add(row["name"])
            endpoints.event(s, e.id, "replica", f"added replica {row['name']} ({row['id']}) on port {port}", now)
            changed += 1
        return changed


def _age(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())
