"""`priority` reorders an org's own queue, but an old workload that cannot start is no place in it to hand on.

The attack (a hostile review): `priority: high` handed an org's oldest queue slot to its newest work; an old gang that
can never start (here a whole cluster's) kept that slot for the org as long as it waited, free of charge, and each new
high-priority small job took the free GPUs ahead of other orgs' earlier work. Now work moves forward only into the
place of work asking no more GPUs than it does. A later review found the reverse: a 1-GPU `low` ticket queued early
and free while it waits handed its place to a later 64-GPU gang. Now places are traded only between work asking the
same GPUs. Both databases."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.control_plane import signup
from tests.test_workloads_api import Platform, make_platform

API = "/api/v1"


def _running(p: Platform, wid: str, who: Any = None) -> bool:
    return p.get(wid, who)["state"] in ("scheduled", "starting", "running")


def _until_running(p: Platform, items: list[tuple[str, Any]], tries: int = 40) -> None:
    for _ in range(tries):
        p.tick()
        if all(p.get(wid, who)["state"] == "running" for wid, who in items):
            return
    raise AssertionError([p.get(wid, who)["state"] for wid, who in items])


@pytest.fixture
def platform(api: Any) -> Platform:
    return make_platform(api)


def test_an_old_gang_that_cannot_start_is_no_front_of_queue_pass_for_small_work(platform: Platform) -> None:
    p = platform
    other = signup(p.api, "other@example.com")
    p.topup(other.org_id, "5000")
    blocker = p.submit({"name": "blocker", "kind": "instance", "resources": {"gpu": "H20", "gpus": 120}}, other)
    for _ in range(20):
        p.tick()
        if p.get(blocker["id"], other)["state"] == "running":
            break
    anchor = p.submit(
        {"name": "anchor", "kind": "instance", "priority": "low", "resources": {"gpu": "H20", "gpus": 128}}
    )  # waits as long as anything else runs
    p.tick()
    time.sleep(0.01)
    theirs = p.submit(
        {"name": "theirs", "command": "x", "duration": 600, "resources": {"gpu": "H20", "gpus": 8}}, other
    )
    time.sleep(0.01)
    mine = p.submit(
        {"name": "mine", "command": "x", "duration": 600, "priority": "high", "resources": {"gpu": "H20", "gpus": 8}}
    )
    p.tick()
    s_theirs, s_mine = p.get(theirs["id"], other)["state"], p.get(mine["id"])["state"]
    assert p.get(anchor["id"])["state"] == "pending"
    assert not (s_mine != "pending" and s_theirs == "pending"), (
        "the org's newest job took the only 8 free GPUs ahead of another org's earlier job, on its anchor's slot"
    )


def test_a_small_low_priority_ticket_is_no_queue_pass_for_a_later_big_gang(platform: Platform) -> None:
    """The org queues a 1-GPU `priority: low` ticket while the cluster is full (it costs nothing while it waits).
    Another org then queues a 64-GPU job; later the attacker queues its own 64-GPU `priority: high` job. When 64
    GPUs free up, the attacker's later job must not start ahead of the other org's earlier one: `_by_priority`
    lets work move into the place of any own work asking *no more* GPUs, so a 1-GPU ticket hands its slot to a
    64-GPU gang (the reverse of the anchor fixed in test_sched_priority_slots)."""
    p = platform
    other = signup(p.api, "other@example.com")
    p.topup(other.org_id, "50000")
    walls = [p.submit({"name": f"wall{i}", "kind": "instance", "resources": {"gpu": "H20", "gpus": 64}}, other)
             for i in range(2)]  # fmt: skip
    _until_running(p, [(w["id"], other) for w in walls])
    ticket = p.submit({"name": "ticket", "command": "x", "priority": "low", "resources": {"gpu": "H20", "gpus": 1}})
    p.tick()
    time.sleep(0.01)
    theirs = p.submit({"name": "theirs", "command": "x", "duration": 600, "resources": {"gpu": "H20", "gpus": 64}},
                      other)  # fmt: skip
    time.sleep(0.01)
    mine = p.submit({"name": "mine", "command": "x", "duration": 600, "priority": "high",
                     "resources": {"gpu": "H20", "gpus": 64}})  # fmt: skip
    p.tick()
    assert p.get(ticket["id"])["state"] == "pending"
    r = p.api.post(f"{API}/workloads/{walls[0]['id']}/stop", headers=other.headers)
    assert r.status_code == 200, r.text
    for _ in range(40):
        p.tick()
        if p.get(walls[0]["id"], other)["state"] == "stopped":
            break
    p.tick()
    assert not (_running(p, mine["id"]) and not _running(p, theirs["id"], other)), (
        "the attacker's 64-GPU job, submitted after the other org's, took the 64 freed GPUs on its 1-GPU ticket's slot"
    )
