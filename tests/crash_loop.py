"""The crash loop: a real `suanli server` killed with SIGKILL while jobs run (local processes and virtual gangs)
and API submissions arrive, restarted on the same data directory and database, again and again; then left to
finish. What must hold (`tests/crash_checks.py`) is checked from the database after every crash, after every
restart and at the end.

`tests/test_crash_loop.py` runs a few cycles per database; `benchmarks/chaos.py` runs many and prints the table.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

from tests.control_plane import LiveServer, admin_token, bearer, live_server, signup, spawned
from tests.crash_checks import TERMINAL, WINDOW_S, Invariants, Submission, check, launching, snapshot

ENV = {"SUANLI_SCHEDULE_INTERVAL_S": "0.2", "SUANLI_METER_INTERVAL_S": "0.5", "SUANLI_METER_WINDOW_S": str(WINDOW_S),
       "SUANLI_STOP_GRACE_S": "1"}  # fmt: skip
LOCAL_JOB = 'echo "$SUANLI_ATTEMPT" >> launches; sleep {sleep}; exit {code}'


# ---- traffic --------------------------------------------------------------------------------------------------
class Traffic:
    """Threads submitting jobs (virtual GPU gangs; local CPU jobs, some of which fail; some retried after a
    node failure) and stopping some of their own, until `stop()`. Every submission is recorded with its answer,
    or with none when the server died under it."""

    def __init__(self, url: str, tenants: list[dict[str, str]], prefix: str, rng: random.Random, threads: int = 2):
        self.url, self.tenants, self.prefix = url, tenants, prefix
        self.subs: list[Submission] = []
        self.stops: list[int] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(random.Random(rng.random()), i), daemon=True)
                         for i in range(threads)]  # fmt: skip
        for t in self._threads:
            t.start()

    def _spec(self, rng: random.Random, name: str, local: bool) -> dict[str, Any]:
        retry = {"on": ["node-failure"], "limit": 2} if rng.random() < 0.3 else {"limit": 0}
        if local:
            cmd = LOCAL_JOB.format(sleep=round(rng.uniform(0.3, 4), 2), code=rng.choice([0, 0, 0, 3]))
            return {"name": name, "command": cmd, "resources": {"gpus": 0}, "retry": retry}
        gpus = rng.choice([1, 1, 2, 4, 8, 8, 16])
        return {"name": name, "command": "train", "duration": round(rng.uniform(0.5, 8), 2), "retry": retry,
                "resources": {"gpu": "H20", "gpus": gpus, "topology": "leaf" if gpus > 8 else "any"}}  # fmt: skip

    def _run(self, rng: random.Random, k: int) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as c:
            n = 0
            while not self._halt.is_set():
                n += 1
                tenant = rng.randrange(len(self.tenants))
                headers = self.tenants[tenant]
                mine = [x for x in self.subs if x.tenant == tenant and x.id]
                try:
                    if mine and rng.random() < 0.1:
                        self._stop(c, headers, rng.choice(mine))
                    else:
                        self._submit(c, rng, tenant, f"{self.prefix}-{k}-{n}")
                except httpx.HTTPError:
                    pass  # the server died under the request: recorded without an answer
                self._halt.wait(rng.uniform(0.02, 0.12))

    def _submit(self, c: httpx.Client, rng: random.Random, tenant: int, name: str) -> None:
        local = rng.random() < 0.2
        sub = Submission(name, tenant, local)
        with self._lock:
            self.subs.append(sub)
        r = c.post("/api/v1/workloads", json={"spec": self._spec(rng, name, local)}, headers=self.tenants[tenant])
        sub.status = r.status_code
        if r.status_code == 201:
            sub.id = r.json()["id"]

    def _stop(self, c: httpx.Client, headers: dict[str, str], sub: Submission) -> None:
        self.stops.append(c.post(f"/api/v1/workloads/{sub.id}/stop", headers=headers).status_code)

    def stop(self) -> None:
        self._halt.set()
        for t in self._threads:
            t.join(30)


# ---- the loop -------------------------------------------------------------------------------------------------
def crash(srv: LiveServer, hard: bool) -> None:
    """SIGKILL the server. `hard`: its loop process too, at the same moment (as a host crash would: the loop's
    leases are left to run out); otherwise the loop process gets its parent-death signal and stops in order. The
    workloads' own supervisors, in sessions of their own, live on either way."""
    victims = [*(spawned(srv.proc.pid) if hard else []), srv.proc.pid]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    srv.proc.wait()


@dataclass
class Cycle:
    cycle: int
    kill: str
    submitted: int
    answered: int
    unanswered: int
    in_flight: int  # workloads scheduled, starting or running when the server died
    after_crash: Invariants
    start_s: float  # until the restarted server answered
    seconds: float  # the whole cycle
    after_restart: Invariants | None = None


class CrashLoop:
    """One data directory and database; `cycle()` runs one restart-traffic-kill round; `finish()` restarts, waits
    until everything ended and was billed, and checks the lot."""

    def __init__(self, home: Path, db_url: str, seed: int = 0) -> None:
        from suanli.db.engine import Database

        self.home, self.db_url, self.rng = home, db_url, random.Random(seed)
        self.db = Database(db_url)
        self.tenants: list[dict[str, str]] = []
        self.admin: dict[str, str] = {}
        self.subs: list[Submission] = []
        self.stops: list[int] = []
        self.cycles: list[Cycle] = []
        self.logs: list[Path] = []

    def _setup(self, srv: LiveServer) -> None:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            self.admin = admin = bearer(admin_token(c))
            for body in ({"preset": "h20-roce800-128"}, {"local": True, "name": "this-host"}):
                r = c.post("/api/v1/admin/clusters", json=body, headers=admin)
                assert r.status_code == 201, r.text
            for i in range(2):
                t = signup(c, f"crash{i}@example.com")
                r = c.post(f"/api/v1/admin/orgs/{t.org_id}/transactions", json={"amount": "100000"}, headers=admin)
                assert r.status_code == 201, r.text
                self.tenants.append(t.headers)

    def cycle(self, hard: bool, answers: int = 10, then_s: tuple[float, float] = (0.5, 2.5)) -> Cycle:
        """Start the server, check, send traffic until `answers` submissions were answered, this server's loop leads
        and work is placed, then for a random while (`then_s`); kill it mid-stream, check what the crash left."""
        n = len(self.cycles) + 1
        t0 = time.monotonic()
        with live_server(self.home, self.db_url, env=ENV) as srv:
            start_s = time.monotonic() - t0
            self.logs.append(srv.log)
            if not self.tenants:
                self._setup(srv)
            after_restart = self.check() if self.cycles else None
            traffic = Traffic(srv.url, self.tenants, f"c{n}", self.rng)
            deadline = time.monotonic() + 120
            while sum(1 for x in traffic.subs if x.status is not None) < answers and time.monotonic() < deadline:
                time.sleep(0.05)
            deadline = time.monotonic() + 40  # (after a hard kill the loop waits for the dead one's lease: 15 s)
            while not (self._leading(srv) and self._in_flight()) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(self.rng.uniform(*then_s))
            crash(srv, hard)
            traffic.stop()
        if self.cycles:
            self.cycles[-1].after_restart = after_restart
        self.subs += traffic.subs
        self.stops += traffic.stops
        in_flight = self._in_flight()
        answered = sum(1 for x in traffic.subs if x.status is not None)
        c = Cycle(n, "server+loop" if hard else "server", len(traffic.subs), answered, len(traffic.subs) - answered,
                  in_flight, self.check(), start_s, time.monotonic() - t0)  # fmt: skip
        self.cycles.append(c)
        return c

    def _leading(self, srv: LiveServer) -> bool:
        """Whether this server's loop process leads the scheduling loop (so the kill hits a working loop)."""
        r = httpx.get(f"{srv.url}/api/v1/admin/workloads/summary", headers=self.admin, timeout=30)
        return r.status_code == 200 and bool(r.json()["loop"]["this_process"])

    def _in_flight(self) -> int:
        """Workloads placed and not ended (scheduled, starting or running)."""
        from suanli.db.models import Workload

        with snapshot(self.db) as s:
            q = select(func.count()).where(Workload.state.in_(("scheduled", "starting", "running")))
            return int(s.scalar(q) or 0)

    def check(self, final: bool = False, wait_launches: bool = True) -> Invariants:
        inv = check(self.db, self.home, self.subs, final=final, wait_launches=wait_launches)
        inv.server_errors += sum(1 for s in self.stops if s >= 500)
        return inv

    def finish(self, timeout_s: float = 240.0, wait_launches: bool = True) -> Invariants:
        """Restart, check, let every workload end and every allocation settle, check again (final).
        `wait_launches=False`: not for workloads a crash left `starting` with no handle (see `crash_checks`)."""
        from suanli.db.models import Allocation, Workload

        with live_server(self.home, self.db_url, env=ENV) as srv:
            self.logs.append(srv.log)
            if self.cycles:
                self.cycles[-1].after_restart = self.check()
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                with snapshot(self.db) as s:
                    unended = list(s.scalars(select(Workload).where(Workload.state.not_in(TERMINAL))))
                    unsettled = set(s.scalars(select(Allocation.id).where(Allocation.settled.is_(False))))
                grace = [w for w in unended if not wait_launches and launching(w)]
                if len(unended) == len(grace) and unsettled <= {w.allocation_id for w in grace}:
                    break
                time.sleep(0.5)
            final = self.check(final=True, wait_launches=wait_launches)
        return final

    def server_tracebacks(self) -> int:
        return sum(p.read_text(errors="replace").count("Traceback") for p in self.logs if p.exists())

    def close(self) -> None:
        self.db.dispose()


def table(cycles: list[Cycle], final: Invariants) -> str:
    """The invariants per cycle (what the crash left, then what the restart made of it) and at the end, as
    markdown."""
    cols = ("lost", "duplicated", "gpu_held_twice", "unbalanced", "balance_mismatch", "misbilled", "refused",
            "server_errors")  # fmt: skip
    head = ["cycle", "kill -9 of", "submitted (unanswered)", "in flight", *cols, "billed past end (issue #4)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cells(inv: Invariants) -> list[str]:
        return [str(getattr(inv, k)) for k in cols] + [f"{inv.past_end} ({inv.past_end_s} s)"]

    for c in cycles:
        # (each check counts what is wrong in the whole database then: a cycle shows the worse of its two)
        merged = Invariants(**{k: max(getattr(c.after_crash, k), getattr(c.after_restart or Invariants(), k))
                               for k in Invariants().counts()})  # fmt: skip
        rows.append("| " + " | ".join([str(c.cycle), c.kill, f"{c.submitted} ({c.unanswered})", str(c.in_flight),
                                       *cells(merged)]) + " |")  # fmt: skip
    total = f"{sum(c.submitted for c in cycles)} ({sum(c.unanswered for c in cycles)})"
    left = f"{final.unfinished} unfinished" + (f", {final.launching} launching" if final.launching else "")
    rows.append("| " + " | ".join(["end", "", total, left, *cells(final)]) + " |")
    return "\n".join(rows)
