"""Issue: cross-tenant starvation on trial credit. 150 one-GPU jobs of a ¥10 tenant were each admitted alone (its
queued work was not counted), so every pass handed the free GPUs to jobs admission then refused, and a paying
tenant's 8-GPU job waited at queue position 143 while 121 of 128 GPUs were free. What an org runs and has queued
now counts against its balance: the pass skips the work it cannot afford, places other orgs' work, and says why.
Attacks first; in-process on both databases."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.billing.money import ZERO
from suanli.billing.prices import default_price_book
from suanli.control.ids import utcnow
from suanli.control.money import committed, ledger
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.db.models import Allocation, Workload
from suanli.workloads.spec import parse_spec
from tests.control_plane import Tenant, admin_token, bearer, signup

API = "/api/v1"


def _job(name: str, gpus: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": "x", "duration": 3600, "resources": {"gpu": "H20", "gpus": gpus}, **extra}


def _submit(api: TestClient, who: Tenant, spec: dict[str, Any]) -> str:
    r = api.post(f"{API}/workloads", json={"spec": spec}, headers=who.headers)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _setup(api: TestClient) -> tuple[dict[str, str], Tenant, Tenant]:
    adm = bearer(admin_token(api))
    r = api.post(f"{API}/admin/clusters", json={"preset": "h20-roce800-128"}, headers=adm)
    assert r.status_code == 201, r.text
    trial = signup(api, "trial@example.com")  # the trial credit alone: ¥10
    payer = signup(api, "payer@example.com")
    r = api.post(f"{API}/admin/orgs/{payer.org_id}/transactions", json={"kind": "topup", "amount": "5000"}, headers=adm)
    assert r.status_code == 201, r.text
    return adm, trial, payer


def _held(api: TestClient, org_id: str) -> int:
    db = api.app.state.server.db  # type: ignore[attr-defined]
    with db.read() as s:
        return int(s.scalar(select(func.coalesce(func.sum(Allocation.gpus), 0))
                            .where(Allocation.org_id == org_id, Allocation.stopped_at.is_(None))) or 0)  # fmt: skip


def test_a_trial_tenants_queue_it_cannot_afford_does_not_starve_a_paying_tenant(api: TestClient) -> None:
    _, trial, payer = _setup(api)
    for i in range(150):  # each alone fits the ¥10 hold (10 minutes of ¥8.50/h), so each is accepted
        _submit(api, trial, _job(f"flood-{i}", 1))
    big = _submit(api, payer, _job("paid-8", 8))
    db = api.app.state.server.db  # type: ignore[attr-defined]
    report = SchedulingPass().run(db, utcnow())
    seen = api.get(f"{API}/workloads/{big}", headers=payer.headers).json()
    assert seen["state"] == "scheduled", seen["pending"]  # before: pending at position 143, 121 of 128 GPUs free
    assert report.refused == 0, report  # no GPU was handed to work admission then refused
    assert _held(api, trial.org_id) == 7  # ¥10 covers ten minutes of 7 x ¥8.50/h, not of 8
    with db.read() as s:
        waiting = list(s.execute(select(Workload.pending_reason, Workload.queue_position)
                                 .where(Workload.org_id == trial.org_id, Workload.state == "pending")))  # fmt: skip
    assert len(waiting) == 143
    reason = waiting[0][0]
    # 7 running at ¥59.50/h and the next at ¥8.50/h: ten minutes of ¥68/h is ¥11.33
    assert reason == "waiting for balance: org has ¥10.00, its running and queued work needs ¥11.33", reason
    assert all(r == reason for r, _ in waiting)


def test_queued_work_counts_before_it_is_placed_and_a_topup_releases_it(api: TestClient) -> None:
    """The org's own queue counts in its order: its first jobs are committed even while they wait for GPUs, so
    the jobs behind them wait for balance, not for GPUs they could never pay for; a top-up lets them start."""
    adm, trial, payer = _setup(api)
    db = api.app.state.server.db  # type: ignore[attr-defined]
    wall = _submit(api, payer, _job("wall", 128))  # the payer takes the whole cluster
    sched = SchedulingPass()
    sched.run(db, utcnow())
    assert api.get(f"{API}/workloads/{wall}", headers=payer.headers).json()["state"] == "scheduled"
    first = _submit(api, trial, _job("first", 4))  # ¥34/h: ten minutes is ¥5.67, affordable alone
    second = _submit(api, trial, _job("second", 4))  # both: ¥11.33, more than ¥10
    sched.run(db, utcnow())
    a = api.get(f"{API}/workloads/{first}", headers=trial.headers).json()
    b = api.get(f"{API}/workloads/{second}", headers=trial.headers).json()
    assert a["state"] == b["state"] == "pending"
    assert not a["pending"]["reason"].startswith("waiting for balance"), a["pending"]
    assert b["pending"]["reason"] == (
        "waiting for balance: org has ¥10.00, its running and queued work needs ¥11.33"
    ), b["pending"]
    r = api.post(f"{API}/admin/orgs/{trial.org_id}/transactions", json={"kind": "topup", "amount": "5"}, headers=adm)
    assert r.status_code == 201, r.text
    r = api.post(f"{API}/workloads/{wall}/stop", headers=payer.headers)
    assert r.status_code == 200, r.text
    sched.run(db, utcnow())
    assert api.get(f"{API}/workloads/{first}", headers=trial.headers).json()["state"] == "scheduled"
    assert api.get(f"{API}/workloads/{second}", headers=trial.headers).json()["state"] == "scheduled"


def test_work_that_costs_nothing_more_is_not_held_back_by_a_balance_below_zero(api: TestClient) -> None:
    """A plan's GPUs are prepaid: work on them without host CPU or memory costs the org nothing more, so neither
    the pass nor placement refuses it for a balance below zero. CPU-only work is charged, so it is refused."""
    _, _, payer = _setup(api)
    db = api.app.state.server.db  # type: ignore[attr-defined]
    r = api.post(f"{API}/orgs/{payer.org_id}/plans", headers=payer.headers,
                 json={"plan": "hourly", "gpu": "H20", "gpus": 8})  # fmt: skip
    assert r.status_code == 201, r.text
    plan = r.json()["id"]
    with db.write() as s, s.begin():  # the org spent its balance and more (usage may go below zero)
        have = ledger.org_balance(s, payer.org_id)
        tx = transfer("spent", "usage", org_account(payer.org_id), REVENUE, have + Decimal(3), "spent")
        ledger.post(s, tx, utcnow(), org_id=payer.org_id, allow_negative=[org_account(payer.org_id)])
    planned = _submit(api, payer, _job("planned", 8, billing=f"plan:{plan}"))
    r = api.post(f"{API}/workloads", json={"spec": _job("cpu", 0)}, headers=payer.headers)
    assert r.status_code == 402, r.text  # charged work is refused at once, as before
    SchedulingPass().run(db, utcnow())
    seen = api.get(f"{API}/workloads/{planned}", headers=payer.headers).json()
    assert seen["state"] == "scheduled", seen


def test_the_walk_skips_what_does_not_fit_and_never_counts_less_than_placement_charges() -> None:
    """`committed.affordable` alone: an org's big job it cannot pay for does not hold back its small ones behind it;
    work at a zero rate always passes; and the most a queued job can cost is never below what placing it on any split
    over nodes charges (host CPU and memory are rounded up per node-rank)."""
    book = default_price_book()
    h20 = {"gpu": "H20"}
    big = parse_spec({"name": "big", "command": "x", "resources": {**h20, "gpus": 16}})
    small = parse_spec({"name": "small", "command": "x", "resources": {**h20, "gpus": 1}})
    queue = [big.to_request("big", 0.0, "o"), small.to_request("s1", 1.0, "o"), small.to_request("s2", 2.0, "o")]
    specs = {"big": big, "s1": small, "s2": small}
    money = {"o": committed.OrgMoney(Decimal("2.90"), ZERO)}  # ten minutes of 2 x ¥8.50/h is ¥2.83
    ok, waits = committed.affordable(queue, specs, money, book, {"H20"}, 10)
    assert [r.id for r in ok] == ["s1", "s2"]
    assert waits == {"big": "waiting for balance: org has ¥2.90, its running and queued work needs ¥22.67"}
    money = {"o": committed.OrgMoney(Decimal("-1"), ZERO)}
    planned = parse_spec({"name": "p", "command": "x", "billing": "plan:p1", "resources": {**h20, "gpus": 8}})
    ok, waits = committed.affordable([planned.to_request("p", 0.0, "o")], {"p": planned}, money, book, {"H20"}, 10)
    assert [r.id for r in ok] == ["p"] and not waits
    spec = parse_spec({"name": "h", "command": "x", "resources": {**h20, "gpus": 3, "cpus": 10, "memory": "7GiB"}})
    most = committed.most_rate(spec, 3, {"H20", "H100-SXM"}, book)
    for split in ([3], [2, 1], [1, 1, 1]):
        cpu, mem = spec.host_held(split)
        assert book.rate("H20", 3) + book.host_rate(cpu, mem) <= most, split
    assert most == book.rate("H20", 3) + book.host_rate(3 * 3334, 3 * 2390)  # 10 cores, 7 GiB in thirds, rounded up
