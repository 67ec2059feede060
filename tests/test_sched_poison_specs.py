"""One tenant's spec never stops the scheduling pass for everyone.

The attack: `{"slice": "1g.10gb", "max_price_per_hour": 1000}` on a fleet of H20s. Admission narrowed `gpu: any` to
the models under the ceiling (H20) and stored `gpu: [H20], slice: 1g.10gb`, a spec that no longer validates; every
pass then raised reading it back, and the supervisor, run after the pass in the same tick, never ran either: nothing
was placed, started, stopped or timed out for any tenant. Both databases.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from suanli.db.models import Workload
from tests.control_plane import signup
from tests.test_workloads_api import Platform, make_platform


@pytest.fixture
def platform(api: Any) -> Platform:
    return make_platform(api)


def test_a_slice_no_registered_gpu_offers_is_refused_naming_it(platform: Platform) -> None:
    r = platform.api.post("/api/v1/workloads", headers=platform.tenant.headers, json={"spec": {
        "name": "poison", "command": "x", "max_price_per_hour": 1000, "resources": {"slice": "1g.10gb"}}})  # fmt: skip
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("resources.slice"), r.text


def test_a_stored_spec_that_no_longer_parses_fails_alone_and_the_pass_goes_on(platform: Platform) -> None:
    """A spec stored before the door was shut (or by any other path): that workload fails with the reason, and
    another org's work is placed in the same pass."""
    p = platform
    victim = signup(p.api, "victim@example.com")
    p.topup(victim.org_id, "5000")
    poison = p.submit({"name": "poison", "command": "x", "duration": 600, "resources": {"gpus": 1}})
    with p.db.write() as s, s.begin():
        spec = dict(s.get(Workload, poison["id"]).spec)
        spec["resources"] = {**spec["resources"], "gpu": ["H20"], "slice": "1g.10gb"}
        s.execute(update(Workload).where(Workload.id == poison["id"]).values(spec=spec))
    theirs = p.submit({"name": "theirs", "command": "x", "duration": 600, "resources": {"gpu": "H20", "gpus": 8}},
                      victim)  # fmt: skip
    p.tick()
    assert p.get(theirs["id"], victim)["state"] != "pending"
    failed = p.get(poison["id"])
    assert failed["state"] == "failed" and "spec" in failed["reason"], failed


def test_the_supervisor_runs_even_when_the_scheduling_pass_fails(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever else breaks the pass, running work is still supervised: stopped, timed out, billed to its end."""
    from suanli.control.background import WorkloadLoop

    srv = api.app.state.server
    loop = WorkloadLoop(srv.db, srv.settings)
    ran: list[str] = []

    def broken(*_: Any) -> Any:
        raise RuntimeError("a pass that fails")

    monkeypatch.setattr(loop.scheduling, "run", broken)
    real = loop.supervisor.run
    monkeypatch.setattr(loop.supervisor, "run", lambda *a: (ran.append("supervisor"), real(*a))[1])
    loop.tick()
    assert ran == ["supervisor"]
