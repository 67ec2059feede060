"""Money with real processes on one database (both backends): concurrent charges, two metering workers sharing
the work through leases, and metering workers killed with SIGKILL at random moments.

The workers are `tests/money_worker.py`; the oracle is its `audit`, which recomputes every allocation's bill from
the ledger and compares it with `cost_of(rate, billed seconds)` computed independently.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from suanli.billing.ledger import REVENUE
from suanli.control.accounts import accounts
from suanli.control.ids import utcnow
from suanli.control.money import ledger, metering
from suanli.db.engine import Database
from suanli.db.models import Allocation, LedgerEntry, LedgerTransaction
from tests.money_worker import amount_of, audit, ms

ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def new_org(db: Database, topup: str) -> tuple[str, str]:
    with db.write() as s, s.begin():
        user, org = accounts.create_user(s, "procs@example.com", "password123", T0)
        ledger.move(s, "topup", org.id, topup, "initial", T0)
        return org.id, user.id


class Worker:
    """A `python -m tests.money_worker` process, started at once; `go()` waits until it is connected, then lets
    it run (so many can be started ahead and import in parallel)."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.money_worker", "--wait", *args],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def go(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", f"worker did not start: {line!r} {self.stderr()}"
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()[-3000:]

    def result(self) -> dict[str, Any]:
        out, err = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, err[-3000:]
        return json.loads(out.strip().splitlines()[-1])


class Spawner:
    """`python -m tests.money_worker spawner`: forks metering workers and SIGKILLs them on request."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.money_worker", "spawner"],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self._read() == {"ready": True}

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the spawner died"
        return json.loads(line)

    def ask(self, line: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.communicate(timeout=30)


def usage_count(db: Database) -> int:
    with db.read() as s:
        return int(s.scalar(select(func.count()).where(LedgerTransaction.kind == "usage")) or 0)


def wait_for_charges(db: Database, more_than: int, timeout_s: float) -> None:
    """Until a running worker has posted a charge (the count grows), so that it is killed in the middle of work."""
    deadline = time.monotonic() + timeout_s
    while usage_count(db) <= more_than:
        assert time.monotonic() < deadline, "no worker posted a charge"
        time.sleep(0.02)


def open_allocations(db: Database, org: str, user: str, n: int, rng: random.Random, back_s: float) -> list[str]:
    """`n` running allocations started up to `back_s` ago (ms grid), with rates that do not divide evenly."""
    now = ms(utcnow())
    with db.write() as s, s.begin():
        ids = []
        for i in range(n):
            started = now - timedelta(milliseconds=rng.randint(0, int(back_s * 1000)))
            a = metering.open_allocation(
                s, org_id=org, user_id=user, workload=f"w{i}", gpu_model=None, gpus=0, placement={}, now=started,
                hold_minutes=0,
            )  # fmt: skip
            a.rate_per_hour = Decimal(rng.randint(1, 10**10)) / 10**8
            ids.append(a.id)
        return ids


def test_concurrent_charges_from_two_processes(db: Database, db_url: str) -> None:
    """Both post their own charges and refunds plus the same shared keys (in opposite orders) at once."""
    org, _ = new_org(db, "1000")
    rng = random.Random(7)
    shared = [f"shared{i}" for i in range(40)]
    mine = [[f"p{p}-{i}" for i in range(40)] + [f"refund{p}-{i}" for i in range(15)] for p in (0, 1)]
    plans = []
    for p in (0, 1):
        keys = mine[p] + (shared if p == 0 else shared[::-1])
        rng.shuffle(keys)
        plans.append(keys)
    workers = [Worker("charge", db_url, org, ",".join(keys)) for keys in plans]
    for w in workers:
        w.go()
    results = [w.result() for w in workers]
    created = [set(r["created"]) for r in results]
    assert not created[0] & created[1]  # no key posted by both
    assert created[0] | created[1] == set(shared) | set(mine[0]) | set(mine[1])
    assert sorted(results[0]["existing"] + results[1]["existing"]) == sorted(shared)  # each found the other's
    usage = sum((amount_of(k) for k in shared + mine[0] + mine[1] if not k.startswith("refund")), Decimal(0))
    refunds = sum((amount_of(k) for k in mine[0] + mine[1] if k.startswith("refund")), Decimal(0))
    with db.read() as s:
        assert ledger.recompute(s) == {}
        assert ledger.org_balance(s, org) == Decimal(1000) - usage + refunds
        assert ledger.balance(s, REVENUE) == usage - refunds
        n_tx = s.scalar(select(func.count()).select_from(LedgerTransaction))
        assert n_tx == 1 + len(shared) + len(mine[0]) + len(mine[1])
        assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 2 * n_tx


def test_two_metering_workers_never_do_the_same_work(db: Database, db_url: str) -> None:
    """Two workers on the wall clock over 40 allocations (window 1 s), some closed while they run; leases mean
    neither finds a charge the other already posted, and the final bills are exact."""
    org, user = new_org(db, "100000")
    rng = random.Random(11)
    ids = open_allocations(db, org, user, 40, rng, back_s=20)
    args = ("--window", "1", "--lease", "2", "--batch", "5", "--seconds", "2", "--interval", "0.01")
    workers = [Worker("meter", db_url, owner, *args) for owner in ("worker-a", "worker-b")]
    for w in workers:
        w.go()
    time.sleep(1.0)
    with db.write() as s, s.begin():
        for alloc in ids[::2]:
            metering.close_allocation(s, alloc, ms(utcnow()))
    reports = [w.result() for w in workers]
    with db.write() as s, s.begin():
        for alloc in ids[1::2]:
            metering.close_allocation(s, alloc, ms(utcnow()))
    final = metering.meter(db, "final", utcnow() + timedelta(seconds=5), window_s=1)
    for r in reports:
        assert r["repeated"] == 0, r["owner"]
        assert r["posted"] > 0 and any(r["claimed"]), f"{r['owner']} did no work"
    assert final.repeated == 0 and set(ids[1::2]) <= set(final.claimed)
    with db.read() as s:
        assert audit(s, 1) == []
        assert all(a.settled for a in s.scalars(select(Allocation)))
        n_usage = s.scalar(select(func.count()).where(LedgerTransaction.kind == "usage"))
        assert n_usage == reports[0]["posted"] + reports[1]["posted"] + final.posted


def test_metering_survives_kill_9_at_random_moments(db: Database, db_url: str) -> None:
    """Workers killed with SIGKILL mid-pass (often mid-transaction, while catching up on many charges); the
    next worker takes over when the lease (1 s) expires. No second may be lost or charged twice."""
    org, user = new_org(db, "100000")
    rng = random.Random(13)
    ids = open_allocations(db, org, user, 24, rng, back_s=20)
    args = ("--window", "1", "--lease", "1", "--batch", "4")
    spawner = Spawner()
    try:
        for i in range(12):  # a new worker each time: every other one reuses an owner id, the rest are new
            pid = spawner.ask(f"spawn {db_url} {'same' if i % 2 else f'w{i}'} {' '.join(args)}")["pid"]
            if i % 4 == 3:  # on a slow machine no worker might get past connecting in 0.4 s: some must do work
                wait_for_charges(db, more_than=usage_count(db), timeout_s=30)
            time.sleep(rng.uniform(0.05, 0.4))
            # It must have been running: a worker that died of an error would pass a bug off as a crash.
            assert spawner.ask(f"kill {pid}") == {"alive": True, "signal": signal.SIGKILL, "exit": None}
            with db.read() as s:  # between crashes: every step either fully done or not at all
                assert audit(s, 1) == []
    finally:
        spawner.close()
    assert usage_count(db) > 0  # the killed workers did get work done
    stop = ms(utcnow()) + timedelta(seconds=1)
    stops = {alloc: stop + timedelta(milliseconds=37 * i) for i, alloc in enumerate(ids)}
    with db.write() as s, s.begin():
        for alloc, t in stops.items():
            metering.close_allocation(s, alloc, t)
    final = metering.meter(db, "final", max(stops.values()) + timedelta(seconds=2), window_s=1)
    assert final.repeated == 0  # no crash left a charge posted without its step recorded
    assert sorted(final.claimed) == sorted(ids)  # every lease of a killed worker had expired and was taken
    with db.read() as s:
        assert audit(s, 1) == []
        for a in s.scalars(select(Allocation)):
            assert a.settled and a.stopped_at == stops[a.id] and a.lock_owner is None
