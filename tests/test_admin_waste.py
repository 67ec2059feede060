"""Waste as the project defines it (GPUs idle while work waited for GPUs, at most what it asked for) and held GPUs
not busy, per UTC hour, reconstructed from constructed workloads, allocations and readings whose expected figures
are worked out by hand below; on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import update

from suanli.db.engine import Database
from suanli.db.models import Allocation, Node, Workload, WorkloadEvent
from suanli.db.telemetry import GpuSampleRow
from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, admin_token, bearer, signup
from tests.web_helpers import Console

H = timedelta(hours=1)


@pytest.fixture
def top(api_clock: Callable[[datetime], None]) -> datetime:
    """The current UTC hour; the API's clock is held at half past it, so a test that runs across the hour's end
    still reads the hours it built its rows in (one CI run crossed it mid-test and read every hour as 0)."""
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    api_clock(hour + H / 2)
    return hour


def _job(s: Any, t: Any, wid: str, gpus: int, created: datetime, state: str, started: datetime | None = None,
         finished: datetime | None = None, events: tuple[tuple[datetime, str], ...] = ()) -> None:  # fmt: skip
    spec = {"name": wid, "command": "x", "resources": {"gpus": gpus}}
    s.add(Workload(id=wid, org_id=t.org_id, user_id=t.user_id, name=wid, kind="job", spec=spec, state=state,
                   created_at=created, submitted_at=created, queued_at=created, started_at=started,
                   finished_at=finished))  # fmt: skip
    s.flush()
    for at, st in events:
        s.add(WorkloadEvent(workload_id=wid, at=at, state=st, reason=""))


def _hold(s: Any, t: Any, aid: str, gpus: int, start: datetime, stop: datetime) -> None:
    s.add(Allocation(id=aid, org_id=t.org_id, user_id=t.user_id, workload=aid, gpu_model="RTX-4090", gpus=gpus,
                     rate_per_hour=1, placement={}, started_at=start, stopped_at=stop))  # fmt: skip


def _reading(s: Any, gpu: int, at: datetime, util: float, workload: str, error: str = "") -> None:
    t_ms = (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    s.add(GpuSampleRow(gpu_id=gpu, t_ms=t_ms, util=util, mem_used_mib=0, temp_c=40.0, power_w=100.0,
                       sm_clock_mhz=1000, throttle=0, ecc_sbe=0, ecc_dbe=0, xid=0, error=error, workload=workload,
                       org=""))  # fmt: skip


def test_waste_is_idle_gpus_while_work_waited_bounded_by_what_it_asked(api: Any, db_url: str, top: datetime) -> None:
    admin = bearer(admin_token(api))
    assert api.post("/api/v1/admin/clusters", json={"preset": "rtx4090-box"}, headers=admin).status_code == 201
    t = signup(api, "queue@example.com")
    db = Database(db_url)
    with db.write() as s, s.begin():
        s.execute(update(Node).values(created_at=top - 5 * H))  # one node of 8 GPUs, from top-5h
        _hold(s, t, "a", 4, top - 4 * H, top - 2 * H)  # 4 GPUs held top-4h..top-2h: 4 idle
        _hold(s, t, "b", 8, top - 2 * H, top - H)  # all 8 held top-2h..top-1h: none idle
        # 8 GPUs asked for, pending top-4h..top-2h (from its events), then running: min(4 idle, 8) = 4 per hour.
        _job(s, t, "w1", 8, top - 4 * H, "succeeded", top - 2 * H, top - H,
             ((top - 4 * H, "pending"), (top - 3 * H, "pending"), (top - 2 * H, "running"), (top - H, "succeeded")))  # fmt: skip
        # No events on record: pending from creation (top-5h30m, before the window and the node) to its start at
        # top-4h30m: 2 of 8 idle GPUs for the window's first half hour = 1 GPU-hour.
        _job(s, t, "w2", 2, top - 5 * H - H / 2, "running", top - 4 * H - H / 2)
        # 1 GPU asked for, pending top-2h30m..top-30m, then stopped: nothing idle in top-2h, 1 of 8 for half top-1h.
        _job(s, t, "w3", 1, top - 2 * H - H / 2, "stopped", None, top - H / 2,
             ((top - 2 * H - H / 2, "pending"), (top - H / 2, "stopped")))  # fmt: skip
        # Requeued: waited top-4h..top-3h30m, ran, waited again from top-3h15m, still pending; 1 GPU. While w1 waits,
        # min(4 idle, 8 + 1 asked) = 4 already: it adds nothing; nothing in top-2h (none idle); in top-1h
        # min(8 idle, w3 + w4 = 2) = 2 for the first half hour, 1 after.
        _job(s, t, "w4", 1, top - 4 * H, "pending", None, None,
             ((top - 4 * H, "pending"), (top - 3 * H - H / 2, "running"), (top - 3 * H - H / 4, "pending")))  # fmt: skip
        _job(s, t, "cpu", 0, top - 5 * H, "pending", events=((top - 5 * H, "pending"),))  # asks for no GPU: no waste
        # Readings in top-2h of GPUs held by "b": 25 % and 75 % busy → half idle → 8 × 0.5 = 4 GPU-hours held idle.
        # A failed reading and one of a GPU nobody held are no readings of held GPUs.
        _reading(s, 1, top - 2 * H + timedelta(minutes=10), 25.0, "b")
        _reading(s, 2, top - 2 * H + timedelta(minutes=20), 75.0, "b")
        _reading(s, 3, top - 2 * H + timedelta(minutes=30), 0.0, "b", error="nvml: gone")
        _reading(s, 4, top - 2 * H + timedelta(minutes=40), 0.0, "")
        _reading(s, 5, top - 4 * H + timedelta(minutes=5), 0.0, "")  # top-4h: no reading of a held GPU → null
    r = api.get("/api/v1/admin/waste", params={"hours": 6}, headers=admin)
    assert r.status_code == 200, r.text
    hours = r.json()
    assert [datetime.fromisoformat(h["hour"]) for h in hours] == [top - i * H for i in range(5, -1, -1)]
    # top-5h: w2 1.000 (w4/cpu not yet or no GPUs). top-4h: 4 idle, w1 (8) + w4 (1 until 3h30m) → 4.
    # top-3h: 4 idle, w1 + w4 from 3h15m → 4. top-2h: 0 idle. top-1h: 8 idle; w3 (1) + w4 (1) for 30 min → 2 × 0.5,
    # w4 alone for 30 min → 1 × 0.5: 1.5. Current hour: 8 idle, w4 (1) until now, half past: 0.5.
    assert [h["waste_gpu_hours"] for h in hours] == ["1.000", "4.000", "4.000", "0.000", "1.500", "0.500"]
    assert [h["held_idle_gpu_hours"] for h in hours] == [None, None, None, "4.000", None, None]
    # offered/held/idle unchanged in meaning
    assert [h["held_gpu_hours"] for h in hours[:5]] == [0, 4, 4, 8, 0]
    assert [h["idle_gpu_hours"] for h in hours[:5]] == [8, 4, 4, 0, 8]
    # The page shows both, newest first, in the table and the chart's data; no readings is a dash, never 0.
    ops = Console(api)
    ops.login(ADMIN_EMAIL, ADMIN_PASSWORD)
    page = ops.get("/ops/waste?hours=6", headers={"Accept-Language": "en"})
    assert page.status_code == 200, page.text
    waste = re.findall(r'data-col="waste">([^<]*)<', page.text)
    held_idle = re.findall(r'data-col="held-idle">([^<]*)<', page.text)
    assert waste[1:] == ["1.500", "0.000", "4.000", "4.000", "1.000"]
    assert held_idle == ["—", "—", "4.000", "—", "—", "—"]
    assert '"held, not busy":[null,null,null,"4.000",null,null]' in page.text
    total = re.search(r'id="waste-total">([^<]*)<', page.text)
    assert total and total.group(1) == str(sum(Decimal(w) for w in waste))


def test_waste_stays_bounded_by_the_idle_gpus(api: Any, db_url: str, top: datetime) -> None:
    """A queue far larger than the cluster wastes no more than the idle GPUs: 100 pending 8-GPU jobs for one hour
    on 8 idle GPUs → 8 GPU-hours, not 800."""
    admin = bearer(admin_token(api))
    assert api.post("/api/v1/admin/clusters", json={"preset": "rtx4090-box"}, headers=admin).status_code == 201
    t = signup(api, "flood@example.com")
    db = Database(db_url)
    with db.write() as s, s.begin():
        s.execute(update(Node).values(created_at=top - 3 * H))
        for i in range(100):
            _job(s, t, f"f{i}", 8, top - 2 * H, "stopped", None, top - H,
                 ((top - 2 * H, "pending"), (top - H, "stopped")))  # fmt: skip
    hours = api.get("/api/v1/admin/waste", params={"hours": 3}, headers=admin).json()
    assert [h["waste_gpu_hours"] for h in hours] == ["8.000", "0.000", "0.000"]  # top-2h, top-1h, now
    assert all(h["held_idle_gpu_hours"] is None for h in hours)
