"""Work whose submitter may no longer spend the org's money (removed from the team, or made a viewer) never starts or
grows on it again (found by a hostile review). Removal stopped the member's queued work, but work running then came
back later, by a retry after a preemption or a node failure, and was placed again on the team's money, with no
spend limit either (a non-member has none); running elastic work was grown. Both databases."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from suanli.control.accounts.memberships import LOST_SPEND
from suanli.control.ids import utcnow
from suanli.control.scheduling.placing import preempt
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.control.workloads.supervisor import Supervisor
from suanli.db.models import Workload
from tests.control_plane import Tenant, team_with_member

API = "/api/v1"


def _running_retrying_job(api: TestClient, who: Tenant, org: str, t0: datetime) -> str:
    """`who`'s job in `org` that asks to be retried after a preemption, placed and running at t0."""
    spec = {"name": "long", "command": "train", "duration": 3600, "resources": {"gpu": "H20", "gpus": 1},
            "retry": {"on": ["preemption", "node-failure"], "limit": 5}}  # fmt: skip
    r = api.post(f"{API}/workloads", json={"spec": spec, "org": org}, headers=who.headers)
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    db = api.app.state.server.db  # type: ignore[attr-defined]
    SchedulingPass().run(db, t0)
    Supervisor(api.app.state.server.settings.home).run(db, t0)  # type: ignore[attr-defined]
    with db.read() as s:
        assert s.get(Workload, wid).state == "running"
    return wid


def _preempt_and_reschedule(api: TestClient, wid: str, t0: datetime) -> Workload:
    db = api.app.state.server.db  # type: ignore[attr-defined]
    sup = Supervisor(api.app.state.server.settings.home)  # type: ignore[attr-defined]
    with db.write() as s, s.begin():
        assert preempt(s, [(wid, "preempted for on-demand work", "")], t0 + timedelta(seconds=30)) == 1
    sup.run(db, t0 + timedelta(seconds=31))  # ends as preempted; its retry policy queues it again
    SchedulingPass().run(db, t0 + timedelta(seconds=40))
    with db.read() as s:
        w = s.get(Workload, wid)
        s.expunge(w)
        return w


@pytest.mark.parametrize("how", ["removed", "viewer"])
def test_retried_work_of_a_member_who_lost_spend_is_not_placed_again_on_the_org(api: TestClient, how: str) -> None:
    _, owner, alice, org = team_with_member(api)
    t0 = utcnow().replace(microsecond=0) + timedelta(seconds=5)
    wid = _running_retrying_job(api, alice, org, t0)
    if how == "removed":
        assert api.delete(f"{API}/orgs/{org}/members/{alice.user_id}", headers=owner.headers).status_code == 204
    else:
        r = api.patch(f"{API}/orgs/{org}/members/{alice.user_id}", json={"role": "viewer"}, headers=owner.headers)
        assert r.status_code == 200, r.text
    w = _preempt_and_reschedule(api, wid, t0)
    assert w.state == "stopped" and LOST_SPEND in w.reason, (w.state, w.attempt, w.reason)
    assert w.attempt == 1  # never placed again


def test_retried_work_of_a_member_who_stays_is_placed_again(api: TestClient) -> None:
    _, _, alice, org = team_with_member(api)
    t0 = utcnow().replace(microsecond=0) + timedelta(seconds=5)
    w = _preempt_and_reschedule(api, _running_retrying_job(api, alice, org, t0), t0)
    assert w.state == "scheduled" and w.attempt == 2, (w.state, w.reason)


def test_a_member_over_a_lowered_limit_removed_escapes_the_limit_on_retry(api: TestClient) -> None:
    """Capped at 0 this month, then removed: her retried work is not placed with no cap at all."""
    _, owner, alice, org = team_with_member(api)
    t0 = utcnow().replace(microsecond=0) + timedelta(seconds=5)
    wid = _running_retrying_job(api, alice, org, t0)
    r = api.patch(f"{API}/orgs/{org}/members/{alice.user_id}", json={"monthly_spend_limit": "0"},
                  headers=owner.headers)  # fmt: skip
    assert r.status_code == 200, r.text
    assert api.delete(f"{API}/orgs/{org}/members/{alice.user_id}", headers=owner.headers).status_code == 204
    w = _preempt_and_reschedule(api, wid, t0)
    assert w.state == "stopped" and w.attempt == 1, (w.state, w.reason)


def test_running_elastic_work_of_a_removed_member_is_not_grown_on_the_team(api: TestClient) -> None:
    """The elastic policy grows running work into GPUs that become idle; a removed member's is not grown (what runs
    goes on, as when a member is removed, at the size it had)."""
    _, owner, alice, org = team_with_member(api)
    db = api.app.state.server.db  # type: ignore[attr-defined]
    sup = Supervisor(api.app.state.server.settings.home, grace_s=1.0)  # type: ignore[attr-defined]
    sched = SchedulingPass()
    t0 = utcnow().replace(microsecond=0) + timedelta(seconds=5)

    def tick(t: float) -> None:
        sup.run(db, t0 + timedelta(seconds=t))
        sched.run(db, t0 + timedelta(seconds=t))
        sup.run(db, t0 + timedelta(seconds=t))

    big = {"name": "big", "command": "x", "duration": 20, "resources": {"gpu": "H20", "gpus": 7}}
    assert api.post(f"{API}/workloads", json={"spec": big, "org": org}, headers=owner.headers).status_code == 201
    tick(0)
    small = {"name": "stretchy", "command": "train", "duration": 3600,
             "resources": {"gpu": "H20", "gpus": {"min": 1, "max": 8}}}  # fmt: skip
    r = api.post(f"{API}/workloads", json={"spec": small, "org": org}, headers=alice.headers)
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    tick(1)
    with db.read() as s:
        w = s.get(Workload, wid)
        assert w.state == "running", (w.state, w.reason)
    held = api.get(f"{API}/workloads/{wid}", headers=owner.headers).json()["allocation"]["gpus"]
    assert api.delete(f"{API}/orgs/{org}/members/{alice.user_id}", headers=owner.headers).status_code == 204
    for t in (30, 32, 34, 36):
        tick(t)
    now = api.get(f"{API}/workloads/{wid}", headers=owner.headers).json()
    assert now["allocation"]["gpus"] <= held, f"grown from {held} to {now['allocation']['gpus']} GPUs after removal"


def test_an_owner_who_starts_a_removed_members_instance_spends_for_it(api: TestClient) -> None:
    """The instance of a member who left is the starter's to pay for once an owner starts it again."""
    _, owner, alice, org = team_with_member(api)
    spec = {"name": "box", "kind": "instance", "resources": {"gpu": "H20", "gpus": 1}}
    r = api.post(f"{API}/workloads", json={"spec": spec, "org": org}, headers=alice.headers)
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    assert api.delete(f"{API}/orgs/{org}/members/{alice.user_id}", headers=owner.headers).status_code == 204
    db = api.app.state.server.db  # type: ignore[attr-defined]
    with db.read() as s:
        assert s.get(Workload, wid).state == "stopped"  # queued work of a removed member stops
    assert api.post(f"{API}/workloads/{wid}/start", headers=owner.headers).status_code == 200
    SchedulingPass().run(db, utcnow() + timedelta(seconds=5))
    with db.read() as s:
        w = s.get(Workload, wid)
        assert (w.state, w.user_id) == ("scheduled", owner.user_id), (w.state, w.reason)
