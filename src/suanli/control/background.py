"""Background loops a server runs in a thread: each pass is a service call over leased rows, so any number
of server processes on one database share the work without doing any of it twice."""

from __future__ import annotations

import logging
import os
import socket
import threading

from suanli.control import metering
from suanli.control.ids import new_id, utcnow
from suanli.control.settings import Settings
from suanli.db.engine import Database

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
