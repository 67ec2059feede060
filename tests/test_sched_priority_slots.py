"""`priority` reorders an org's own queue, but an old workload that cannot start is no place in it to hand on.

The attack (a hostile review): `priority: high` handed an org's oldest queue slot to its newest work; an old gang that
can never start (here a whole cluster's) kept that slot for the org as long as it waited, free of charge, and each new
high-priority small job took the free GPUs ahead of other orgs' earlier work. Now work moves forward only into the
place of work asking no more GPUs than it does. Both databases."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.control_plane import signup
from tests.test_workloads_api import Platform, make_platform


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
