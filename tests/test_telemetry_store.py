"""Samples in the database: ingest tags the holder, rollups keep min/avg/max exactly, and days of 1,000 GPUs stay
within the retention bound on both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import func, select

from suanli.control.money import metering
from suanli.control.scheduling import inventory
from suanli.control.telemetry import telemetry
from suanli.control.telemetry.telemetry import FleetIndex, Retention
from suanli.db.models import Gpu, Node, Org, User
from suanli.db.telemetry import GpuRollup, GpuSampleRow
from suanli.telemetry.samples import GpuSample

T0 = datetime(2026, 1, 5, tzinfo=UTC)


def _spec(nodes: int, gpus_per_node: int = 8) -> dict:
    return {"name": "t", "node_groups": [{"name": "n", "count": nodes, "gpu": "H100-SXM",
                                         "gpus_per_node": gpus_per_node}],
            "fabric": "eth-100"}  # fmt: skip


def _register(db, nodes: int, gpn: int = 8) -> list[tuple[str, int, str]]:
    with db.write() as s, s.begin():
        inventory.register_spec(s, _spec(nodes, gpn), T0)
    with db.read() as s:
        return list(s.execute(select(Node.name, Gpu.index, Gpu.uuid).join(Gpu, Gpu.node_id == Node.id)))


def _samples(gpus, t: float, util=lambda i: 50.0) -> list[GpuSample]:
    return [GpuSample(node=n, gpu=g, uuid=u, t=t, util=util(i), temp_c=40 + util(i) / 2, power_w=300.0,
                      mem_used_mib=1000, mem_total_mib=80000) for i, (n, g, u) in enumerate(gpus)]  # fmt: skip


def _org(db) -> tuple[str, str]:
    with db.write() as s, s.begin():
        s.add(Org(id="org_a", name="a", created_at=T0))
        s.flush()
        s.add(User(id="u_a", email="a@x", password_hash="x", personal_org_id="org_a", created_at=T0))
    return "org_a", "u_a"


def test_ingest_tags_the_holder_and_is_idempotent(db) -> None:
    gpus = _register(db, 2)
    org, user = _org(db)
    node = gpus[0][0]
    with db.write() as s, s.begin():
        metering.open_allocation(s, org_id=org, user_id=user, workload="wl_1", gpu_model="H100-SXM", gpus=2,
                                 rate=Decimal(1), placement={node: [0, 1]}, now=T0, hold_minutes=0)  # fmt: skip
    index = FleetIndex()
    batch = [*_samples(gpus, T0.timestamp() + 1), GpuSample(node="nope", gpu=0, uuid="x", t=1.0)]
    for _ in range(2):  # an agent retrying the same batch
        with db.write() as s, s.begin():
            report, tagged = telemetry.ingest(s, batch, index.refresh(s))
    assert report.unknown == ["nope/0"]
    with db.read() as s:
        assert s.scalar(select(func.count()).select_from(GpuSampleRow)) == len(gpus)
        held = dict(s.execute(select(GpuSampleRow.gpu_id, GpuSampleRow.workload)).all())
        assert sorted(held.values()).count("wl_1") == 2
        seen = s.scalar(select(Node.last_seen_at).where(Node.name == node))
    assert seen == T0 + timedelta(seconds=1)
    assert {t.workload for t in tagged if t.sample.node == node and t.sample.gpu < 2} == {"wl_1"}
    assert {t.org for t in tagged if t.sample.node != node} == {""}


def test_rollups_keep_min_avg_max(db) -> None:
    gpus = _register(db, 1, 1)
    index = FleetIndex()
    utils = [10.0, 20.0, 90.0]
    with db.write() as s, s.begin():
        for k, u in enumerate(utils):  # three samples inside the first minute
            telemetry.ingest(s, _samples(gpus, T0.timestamp() + 5 + 10 * k, lambda i, u=u: u), index.refresh(s))
        telemetry.ingest(s, _samples(gpus, T0.timestamp() + 65), index.refresh(s))
    keep = Retention(raw_s=3600, minute_s=86400, hour_s=86400 * 30, late_s=0)
    with db.write() as s, s.begin():
        report = telemetry.compact(s, T0 + timedelta(minutes=1, seconds=1), keep)
    assert report.minutes >= 1
    with db.read() as s:
        r = s.scalars(select(GpuRollup).where(GpuRollup.res_s == 60, GpuRollup.t_ms == telemetry.ms(T0))).one()
    assert (r.n, r.util_min, r.util_max) == (3, 10.0, 90.0)
    assert r.util_avg == pytest.approx(40.0)
    with db.write() as s, s.begin():  # again at the same time: nothing is rolled twice
        assert telemetry.compact(s, T0 + timedelta(minutes=1, seconds=1), keep).minutes == 0
    with db.write() as s, s.begin():
        telemetry.compact(s, T0 + timedelta(hours=1, minutes=2), keep)
    with db.read() as s:
        h = s.scalars(select(GpuRollup).where(GpuRollup.res_s == 3600)).one()
    assert (h.n, h.util_min, h.util_max) == (4, 10.0, 90.0)
    assert h.util_avg == pytest.approx((10 + 20 + 90 + 50) / 4)


def test_days_of_1000_gpus_stay_bounded(db) -> None:
    """Three simulated days of 1,000 GPUs every 10 minutes, compacted hourly: row counts reach the bound the
    retention sets and stay there, while the total ingested keeps growing."""
    gpus = _register(db, 125)
    assert len(gpus) == 1000
    period_s = 900
    keep = Retention(raw_s=3600, minute_s=6 * 3600, hour_s=24 * 3600, late_s=0)
    bound = len(gpus) * (keep.raw_s // period_s + 1 + keep.minute_s // 60 + 1 + keep.hour_s // 3600 + 1)
    index = FleetIndex()
    counts = []
    t = T0
    for step in range(3 * 24 * 3600 // period_s):
        with db.write() as s, s.begin():
            telemetry.ingest(s, _samples(gpus, t.timestamp(), lambda i, k=step: float((i + k) % 100)), index.refresh(s))
            if step % (3600 // period_s) == 0:
                telemetry.compact(s, t, keep)
        if step % (3600 // period_s) == 0:
            with db.read() as s:
                raw = s.scalar(select(func.count()).select_from(GpuSampleRow))
                rolled = s.scalar(select(func.count()).select_from(GpuRollup))
            counts.append(raw + rolled)
            assert raw + rolled <= bound, (step, raw, rolled, bound)
        t += timedelta(seconds=period_s)
    day1, day3 = max(counts[24:48]), max(counts[48:])
    assert day3 <= day1  # no growth once every resolution is at its retention
    assert counts[-1] > 0


def test_sliced_compaction_rolls_and_drops_exactly_what_one_pass_would(db, monkeypatch: pytest.MonkeyPatch) -> None:
    """In slices (each its own transaction, as the loop runs it): every minute rolled once, raw kept as retained;
    then an unsliced pass after one stopped part-way through a minute finishes it without rolling anything twice."""
    monkeypatch.setattr(telemetry, "GPU_SLICE", 1)  # one GPU row per slice
    gpus = _register(db, 1, 3)
    index = FleetIndex()
    with db.write() as s, s.begin():
        for k in range(30 * 12):  # 30 minutes at 5 s
            telemetry.ingest(s, _samples(gpus, T0.timestamp() + 5 * k), index.refresh(s))
    keep = Retention(raw_s=600, minute_s=86400, hour_s=86400 * 30, late_s=0)
    now, calls = T0 + timedelta(minutes=30), 0
    while True:
        calls += 1
        with db.write() as s, s.begin():
            if not telemetry.compact(s, now, keep, slice_s=10).more:
                break
    assert calls > 90  # 30 minutes x 3 GPU slices to roll, 20 minutes of raw to drop 10 s at a time
    with db.read() as s:
        minutes = s.execute(select(GpuRollup.t_ms, GpuRollup.n).where(GpuRollup.res_s == 60)).all()
        oldest = s.scalar(select(func.min(GpuSampleRow.t_ms)))
    assert sorted(minutes) == sorted((telemetry.ms(T0) + 60_000 * m, 12) for m in range(30) for _ in range(3))
    assert oldest == telemetry.ms(now) - keep.raw_s * 1000
    with db.write() as s, s.begin():  # the next minute, one slice only; then a plain pass
        telemetry.ingest(s, _samples(gpus, now.timestamp() + 1), index.refresh(s))
        assert telemetry.compact(s, now + timedelta(minutes=1, seconds=1), keep, slice_s=10).more
    with db.write() as s, s.begin():
        telemetry.compact(s, now + timedelta(minutes=1, seconds=1), keep)
    with db.read() as s:
        last = s.execute(select(GpuRollup.n).where(GpuRollup.res_s == 60, GpuRollup.t_ms == telemetry.ms(now))).all()
    assert sorted(n for (n,) in last) == [1, 1, 1]
