"""Background loops: each pass is a service call over leased rows, so any number of server processes on one
database share the work without doing any of it twice.

A server runs its loops in a child process of its own (`BackgroundProcess`), not in threads beside the request
handlers: under load, request threads would hold the GIL and stretch a scheduling pass from a fraction of a
second to many seconds, and the loops could not use a second core. The child dies with its server (parent-death
signal on Linux, and a parent check every pass), so a server killed with SIGKILL leaves no loop behind."""

from __future__ import annotations

import bisect
import logging
import os
import socket
import threading
import time
from datetime import datetime
from typing import Any

from suanli.control import leases
from suanli.control.caches import FleetCache, PriceCache
from suanli.control.children import WatchedProcess
from suanli.control.ids import new_id, utcnow
from suanli.control.money import metering, usage
from suanli.control.scheduling import engines
from suanli.control.scheduling.scheduling import PassReport, SchedulingPass
from suanli.control.scheduling.waste import LiveWaste
from suanli.control.serving import endpoints
from suanli.control.serving.serving import ServingPass
from suanli.control.settings import Settings
from suanli.control.storage import storage, volume_billing, volume_files
from suanli.control.telemetry.telemetry_loop import TelemetryLoop
from suanli.control.workloads.sandboxes import sandbox_policy
from suanli.control.workloads.supervisor import Supervisor, SupervisorReport
from suanli.db.engine import Database
from suanli.sched import configured

log = logging.getLogger("suanli.background")
STORAGE_SWEEP_S = 60.0  # seconds between storage sweeps
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # seconds, for /metrics


def worker_id(server_pid: int | None = None) -> str:
    """`host:server-pid/pid:random`: says which server process (and which of its children) holds a lease."""
    return f"{socket.gethostname()}:{server_pid or os.getpid()}/{os.getpid()}:{new_id('w')}"


def owned_by_server(owner: str | None, server_pid: int) -> bool:
    return owner is not None and owner.startswith(f"{socket.gethostname()}:{server_pid}/")


def this_server(owner: str | None) -> bool:
    """Whether a lease holder's loops belong to the server this process serves: its own background process,
    or, for a worker of `suanli server --workers N`, the one its parent runs for all workers."""
    return owned_by_server(owner, os.getpid()) or owned_by_server(owner, os.getppid())


class MeteringLoop:
    def __init__(self, db: Database, settings: Settings, owner: str | None = None) -> None:
        self.db, self.settings = db, settings
        self.owner = owner or worker_id()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, name="suanli-metering", daemon=True)
        self.passes = 0

    def run(self) -> None:
        interval = self.settings.meter_interval_s
        lease = max(30.0, 6 * interval)
        while not self.stop_event.is_set():
            try:
                metering.meter(self.db, self.owner, utcnow(), window_s=self.settings.meter_window_s, lease_s=lease,
                               usage_policy=usage.policy_of(self.settings))  # fmt: skip
                self.passes += 1
            except Exception:  # a pass that fails (database restarting) is retried at the next tick
                log.exception("metering pass failed")
            self.stop_event.wait(interval)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=10)


class StorageLoop:
    """Every `STORAGE_SWEEP_S`, by one server process at a time (a lease): expire unused uploads, count the
    workdirs of jobs that ended, remove those whose retention is over (`control.storage.storage.sweep`), and charge
    volumes their whole hours (`control.storage.volume_billing`). Its own thread:
    removing a large tree must not hold up a scheduling pass."""

    LEASE = "storage-sweep"

    def __init__(self, db: Database, settings: Settings, owner: str | None = None) -> None:
        self.db, self.store = db, storage.Store.of(settings)
        self.grace_minutes = settings.balance_grace_minutes
        self.volumes_root = settings.volumes_root
        self.volumes_s3 = settings.volume_s3()
        self.owner = owner or worker_id()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, name="suanli-storage", daemon=True)
        self.passes = 0

    def tick(self) -> storage.Swept | None:
        now = utcnow()
        if not leases.acquire(self.db, self.LEASE, self.owner, now, 4 * STORAGE_SWEEP_S):
            return None
        swept = storage.sweep(self.db, self.store, now)
        for step in (lambda: volume_files.measure_mounted(self.db, self.volumes_root, now, home=self.store.home),
                     lambda: volume_files.push_idle(self.db, self.volumes_root, self.volumes_s3),
                     lambda: volume_files.expire_partial(self.volumes_root)):  # fmt: skip
            try:  # each on its own: billing never waits on a step before it
                step()
            except Exception:
                log.exception("storage sweep: a volume step failed")
        billed = volume_billing.meter(self.db, now, self.grace_minutes)
        if billed.read_only or billed.writable:
            log.info("volumes: %s", billed)
        self.passes += 1
        if swept.expired or swept.removed or swept.orphans:
            log.info("storage: %s", swept)
        return swept

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("storage sweep failed")
            self.stop_event.wait(STORAGE_SWEEP_S)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)


class WorkloadLoop:
    """The scheduling loop and the supervisor, run by one leader at a time (a database lease): a second server
    process on the same database waits, and takes over within `lease_s` when the leader dies."""

    LEASE = leases.WORKLOAD_LOOP

    def __init__(self, db: Database, settings: Settings, owner: str | None = None) -> None:
        self.db, self.settings = db, settings
        self.owner = owner or worker_id()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, name="suanli-workloads", daemon=True)
        config = configured(settings.policy)
        self.scheduling = SchedulingPass(config, hold_minutes=settings.admission_hold_minutes)
        self.supervisor = Supervisor(settings.home, grace_s=settings.stop_grace_s,
                                     balance_grace_minutes=settings.balance_grace_minutes,
                                     interval_s=settings.schedule_interval_s,
                                     sandboxes=sandbox_policy(settings),
                                     volumes_root=settings.volumes_root,
                                     volumes_s3=settings.volume_s3())  # fmt: skip
        self.serving = ServingPass(endpoints.Admitting(settings.admission_hold_minutes, FleetCache(), PriceCache()))
        found = engines.configured(settings)
        self.supervisor.executors.update({e.kind: e.executor for e in found})
        self.engines = engines.EngineSync(found, settings.engine_fabric, settings.engine_nics, settings.engine_sync_s)
        self.passes = 0
        self.leader = False
        self.last: tuple[PassReport, SupervisorReport] | None = None
        self.live = LiveWaste()
        self.waste_gpu_s = self.queued_gpu_s = 0.0  # counters since this process became the leader
        self.pass_counts = [0] * (len(PASS_BUCKETS) + 1)  # histogram of pass seconds; the last: +Inf
        self.pass_sum = 0.0
        self._last_tick: datetime | None = None

    def tick(self) -> None:
        now = utcnow()
        lease_s = max(15.0, 10 * self.settings.schedule_interval_s)
        self.leader = leases.acquire(self.db, self.LEASE, self.owner, now, lease_s, self.info())
        if not self.leader:
            self._last_tick, self.live = None, LiveWaste()  # time as a follower is not this leader's to count
            return
        self.engines.tick(self.db, now, time.monotonic())  # nodes that joined or died, before placing on them
        try:
            sched = self.scheduling.run(self.db, now)
        except Exception:  # whatever broke placing, running work is still supervised: stopped, timed out, ended
            log.exception("scheduling pass failed; supervising the running work regardless")
            sched = PassReport()
        sup = self.supervisor.run(self.db, utcnow())
        self.serving.run(self.db, utcnow())  # endpoints: replicas probed, autoscaled, kept at their count
        if sup.requeued:  # work was lost, maybe with its node: learn which nodes are gone before placing it again
            self.engines.kick()
        self.last = (sched, sup)
        self.passes += 1
        self._account(sched, now)

    def _account(self, sched: PassReport, now: datetime) -> None:
        """Integrate waste over time (a skipped pass means nothing changed: the last figures still hold)."""
        if sched.live is not None:
            self.live = sched.live
        dt = (now - self._last_tick).total_seconds() if self._last_tick is not None else 0.0
        self._last_tick = now
        if self.live.queued_by_class and dt > 0:
            self.waste_gpu_s += self.live.idle * dt
            self.queued_gpu_s += self.live.gpus * dt
        self.pass_counts[bisect.bisect_left(PASS_BUCKETS, sched.total_s)] += 1
        self.pass_sum += sched.total_s

    def info(self) -> dict[str, Any]:
        """What the leader reports with its lease (the operator's summary shows it): its last pass."""
        out: dict[str, Any] = {"passes": self.passes}
        if self.last is not None:
            sched, sup = self.last
            out.update(queued=sched.queued, placed=sched.placed, refused=sched.refused, cycle_ms=sched.cycle_s * 1000,
                       pass_ms=sched.total_s * 1000, launched=sup.launched, finished=sup.finished)  # fmt: skip
        live = self.live
        out.update(gpus=live.gpus, idle=live.idle, fragmented=live.fragmented, queued_by_class=dict(live.queued_by_class),
                   waste_gpu_s=self.waste_gpu_s, queued_gpu_s=self.queued_gpu_s, pass_buckets=list(PASS_BUCKETS),
                   pass_counts=list(self.pass_counts), pass_sum=self.pass_sum)  # fmt: skip
        return out

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("workload pass failed")
            self.stop_event.wait(self.settings.schedule_interval_s)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)
        if self.leader:
            try:
                leases.release(self.db, self.LEASE, self.owner)
            except Exception:
                log.exception("releasing the workload lease failed")


class BackgroundProcess(WatchedProcess):
    """The metering, workload, telemetry and storage loops in a child process of the server (see the module docstring),
    started again if it ever exits on its own: without it nothing is scheduled, metered or watched."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(run_background, settings.model_dump_json(), "suanli-background")


def _die_with_parent() -> None:
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM when the server process dies
    except (OSError, AttributeError):  # not Linux: the parent check in the loop below still ends it
        pass


def run_background(settings_json: str, server_pid: int) -> None:
    """The child's main: both loops until SIGTERM, or until the server process is gone."""
    import signal

    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings.model_validate_json(settings_json)
    db = Database(settings.db_url)
    # The handler only appends (no lock): one that set a threading.Event deadlocked when a second SIGTERM came
    # while the first handler held the event's lock (or one came while this thread held it in `wait`), and the loops
    # then ran on, leading, as an orphan of a killed server.
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the server, which stops us in order
    metering_loop = MeteringLoop(db, settings, worker_id(server_pid))
    workload_loop = WorkloadLoop(db, settings, worker_id(server_pid))
    telemetry_loop = TelemetryLoop(db, settings, worker_id(server_pid))
    storage_loop = StorageLoop(db, settings, worker_id(server_pid))
    metering_loop.start()
    workload_loop.start()
    telemetry_loop.start()
    storage_loop.start()
    while not stopping and os.getppid() == server_pid:
        time.sleep(0.2)
    storage_loop.stop()
    telemetry_loop.stop()
    workload_loop.stop()
    metering_loop.stop()
    db.dispose()
