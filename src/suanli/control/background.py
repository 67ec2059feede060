"""Background loops a server runs in a thread: each pass is a service call over leased rows, so any number
of server processes on one database share the work without doing any of it twice."""

from __future__ import annotations

import logging
import os
import socket
import threading

from suanli.control import leases, metering
from suanli.control.ids import new_id, utcnow
from suanli.control.scheduling import PassReport, SchedulingPass
from suanli.control.settings import Settings
from suanli.control.supervisor import Supervisor, SupervisorReport
from suanli.db.engine import Database
from suanli.sched import SchedulerConfig

log = logging.getLogger("suanli.background")


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{new_id('w')}"


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
                metering.meter(self.db, self.owner, utcnow(), window_s=self.settings.meter_window_s, lease_s=lease)
                self.passes += 1
            except Exception:  # a pass that fails (database restarting) is retried at the next tick
                log.exception("metering pass failed")
            self.stop_event.wait(interval)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=10)


class WorkloadLoop:
    """The scheduling loop and the supervisor, run by one leader at a time (a database lease): a second server
    process on the same database waits, and takes over within `lease_s` when the leader dies."""

    LEASE = "workload-loop"

    def __init__(self, db: Database, settings: Settings, owner: str | None = None) -> None:
        self.db, self.settings = db, settings
        self.owner = owner or worker_id()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, name="suanli-workloads", daemon=True)
        config = SchedulerConfig(policy=settings.policy)
        self.scheduling = SchedulingPass(config, hold_minutes=settings.admission_hold_minutes)
        self.supervisor = Supervisor(settings.home, grace_s=settings.stop_grace_s,
                                     balance_grace_minutes=settings.balance_grace_minutes)  # fmt: skip
        self.passes = 0
        self.leader = False
        self.last: tuple[PassReport, SupervisorReport] | None = None

    def tick(self) -> None:
        now = utcnow()
        lease_s = max(15.0, 10 * self.settings.schedule_interval_s)
        self.leader = leases.acquire(self.db, self.LEASE, self.owner, now, lease_s)
        if not self.leader:
            return
        sched = self.scheduling.run(self.db, now)
        sup = self.supervisor.run(self.db, utcnow())
        self.last = (sched, sup)
        self.passes += 1

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
