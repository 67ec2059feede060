"""Issue: the balance went below the documented grace: a ¥10 tenant's 7 x H20 job ended at -5.46 when five minutes
of grace at its rate is -4.96. The stop was asked for only once the charges posted (whole 60 s windows, a metering
pass every 5 s) had passed the bound, so the seconds run but not yet posted, and those the stop itself took, all
came on top. Now the supervisor counts every second run and stops early enough for the run to end within the bound.
Attack first; in-process on both databases, the loops driven at the server's cadence on the test's clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from suanli.billing.ledger import EXTERNAL, org_account, transfer
from suanli.control.accounts import accounts
from suanli.control.ids import utcnow
from suanli.control.money import ledger, metering, overdraft
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.control.workloads.supervisor import Supervisor
from suanli.db.models import Workload
from tests.control_plane import admin_token, bearer, signup

API = "/api/v1"
RATE = Decimal("59.50")  # 7 x H20 at the shipped ¥8.50 an hour
GRACE_MINUTES = 5


def test_work_out_of_money_ends_no_lower_than_the_grace_allows(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    r = api.post(f"{API}/admin/clusters", json={"preset": "1x8:H20"}, headers=adm)
    assert r.status_code == 201, r.text
    trial = signup(api, "trial@example.com")  # ¥10 of trial credit: ten minutes of ¥59.50/h is ¥9.92
    spec = {"name": "seven", "kind": "instance", "resources": {"gpu": "H20", "gpus": 7}}
    r = api.post(f"{API}/workloads", json={"spec": spec}, headers=trial.headers)
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    db = api.app.state.server.db  # type: ignore[attr-defined]
    home = api.app.state.server.settings.home  # type: ignore[attr-defined]
    sup = Supervisor(home, grace_s=10.0, balance_grace_minutes=GRACE_MINUTES)  # the server's defaults
    t0 = utcnow().replace(microsecond=0) + timedelta(seconds=5)
    SchedulingPass().run(db, t0)
    sup.run(db, t0)
    assert api.get(f"{API}/workloads/{wid}", headers=trial.headers).json()["state"] == "running"
    # The server's cadence: the workload loop every 0.5 s, metering every 5 s in 60 s windows. The first 850 s
    # (the grace runs out at 905 s) in 5 s steps; then every half second.
    steps = [5.0 * i for i in range(170)] + [850 + 0.5 * i for i in range(400)]
    ended = None
    for t in steps:
        now = t0 + timedelta(seconds=t)
        if t % 5 == 0:
            metering.meter(db, "meter", now, window_s=60)
        sup.run(db, now)
        with db.read() as s:
            if s.scalar(select(Workload.state).where(Workload.id == wid)) == "stopped":
                ended = t
                break
    assert ended is not None, "never stopped"
    w = api.get(f"{API}/workloads/{wid}", headers=trial.headers).json()
    assert "balance exhausted" in w["reason"], w["reason"]
    metering.meter(db, "meter", t0 + timedelta(seconds=ended + 10), window_s=60)  # the last partial window
    with db.read() as s:
        balance = ledger.org_balance(s, trial.org_id)
    bound = -(RATE * GRACE_MINUTES / 60)  # -4.96
    one_second = RATE / 3600  # the last second started is billed whole
    assert balance >= bound - one_second, (balance, bound, ended)
    # ... and it did get its grace: it stopped within the stop's lead time (10 s of SIGTERM grace + 5 s) of the bound
    assert balance < bound + RATE * 16 / 3600, (balance, bound, ended)


def test_the_balance_that_stops_work_counts_seconds_not_yet_charged(db: Any) -> None:
    """`overdraft.broke_orgs` on its own: a running allocation's completed seconds and a stopped one's last window
    count before metering posts them; an org far from its bound is not stopped; a zero rate never is."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with db.write() as s, s.begin():
        user, org = accounts.create_user(s, "od@example.com", "password123", t0)
        rich_user, rich = accounts.create_user(s, "rich@example.com", "password123", t0)
        tx = transfer("top", "topup", EXTERNAL, org_account(rich.id), Decimal(1000), "top")
        ledger.post(s, tx, t0, org_id=rich.id)
        for who, owner, rate, stop in ((org.id, user.id, "36", 30), (org.id, user.id, "36", None),
                                       (rich.id, rich_user.id, "36", None), (org.id, user.id, "0", None)):  # fmt: skip
            a = metering.open_allocation(s, org_id=who, user_id=owner, workload="w", gpu_model=None, gpus=0,
                                         placement={}, now=t0, hold_minutes=0)  # fmt: skip
            a.rate_per_hour = Decimal(rate)  # ¥36/h: a cent a second
            if stop is not None:
                a.stopped_at = t0 + timedelta(seconds=stop)
    # Nothing posted yet. At 100 s: 30 s + 100 s run = ¥1.30 owed, at ¥36/h running; 1 minute of grace is ¥0.60,
    # the lead (10 s) ¥0.10: -1.30 - 0.10 < -0.60, so the org is out of money although its posted balance is 0.
    with db.read() as s:
        broke = overdraft.broke_orgs(s, t0 + timedelta(seconds=100), 1, 10)
    assert broke == {org.id: Decimal("-1.30")}, broke
    with db.read() as s:  # at 40 s: -0.70 - 0.10 < -0.60 still; at 30 s: -0.60 - 0.10 < -0.60; at 20 s: not yet
        assert set(overdraft.broke_orgs(s, t0 + timedelta(seconds=40), 1, 10)) == {org.id}
        assert overdraft.broke_orgs(s, t0 + timedelta(seconds=20), 1, 10) == {}
    metering.meter(db, "m", t0 + timedelta(seconds=100), window_s=60)  # posts 30 s and the first 60 s
    with db.read() as s:
        assert overdraft.broke_orgs(s, t0 + timedelta(seconds=100), 1, 10) == {org.id: Decimal("-1.30")}
    assert overdraft.stop_lead_s(10, 0.5) == 15 and overdraft.stop_lead_s(10, 4) == 18
