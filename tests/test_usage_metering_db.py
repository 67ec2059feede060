"""Pay by compute used, in the database (SQLite and PostgreSQL): a `billing: usage` job on virtual GPUs, readings
posted for its GPUs as a node agent posts them, and the metering loop's charges equal the documented formula, worked
out here second by second from the readings posted; windows wait for their readings; a crash in the middle of a pass
charges nothing twice; a run lost to a hardware fault costs nothing; compaction keeps the readings still to be
charged."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from suanli.billing.prices import default_price_book
from suanli.control.ids import utcnow
from suanli.control.money import metering, usage
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.control.telemetry import telemetry
from suanli.control.workloads.supervisor import Supervisor
from suanli.db.models import Allocation, LedgerTransaction
from suanli.db.telemetry import GpuSampleRow
from tests.control_plane import Tenant, admin_token, bearer, settings, signup

API = "/api/v1"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SPAN, DELAY, WINDOW = 6, 30, 60  # the defaults: readings every 5 s speak for 6 s; windows charged 30 s after


@dataclass
class Run:
    api: TestClient
    admin: dict[str, str]
    tenant: Tenant
    clock: datetime
    sched: SchedulingPass
    sup: Supervisor

    @property
    def db(self) -> Any:
        return self.api.app.state.server.db  # type: ignore[attr-defined]

    def tick(self, seconds: float = 1.0) -> None:
        self.clock += timedelta(seconds=seconds)
        self.sched.run(self.db, self.clock)
        self.sup.run(self.db, self.clock)

    def alloc(self, allocation_id: str) -> Allocation:
        with self.db.read() as s:
            return s.get_one(Allocation, allocation_id)

    def charges(self, allocation_id: str) -> tuple[Decimal, list[str]]:
        with self.db.read() as s:
            txs = list(s.scalars(select(LedgerTransaction).where(LedgerTransaction.allocation_id == allocation_id,
                                                                 LedgerTransaction.kind == "usage")))  # fmt: skip
            total = sum((e.amount for tx in txs for e in tx.entries if e.amount > 0), Decimal(0))
            return total, sorted(tx.key for tx in txs)

    def meter(self, at: datetime) -> metering.MeterReport:
        return metering.meter(self.db, "test-meter", at, window_s=WINDOW)


@pytest.fixture
def run(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[Run]:
    from suanli.api.app import create_app

    with TestClient(create_app(settings(tmp_path / "home", db_url))) as api:
        admin = bearer(admin_token(api))
        r = api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20"}, headers=admin)
        assert r.status_code == 201, r.text
        tenant = signup(api, "usage@example.com")
        r = api.post(f"{API}/admin/orgs/{tenant.org_id}/transactions", headers=admin,
                     json={"kind": "topup", "amount": "10000", "memo": "test"})  # fmt: skip
        assert r.status_code == 201, r.text
        home = api.app.state.server.settings.home  # type: ignore[attr-defined]
        # Simulated time runs from half an hour ago, so every reading is in the past for the server's clock.
        clock = utcnow().replace(microsecond=0) - timedelta(minutes=30)
        yield Run(api, admin, tenant, clock, SchedulingPass(), Supervisor(home, grace_s=0.0))


def start(run: Run, gpus: int = 2, name: str = "train") -> tuple[str, Allocation]:
    spec = {"name": name, "command": "train", "resources": {"gpu": "H20", "gpus": gpus}, "duration": "2h",
            "billing": "usage"}  # fmt: skip
    r = run.api.post(f"{API}/workloads", json={"spec": spec}, headers=run.tenant.headers)
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    for _ in range(10):
        run.tick()
        w = run.api.get(f"{API}/workloads/{wid}", headers=run.tenant.headers).json()
        if w["state"] == "running":
            return wid, run.alloc(w["allocation"]["id"])
    raise AssertionError(f"not running: {w['state']} {w['reason']}")


def ms(t: datetime) -> int:
    return (t - EPOCH) // timedelta(milliseconds=1)


def gpus_of(a: Allocation) -> list[tuple[str, int]]:
    return [(node, int(i)) for node, idx in sorted(a.placement.items()) for i in idx]


def post(run: Run, a: Allocation, readings: dict[tuple[str, int], list[tuple[int, float, str]]]) -> None:
    """Readings as (ms since the allocation started, util %, error), posted as an agent posts them."""
    start_ms = ms(a.started_at)
    body = [{"node": node, "gpu": gpu, "t": (start_ms + at) / 1000, "util": util, "error": error}
            for (node, gpu), rows in readings.items() for at, util, error in rows]  # fmt: skip
    r = run.api.post(f"{API}/telemetry/samples", json={"samples": body}, headers=run.admin)
    assert r.status_code == 200 and r.json()["stored"] == len(body), r.text


def expected(
    a: Allocation, readings: dict[tuple[str, int], list[tuple[int, float, str]]], seconds: int, until_ms: int | None
) -> tuple[Decimal, int]:
    """(U(S, A), A) by the rule docs/billing.md states, second by second, independently of billing/usage.py."""
    total_a = 0
    for key in gpus_of(a):
        rows = [(at, min(1000, math.floor(util * 10 + 0.5))) for at, util, error in readings.get(key, [])
                if not error and (until_ms is None or at < until_ms)]  # fmt: skip
        for j in range(seconds):
            speaking = [p for at, p in rows if at // 1000 - SPAN < j <= at // 1000]
            total_a += min(speaking) if speaking else 1000
    book = default_price_book()
    full = book.usage_gpu_hour["H20"] * a.gpus
    floor = full * book.usage_floor
    value = (Fraction(floor) * seconds + Fraction(full - floor) * total_a / (1000 * a.gpus)) / 3600
    return Decimal(round(value * 10**8)).scaleb(-8), total_a


def pattern(a: Allocation, upto_s: int) -> dict[tuple[str, int], list[tuple[int, float, str]]]:
    """GPU 0 read every 5 s, busy then idle (an unreadable GPU is a health fault: the fault test covers it); GPU 1
    read for the first 40 s only (from then on: fully active, by the rule)."""
    g0, g1 = gpus_of(a)[:2]
    utils = [97.0, 95.5, 12.25, 0.0, 64.0, 88.8, 3.0]
    first = [(500 + 5000 * k, utils[k % len(utils)], "") for k in range(upto_s // 5)]
    second = [(1700 + 5000 * k, 40.0, "") for k in range(8)]
    return {g0: first, g1: second}


def test_a_usage_job_is_charged_the_formula_of_its_readings_window_by_window_and_to_its_stop(run: Run) -> None:
    wid, a = start(run)
    book = default_price_book()
    assert (a.billing_mode, a.gpus) == ("usage", 2)
    assert a.rate_per_hour == 2 * book.usage_gpu_hour["H20"] and a.floor_rate_per_hour == a.rate_per_hour / 5
    readings = pattern(a, 200)
    post(run, a, readings)
    node = gpus_of(a)[0][0]
    other = next((node, i) for i in range(8) if (node, i) not in gpus_of(a))
    post(run, a, {other: [(2500, 0.0, "")]})  # a GPU it does not hold: not its reading

    run.meter(a.started_at + timedelta(seconds=WINDOW + DELAY - 1))  # window 0 ended 29 s ago: its readings may lag
    assert run.charges(a.id) == (Decimal(0), [])
    run.meter(a.started_at + timedelta(seconds=WINDOW + DELAY))
    want, act = expected(a, readings, WINDOW, None)
    assert run.charges(a.id) == (want, [f"usage:{a.id}:60:0"])
    row = run.alloc(a.id)
    assert (row.metered_until_s, row.activity_permille_s, row.charged) == (WINDOW, act, want)
    assert book.usage_floor_rate("H20", 2) * WINDOW / 3600 < want < a.rate_per_hour * WINDOW / 3600

    run.clock = a.started_at + timedelta(seconds=170.3)
    run.tick(0.1)
    r = run.api.post(f"{API}/workloads/{wid}/stop", headers=run.tenant.headers)
    assert r.status_code == 200, r.text
    for _ in range(5):
        run.tick(0.4)
    row = run.alloc(a.id)
    assert row.stopped_at is not None
    elapsed = (row.stopped_at - row.started_at).total_seconds()
    seconds, stop_ms = math.ceil(elapsed), ms(row.stopped_at) - ms(row.started_at)
    run.meter(row.stopped_at + timedelta(seconds=DELAY - 1))
    assert not run.alloc(a.id).settled
    run.meter(row.stopped_at + timedelta(seconds=DELAY))
    want, act = expected(a, readings, seconds, stop_ms)
    total, keys = run.charges(a.id)
    row = run.alloc(a.id)
    assert row.settled and (total, row.charged, row.activity_permille_s, row.metered_until_s) == (
        want, want, act, seconds)  # fmt: skip
    assert keys == sorted(f"usage:{a.id}:60:{k}" for k in range(math.ceil(seconds / WINDOW)))
    run.meter(row.stopped_at + timedelta(hours=1))  # settled: nothing more, ever
    assert run.charges(a.id)[0] == want
    check = run.api.get(f"{API}/admin/ledger/check", headers=run.admin).json()
    assert check["ok"], check
    usage_rows = run.api.get(f"{API}/orgs/{run.tenant.org_id}/usage", headers=run.tenant.headers).json()
    assert [(u["billing_mode"], Decimal(u["cost"])) for u in usage_rows] == [("usage", want)]
    pct = Decimal(act) / (1000 * a.gpus * seconds) * 100  # the activity its seconds were billed at, as in memos
    assert usage_rows[0]["activity"] == f"{pct.quantize(Decimal('0.1'))}%", usage_rows[0]


def test_no_readings_at_all_is_charged_as_fully_active(run: Run) -> None:
    _, a = start(run, gpus=1, name="dark")
    run.meter(a.started_at + timedelta(seconds=2 * WINDOW + DELAY))
    assert run.charges(a.id)[0] == (a.rate_per_hour * 2 * WINDOW / 3600).quantize(Decimal("0.00000001"))


def test_a_crash_in_the_middle_of_a_pass_charges_nothing_and_the_retry_charges_each_window_once(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, a = start(run)
    readings = pattern(a, 300)
    post(run, a, readings)
    real, calls = usage.ledger.post, []

    def dies_on_the_second_window(*args: Any, **kw: Any) -> Any:
        calls.append(args[1].key)
        if len(calls) == 2:
            raise RuntimeError("kill -9")
        return real(*args, **kw)

    monkeypatch.setattr(usage.ledger, "post", dies_on_the_second_window)
    at = a.started_at + timedelta(seconds=3 * WINDOW + DELAY)
    with pytest.raises(RuntimeError):
        metering.meter(run.db, "test-meter", at, window_s=WINDOW, lease_s=5)
    assert run.charges(a.id) == (Decimal(0), [])  # the transaction that posted window 0 rolled back too
    row = run.alloc(a.id)
    assert (row.metered_until_s, row.activity_permille_s, row.lock_owner) == (0, 0, "test-meter")
    monkeypatch.setattr(usage.ledger, "post", real)
    assert metering.meter(run.db, "other", at, window_s=WINDOW).claimed == []  # leased by the dead worker
    metering.meter(run.db, "other", at + timedelta(seconds=6), window_s=WINDOW)  # its lease expired: taken over
    metering.meter(run.db, "test-meter", at + timedelta(seconds=7), window_s=WINDOW)  # the dead one is back
    want, act = expected(a, readings, 3 * WINDOW, None)
    assert run.charges(a.id) == (want, [f"usage:{a.id}:60:{k}" for k in range(3)])
    assert run.alloc(a.id).activity_permille_s == act


def test_a_run_lost_to_a_hardware_fault_is_credited_all_it_was_charged(run: Run) -> None:
    _, a = start(run)
    post(run, a, pattern(a, 100))
    run.meter(a.started_at + timedelta(seconds=WINDOW + DELAY))
    charged_before = run.charges(a.id)[0]
    assert charged_before > 0
    run.clock = a.started_at + timedelta(seconds=100.25)
    run.tick(0.1)
    node = next(iter(a.placement))
    r = run.api.patch(f"{API}/admin/nodes/{node}", json={"state": "down", "reason": "PSU"}, headers=run.admin)
    assert r.status_code == 200, r.text
    for _ in range(5):
        run.tick(0.4)
    row = run.alloc(a.id)
    assert row.stopped_at is not None and row.settled  # settled at once from the readings it had
    total = run.charges(a.id)[0]
    assert total >= charged_before
    with run.db.read() as s:
        credit = s.scalars(select(LedgerTransaction).where(LedgerTransaction.key == f"fault-credit:{a.id}")).one()
        assert max(e.amount for e in credit.entries) == total  # the attempt cost it nothing
    run.meter(row.stopped_at + timedelta(hours=1))
    assert run.charges(a.id)[0] == total  # and nothing is charged after the credit


def test_compaction_keeps_the_readings_an_unsettled_usage_run_has_yet_to_be_charged_for(run: Run) -> None:
    _, a = start(run)
    post(run, a, pattern(a, 100))
    keep = telemetry.Retention(raw_s=60, late_s=0)
    later = a.started_at + timedelta(hours=3)  # far past raw retention; the metering loop has not run
    with run.db.read() as s:
        needed = usage.oldest_reading_needed_ms(s, later, SPAN)
    assert needed == ms(a.started_at)
    with run.db.write() as s, s.begin():
        telemetry.compact(s, later, keep, keep_raw_from_ms=needed)
    with run.db.read() as s:
        assert s.scalar(select(func.count()).select_from(GpuSampleRow)) == sum(map(len, pattern(a, 100).values()))
    run.meter(later)  # charged up to 3 h - 30 s; still running, so still unsettled
    with run.db.read() as s:
        needed = usage.oldest_reading_needed_ms(s, later, SPAN)
    assert needed is not None and needed > ms(a.started_at) + 3600_000
    with run.db.write() as s, s.begin():
        telemetry.compact(s, later, keep, keep_raw_from_ms=needed)
    with run.db.read() as s:
        assert s.scalar(select(func.count()).select_from(GpuSampleRow)) == 0
    with run.db.read() as s:  # a run that cannot settle keeps readings a day at most
        assert usage.oldest_reading_needed_ms(s, later + timedelta(days=3), SPAN) == ms(
            later + timedelta(days=2))  # fmt: skip
