"""Metering in the database: every second charged exactly once, holds and quotas at admission, leases, statements.

Times are explicit UTC datetimes on a millisecond grid, so the expected bill (`cost_of(rate, round(elapsed))`) is
computed here with integer arithmetic, independently of the code under test.
"""

from __future__ import annotations

import csv
import io
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.billing.metering import cost_of
from suanli.billing.money import ZERO
from suanli.control.accounts import accounts
from suanli.control.errors import Conflict, PaymentRequired
from suanli.control.ids import new_id
from suanli.control.money import ledger, metering, usage_statement
from suanli.control.scheduling import inventory
from suanli.db.engine import Database
from suanli.db.models import Allocation, LedgerTransaction, Membership, Org
from tests.money_worker import audit, usage_by_allocation

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOLD = 10


@pytest.fixture
def tenant(db: Database) -> tuple[str, str]:
    """(org id, user id) of a fresh user's personal org."""
    with db.write() as s, s.begin():
        user, org = accounts.create_user(s, "meter@example.com", "password123", T0)
        return org.id, user.id


def at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def open_alloc(db: Database, tenant: tuple[str, str], start: datetime, rate: Decimal, **kw: object) -> str:
    """An allocation of `rate` per hour (set directly: the rate is the input here, not the price book)."""
    with db.write() as s, s.begin():
        a = metering.open_allocation(
            s, org_id=tenant[0], user_id=tenant[1], workload=str(kw.get("workload", "job")), gpu_model=None, gpus=0,
            placement={}, now=start, hold_minutes=0,
        )  # fmt: skip
        a.rate_per_hour = rate
        if "user" in kw:
            a.user_id = str(kw["user"])
        return a.id


def charged(db: Database, alloc: str) -> tuple[Decimal, int, Allocation]:
    """(ledger total for the allocation, number of charge transactions, the row)."""
    with db.read() as s:
        total, keys = usage_by_allocation(s).get(alloc, (ZERO, []))
        return total, len(keys), s.get_one(Allocation, alloc)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    start=st.integers(0, 10**9),
    duration=st.integers(0, 60_000),
    rate=st.one_of(st.just(ZERO), st.decimals(Decimal("0.00000001"), Decimal("99"), places=8)),
    window=st.sampled_from([1, 7, 60]),
    calls=st.lists(st.tuples(st.floats(-0.05, 1.0), st.booleans()), max_size=6),
    after=st.lists(st.integers(-200_000, 200_000), min_size=1, max_size=3),
)
def test_every_second_is_charged_exactly_once(
    db: Database,
    tenant: tuple[str, str],
    start: int,
    duration: int,
    rate: Decimal,
    window: int,
    calls: list[tuple[float, bool]],
    after: list[int],
) -> None:
    """Meter passes at random times (unordered, some repeated at once) while live, then after the stop."""
    with db.write() as s, s.begin():  # an org in debt is refused new work, even with no hold asked
        ledger.move(s, "topup", tenant[0], "10", new_id("top"), T0)
    alloc = open_alloc(db, tenant, at(start), rate)
    furthest = 0
    for fraction, twice in calls:
        t = start + int(fraction * duration)
        for _ in range(2 if twice else 1):
            metering.meter(db, "w", at(t), window_s=window)
        furthest = max(furthest, (t - start) // 1000)
        total, n, row = charged(db, alloc)
        whole = furthest - furthest % window  # live: whole windows only
        assert row.metered_until_s == whole and not row.settled
        assert total == row.charged == cost_of(rate, whole)
        due = [k for k in range(whole // window) if cost_of(rate, (k + 1) * window) != cost_of(rate, k * window)]
        assert n == len(due)  # one charge per window that costs anything: none at a zero rate
    with db.write() as s, s.begin():
        metering.close_allocation(s, alloc, at(start + duration))
    billed = 0 if duration == 0 else max(1, (duration + 500) // 1000)  # to the nearest second, at least one
    for k, offset in enumerate(after):  # the first pass after the stop settles, whatever its clock says
        report = metering.meter(db, "w", at(start + duration + offset), window_s=window)
        assert report.claimed == ([alloc] if k == 0 else []) and (k == 0 or report.posted == 0)
        total, n, row = charged(db, alloc)
        assert row.settled and row.stopped_at == at(start + duration) and row.metered_until_s == billed
        assert total == row.charged == cost_of(rate, billed)
        assert n > 0 or total == ZERO
    with db.read() as s:
        assert audit(s, window, [alloc]) == []


def test_a_stop_recorded_behind_the_meter_is_billed_to_its_end_and_the_excess_given_back(
    db: Database, tenant: tuple[str, str]
) -> None:
    """The end of a run learned after metering charged past it (the server was down when it ended, or a pass's
    clock read later than the stop): the stop stays where the run ended, and settling gives back the seconds
    charged beyond it in one credit whose memo names them, so the net bill is the run to its true end."""
    rate = Decimal("36")
    alloc = open_alloc(db, tenant, at(0), rate, workload="late")
    metering.meter(db, "w", at(10_500), window_s=1)
    assert charged(db, alloc)[0] == cost_of(rate, 10)
    with db.write() as s, s.begin():
        metering.close_allocation(s, alloc, at(4_200))
    report = metering.meter(db, "w", at(11_000), window_s=1)
    assert report.credited == cost_of(rate, 10) - cost_of(rate, 4)
    metering.meter(db, "w", at(12_000), window_s=1)  # settled: nothing more, no second credit
    total, _, row = charged(db, alloc)
    assert row.stopped_at == at(4_200) and row.metered_until_s == 4 and row.settled
    assert total == row.charged == cost_of(rate, 4)
    with db.read() as s:
        (credit,) = s.scalars(select(LedgerTransaction).where(LedgerTransaction.kind == "refund"))
        assert credit.key == f"usage-credit:{alloc}:4" and credit.allocation_id == alloc  # one per correction
        assert credit.memo == "late: ran 4 s, 10 s were charged before its end was known: 6 s given back"
        assert ledger.net_for_org(credit, tenant[0]) == cost_of(rate, 6)
        assert ledger.org_balance(s, tenant[0]) == -cost_of(rate, 4)
        assert audit(s, 1) == []


def test_a_stop_moved_back_after_settling_gives_the_excess_back_at_once(db: Database, tenant: tuple[str, str]) -> None:
    """A run found to have ended before the resize that closed its allocation (already settled): the stop moves back
    to its end and what it paid beyond that is credited in the same transaction; earlier or repeated news is a no-op."""
    rate = Decimal("36")
    alloc = open_alloc(db, tenant, at(0), rate, workload="early")
    with db.write() as s, s.begin():
        metering.close_allocation(s, alloc, at(10_000))
    metering.meter(db, "w", at(11_000), window_s=60)
    for _ in range(2):
        with db.write() as s, s.begin():
            metering.stop_earlier(s, alloc, at(4_200), at(12_000))
    total, _, row = charged(db, alloc)
    assert row.settled and row.stopped_at == at(4_200) and row.metered_until_s == 4
    assert total == row.charged == cost_of(rate, 4)
    with db.read() as s:
        (credit,) = s.scalars(select(LedgerTransaction).where(LedgerTransaction.kind == "refund"))
        assert credit.memo == "early: ran 4 s, 10 s were charged before its end was known: 6 s given back"
        assert audit(s, 60) == []


def test_changing_the_window_between_passes_charges_no_second_twice(db: Database, tenant: tuple[str, str]) -> None:
    """The operator changes `meter_window_s` between restarts (60 -> 7 -> 60 -> 7): charging resumes at the
    second already paid, not at the start of the new window that contains it."""
    rate = Decimal("1.23456789")
    alloc = open_alloc(db, tenant, at(0), rate)
    for t, window, paid in [(90_000, 60, 60), (100_000, 7, 98), (130_000, 60, 120), (135_000, 7, 133)]:
        metering.meter(db, "w", at(t), window_s=window)
        total, _, row = charged(db, alloc)
        assert (row.metered_until_s, total, row.charged) == (paid, cost_of(rate, paid), cost_of(rate, paid))
    with db.write() as s, s.begin():
        metering.close_allocation(s, alloc, at(135_500))
    metering.meter(db, "w", at(140_000), window_s=60)
    total, _, row = charged(db, alloc)
    assert row.settled and (row.metered_until_s, total) == (136, cost_of(rate, 136))
    with db.read() as s:
        assert ledger.recompute(s) == {}


def test_admission_hold_covers_all_open_work_and_the_quota(db: Database, tenant: tuple[str, str]) -> None:
    org, user = tenant

    def admit(gpus: int = 1, hold: int = HOLD) -> str:
        with db.write() as s, s.begin():
            return metering.open_allocation(
                s, org_id=org, user_id=user, workload="w", gpu_model="H100-SXM", gpus=gpus, placement={},
                now=T0, hold_minutes=hold,
            ).id  # fmt: skip

    with pytest.raises(PaymentRequired) as e:  # 22.00/h for 10 minutes: 3.67 needed, 0.00 held
        admit()
    assert "0.00" in e.value.message and "22.00/h" in e.value.message and "3.67" in e.value.message
    assert admit(hold=0)  # no hold asked: admitted on an empty balance
    with db.write() as s, s.begin():
        ledger.move(s, "topup", org, "7.34", "top", T0)
    first = admit()  # 2 x 22.00/h running -> 7.33 needed
    with pytest.raises(PaymentRequired) as e:  # a third: 66.00/h -> 11.00 needed
        admit()
    assert "66.00/h" in e.value.message and "11.00" in e.value.message and "7.34" in e.value.message
    with db.write() as s, s.begin():
        metering.close_allocation(s, first, T0)
    admit()  # closing one frees its hold
    with db.write() as s, s.begin():
        s.get_one(Org, org).quota_gpus = 3
    with pytest.raises(Conflict, match="quota"):  # 2 running, asks 2 more
        admit(gpus=2, hold=0)
    assert admit(gpus=1, hold=0)
    with db.read() as s:
        assert metering.open_rates(s, org) == Decimal("66")
        assert s.scalar(select(LedgerTransaction.key).where(LedgerTransaction.kind == "usage")) is None


def test_two_admissions_racing_for_one_hold_admit_one(db: Database, tenant: tuple[str, str]) -> None:
    """The balance covers one 10-minute hold (3.67 of 4), not two: B asks while A's admission is uncommitted."""
    org, user = tenant
    with db.write() as s, s.begin():
        ledger.move(s, "topup", org, "4", "top", T0)
        inventory.bump_version(s)  # the version row exists, as on any running server
    outcome: dict[str, Any] = {}

    def admit(s: Any) -> None:
        metering.open_allocation(
            s, org_id=org, user_id=user, workload="w", gpu_model="H100-SXM", gpus=1, placement={}, now=T0,
            hold_minutes=HOLD,
        )  # fmt: skip

    def b() -> None:
        try:
            with db.write() as s, s.begin():
                admit(s)
            outcome["admitted"] = True
        except PaymentRequired as e:
            outcome["refused"] = e.message

    with db.write() as s, s.begin():
        admit(s)
        racer = threading.Thread(target=b)
        racer.start()
        racer.join(0.5)  # B now waits for A's lock on the org (or has not started: the same outcome)
    racer.join(30)
    assert "44.00/h" in outcome.get("refused", "")
    with db.read() as s:
        assert metering.open_rates(s, org) == Decimal("22")


def test_leases_skip_live_owners_and_take_over_expired_ones(db: Database, tenant: tuple[str, str]) -> None:
    alloc = open_alloc(db, tenant, at(0), Decimal("3600"))
    with db.write() as s, s.begin():
        assert metering.claim(s, "A", at(1_000), lease_s=60, limit=10) == [alloc]
    with db.write() as s, s.begin():
        assert metering.claim(s, "B", at(30_000), lease_s=60, limit=10) == []  # A's lease is live
    assert metering.meter(db, "B", at(30_000), window_s=1).claimed == []
    with db.write() as s, s.begin():
        assert metering.claim(s, "B", at(61_001), lease_s=60, limit=10) == [alloc]  # A's lease expired
    stale = metering.MeterReport()
    with db.write() as s, s.begin():
        metering.meter_allocation(s, alloc, "A", at(61_001), 1, stale)  # A comes back: it lost the lease
    assert (stale.posted, stale.repeated, charged(db, alloc)[1]) == (0, 0, 0)
    fresh = metering.MeterReport()
    with db.write() as s, s.begin():
        metering.meter_allocation(s, alloc, "B", at(61_001), 1, fresh)
    total, n, row = charged(db, alloc)
    assert (fresh.posted, n, total, row.lock_owner) == (61, 61, Decimal("61"), None)


def test_a_takeover_while_the_owner_is_mid_pass_repeats_no_work(
    db: Database, tenant: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker A's lease expires while it is inside its transaction, paused just before its first charge; worker B
    meters at that moment. A's row lock must keep B off the row (PostgreSQL: SKIP LOCKED; SQLite: B waits for
    A's write lock), so neither finds a charge the other posted."""
    alloc = open_alloc(db, tenant, at(0), Decimal("3600"))
    paused, resume = threading.Event(), threading.Event()
    post = ledger.post

    def pausing_post(*args: Any, **kw: Any) -> Any:
        if threading.current_thread().name == "A" and not paused.is_set():
            paused.set()
            resume.wait(10)
        return post(*args, **kw)

    monkeypatch.setattr(ledger, "post", pausing_post)
    with db.write() as s, s.begin():
        assert metering.claim(s, "A", at(1_000), lease_s=1, limit=10) == [alloc]
    reports = {"A": metering.MeterReport()}

    def a() -> None:
        with db.write() as s, s.begin():
            metering.meter_allocation(s, alloc, "A", at(10_000), 1, reports["A"])

    def b() -> None:
        reports["B"] = metering.meter(db, "B", at(12_000), window_s=1)

    threads = [threading.Thread(target=a, name="A"), threading.Thread(target=b, name="B")]
    threads[0].start()
    assert paused.wait(10)
    threads[1].start()
    threads[1].join(1.0)  # B is done (PostgreSQL) or waiting for A's lock (SQLite)
    resume.set()
    for th in threads:
        th.join(30)
    assert (reports["A"].repeated, reports["B"].repeated) == (0, 0)
    assert reports["A"].posted == 10  # B skipped the row, or took it after A and charged only seconds 10-11
    assert reports["B"].posted == (2 if reports["B"].claimed else 0)
    with db.read() as s:
        assert audit(s, 1) == []


def test_statements_match_the_ledger_per_allocation_user_and_workload(db: Database, tenant: tuple[str, str]) -> None:
    org, owner = tenant
    with db.write() as s, s.begin():
        other, _ = accounts.create_user(s, "other@example.com", "password123", T0)
        s.add(Membership(org_id=org, user_id=other.id, role="member"))
        other_id = other.id
    runs = [  # (user, workload, start ms, stop ms or None, rate)
        (owner, "train", 0, 95_400, Decimal("7.5")),
        (owner, "eval", 10_000, None, Decimal("1.23456789")),
        (other_id, "train", 20_000, 20_001, Decimal("100")),
        (other_id, "idle", 30_000, 90_000, ZERO),
    ]
    ids = [open_alloc(db, tenant, at(t0), rate, user=u, workload=w) for u, w, t0, _, rate in runs]
    metering.meter(db, "w", at(70_000), window_s=60)
    with db.write() as s, s.begin():
        for alloc, (*_, stop, _) in zip(ids, runs, strict=True):
            if stop is not None:
                metering.close_allocation(s, alloc, at(stop))
    metering.meter(db, "w", at(200_000), window_s=60)
    with db.read() as s:
        ledger_total = {a: t for a, (t, _) in usage_by_allocation(s).items()}
        rows = usage_statement.statement(s, org)[0]
        assert [r["allocation"] for r in rows] == ids[::-1]  # newest first
        for r in rows:
            assert Decimal(r["cost"]) == ledger_total.get(r["allocation"], ZERO)
        assert Decimal(rows[0]["cost"]) == ZERO and rows[0]["seconds_charged"] == 60
        assert rows[-1]["seconds_charged"] == 95 and Decimal(rows[-1]["cost"]) == cost_of(Decimal("7.5"), 95)
        assert rows[2]["seconds_charged"] == 180 and rows[2]["stopped_at"] is None  # live: whole windows only
        mine = usage_statement.statement(s, org, user_id=other_id)[0]
        assert {r["allocation"] for r in mine} == {ids[2], ids[3]} and {r["user"] for r in mine} == {
            "other@example.com"
        }
        train = usage_statement.statement(s, org, workload="train")[0]
        assert {r["allocation"] for r in train} == {ids[0], ids[2]}
        parsed = list(csv.DictReader(io.StringIO(usage_statement.statement_csv(rows))))
        assert [(p["allocation"], Decimal(p["cost"]), p["stopped_at"]) for p in parsed] == [
            (r["allocation"], Decimal(r["cost"]), r["stopped_at"] or "") for r in rows
        ]
        assert sum(Decimal(p["cost"]) for p in parsed) == -ledger.org_balance(s, org)


def test_audit_catches_a_lost_and_a_doubled_second(db: Database, tenant: tuple[str, str]) -> None:
    """The oracle the process tests rely on is not vacuous: it names a missing and an extra charge."""
    lost, doubled = (open_alloc(db, tenant, at(0), Decimal("3.6")) for _ in range(2))
    with db.write() as s, s.begin():
        for a in (lost, doubled):
            metering.close_allocation(s, a, at(2_500))
    metering.meter(db, "w", at(3_000), window_s=1)
    with db.read() as s:
        assert audit(s, 1) == []
    with db.write() as s, s.begin():
        tx = transfer(f"usage:{doubled}:60:0", "usage", org_account(tenant[0]), REVENUE, cost_of(Decimal("3.6"), 1))
        ledger.post(s, tx, at(3_000), org_id=tenant[0], allocation_id=doubled, allow_negative=[org_account(tenant[0])])
        row = s.scalar(select(LedgerTransaction).where(LedgerTransaction.key == f"usage:{lost}:1:2"))
        assert row is not None
        row.allocation_id = None  # as if the third second's charge had never been posted for it
    with db.read() as s:
        problems = audit(s, 1)
    assert any(p.startswith(f"{lost}: ledger charged") for p in problems)
    assert any(p.startswith(f"{doubled}: ledger charged") for p in problems)
    assert any(p.startswith(f"{doubled}: charged column") for p in problems)
