"""Workloads through the API in-process, on both databases: the scheduling pass and the supervisor are driven
by the test (background loops off), so every step is deterministic to observe. Real processes run on the local
executor; virtual nodes run on the virtual executor."""

from __future__ import annotations

import base64
import io
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.billing.metering import billable_seconds, cost_of
from suanli.control.ids import utcnow
from suanli.control.money import metering
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.control.workloads.supervisor import Supervisor
from suanli.sched import Request
from tests.control_plane import Tenant, admin_token, bearer, signup

WL = "/api/v1/workloads"


@dataclass
class Platform:
    api: TestClient
    admin: dict[str, str]
    tenant: Tenant
    sched: SchedulingPass
    sup: Supervisor

    @property
    def db(self) -> Any:
        return self.api.app.state.server.db  # type: ignore[attr-defined]

    def tick(self) -> None:
        self.sched.run(self.db, utcnow())
        self.sup.run(self.db, utcnow())

    def submit(self, spec: dict[str, Any], who: Tenant | None = None, **extra: Any) -> dict[str, Any]:
        r = self.api.post(WL, json={"spec": spec, **extra}, headers=(who or self.tenant).headers)
        assert r.status_code == 201, r.text
        return r.json()

    def get(self, ref: str, who: Tenant | None = None) -> dict[str, Any]:
        r = self.api.get(f"{WL}/{ref}", headers=(who or self.tenant).headers)
        assert r.status_code == 200, r.text
        return r.json()

    def until(self, ref: str, done: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            self.tick()
            w = self.get(ref)
            if done(w):
                return w
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; workload is {w['state']}: {w['reason']} / {w.get('pending')}")
            time.sleep(0.05)

    def topup(self, org_id: str, amount: str) -> None:
        r = self.api.post(f"/api/v1/admin/orgs/{org_id}/transactions", headers=self.admin,
                          json={"kind": "topup", "amount": amount, "memo": "test"})  # fmt: skip
        assert r.status_code == 201, r.text


def finished(w: dict[str, Any]) -> bool:
    return w["state"] in ("succeeded", "failed", "stopped", "preempted")


@pytest.fixture
def platform(api: TestClient) -> Platform:
    return make_platform(api)


def make_platform(api: TestClient) -> Platform:
    """128 virtual H20 GPUs and this host, a tenant with ¥5,000, and the passes driven by the test."""
    admin = bearer(admin_token(api))
    for body in ({"preset": "h20-roce800-128"}, {"local": True, "name": "this-host"}):
        r = api.post("/api/v1/admin/clusters", json=body, headers=admin)
        assert r.status_code == 201, r.text
    tenant = signup(api, "tenant@example.com")
    home = api.app.state.server.settings.home  # type: ignore[attr-defined]
    p = Platform(api, admin, tenant, SchedulingPass(), Supervisor(home, grace_s=1.0))
    p.topup(tenant.org_id, "5000")
    return p


def archive(files: dict[str, str]) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


def test_local_job_runs_its_uploaded_workdir_to_completion(platform: Platform) -> None:
    script = "import os\nprint('hello from', os.environ['SUANLI_WORKLOAD_ID'], os.environ['WORLD_SIZE'])\n"
    w = platform.submit({"name": "hello", "command": "python3 hello.py", "resources": {"gpus": 0}},
                        workdir_archive=archive({"hello.py": script}))  # fmt: skip
    assert w["state"] == "pending"
    done = platform.until(w["id"], finished)
    assert done["state"] == "succeeded", done["reason"]
    assert done["exit_code"] == 0
    assert [e["state"] for e in done["events"]] == ["pending", "scheduled", "starting", "running", "succeeded"]
    assert done["allocation"]["nodes"] == {"this-host": []}
    a = done["allocation"]  # CPU-only: 1 core and 2 GiB by default, at the shipped host prices (0.10 + 2 x 0.025)
    assert (a["cpu_milli"], a["memory_mib"], a["rate_per_hour"], a["host_rate_per_hour"]) == (
        1000, 2048, "0.15000000", "0.15000000")  # fmt: skip
    ran = (_t(a["stopped_at"]) - _t(a["started_at"])).total_seconds()
    assert Decimal(done["cost"]) == cost_of(Decimal("0.15"), billable_seconds(ran, stopped=True)) > 0
    logs = platform.api.get(f"{WL}/{w['id']}/logs", headers=platform.tenant.headers).json()
    assert logs["data"] == f"hello from {w['id']} 1\n"
    assert logs["done"] is True


def test_failing_job_retries_by_its_policy_then_fails(platform: Platform) -> None:
    spec = {"name": "flaky", "command": "echo try $SUANLI_ATTEMPT; exit 3", "resources": {"gpus": 0},
            "retry": {"on": ["failure"], "limit": 1}}  # fmt: skip
    w = platform.submit(spec)
    done = platform.until(w["id"], lambda w: finished(w) and w["attempt"] == 2)
    assert done["state"] == "failed" and done["exit_code"] == 3
    states = [e["state"] for e in done["events"]]
    assert states.count("failed") == 2 and states.count("running") == 2
    assert "retry 1/1" in " ".join(e["reason"] for e in done["events"])


def test_virtual_gang_lands_inside_one_leaf_and_is_charged_exactly(platform: Platform) -> None:
    spec = {"name": "leaf64", "command": "train", "duration": 1.5,
            "resources": {"gpu": "H20", "gpus": 64, "topology": "leaf"}}  # fmt: skip
    w = platform.submit(spec)
    running = platform.until(w["id"], lambda w: w["state"] == "running")
    nodes = running["allocation"]["nodes"]
    assert sum(len(g) for g in nodes.values()) == 64
    r = platform.api.get("/api/v1/admin/nodes", headers=platform.admin, params={"limit": 1000})
    leaf = {n["name"]: n["leaf"] for n in r.json()}
    assert len({leaf[n] for n in nodes}) == 1, "the gang spans leaves"
    done = platform.until(w["id"], finished)
    assert done["state"] == "succeeded"
    a = done["allocation"]
    elapsed = (_t(a["stopped_at"]) - _t(a["started_at"])).total_seconds()
    expected = cost_of(Decimal(a["rate_per_hour"]), billable_seconds(elapsed, True))
    assert Decimal(done["cost"]) == expected > 0
    metering.meter(platform.db, "test", utcnow())
    tx = platform.api.get(f"/api/v1/orgs/{platform.tenant.org_id}/transactions", headers=platform.tenant.headers)
    charged = -sum(Decimal(t["amount"]) for t in tx.json() if t["kind"] == "usage")
    assert charged == expected


def test_instance_stops_releasing_its_gpus_and_starts_again(platform: Platform) -> None:
    w = platform.submit({"name": "box", "kind": "instance", "resources": {"gpu": "H20", "gpus": 8}})
    platform.until(w["id"], lambda w: w["state"] == "running")
    r = platform.api.post(f"{WL}/{w['id']}/stop", headers=platform.tenant.headers)
    assert r.status_code == 200
    stopped = platform.until(w["id"], lambda w: w["state"] == "stopped")
    assert stopped["allocation"]["stopped_at"] is not None
    assert Decimal(stopped["rate_per_hour"]) == 0
    r = platform.api.post(f"{WL}/{w['id']}/start", headers=platform.tenant.headers)
    assert r.status_code == 200 and r.json()["state"] == "pending"
    again = platform.until(w["id"], lambda w: w["state"] == "running")
    assert again["attempt"] == 2
    platform.api.post(f"{WL}/box/stop", headers=platform.tenant.headers)  # by name
    platform.until(w["id"], lambda w: w["state"] == "stopped")
    listed = platform.api.get(WL, headers=platform.tenant.headers).json()
    assert [x["id"] for x in listed] == [w["id"]]  # a stopped instance is still listed: it can start again


def test_an_instance_starts_without_its_gpus_at_cpu_price_and_gets_them_back(platform: Platform) -> None:
    """`start --no-gpu` (AutoDL's GPU-less mode): the disk at CPU price; the next ordinary start brings the plan's
    GPUs and billing back."""
    from suanli.db.models import Plan

    r = platform.api.post(f"/api/v1/orgs/{platform.tenant.org_id}/plans", headers=platform.tenant.headers,
                          json={"plan": "hourly", "gpu": "H20", "gpus": 8})  # fmt: skip
    plan = r.json()["id"]
    w = platform.submit({"name": "box", "kind": "instance", "billing": f"plan:{plan}", "command": "exec sleep 600",
                         "resources": {"gpu": "H20", "gpus": 8}})  # fmt: skip
    assert platform.until(w["id"], lambda w: w["state"] == "running")["gpus"] == 8
    platform.api.post(f"{WL}/box/stop", headers=platform.tenant.headers)
    platform.until(w["id"], lambda w: w["state"] == "stopped")
    r = platform.api.post(f"{WL}/box/start", json={"no_gpu": True}, headers=platform.tenant.headers)
    assert r.status_code == 200 and r.json()["state"] == "pending"
    cpu = platform.until(w["id"], lambda w: w["state"] == "running")
    assert cpu["gpus"] == 0 and cpu["spec"]["resources"]["gpus"] == 0 and cpu["spec"]["billing"] == "on-demand"
    alloc = cpu["allocation"]  # the CPU price (1 core, 2 GiB), not the plan's GPUs
    assert alloc["gpu_model"] is None and alloc["billing_mode"] == "on-demand"
    assert (alloc["cpu_milli"], alloc["memory_mib"]) == (1000, 2048)
    assert Decimal(alloc["rate_per_hour"]) == Decimal(alloc["host_rate_per_hour"]) > 0
    assert any("without GPUs" in e["reason"] for e in cpu["events"])
    disk = platform.sup.home / "workloads" / w["id"] / "disk"
    assert disk.is_dir()  # its own disk, on the node that runs it now
    platform.api.post(f"{WL}/box/stop", headers=platform.tenant.headers)
    platform.until(w["id"], lambda w: w["state"] == "stopped")
    r = platform.api.post(f"{WL}/box/start", headers=platform.tenant.headers)
    back = platform.until(w["id"], lambda w: w["state"] == "running")
    assert back["gpus"] == 8 and back["spec"]["billing"] == f"plan:{plan}" and back["allocation"]["gpu_model"] == "H20"
    assert back["attempt"] == 3
    with platform.db.read() as s:
        assert s.get(Plan, plan) is not None
    platform.api.post(f"{WL}/box/stop", headers=platform.tenant.headers)
    platform.until(w["id"], lambda w: w["state"] == "stopped")


def test_a_job_cannot_start_without_gpus(platform: Platform) -> None:
    w = platform.submit({"name": "j", "command": "x", "resources": {"gpu": "H20", "gpus": 8}})
    r = platform.api.post(f"{WL}/{w['id']}/start", json={"no_gpu": True}, headers=platform.tenant.headers)
    assert r.status_code == 409 and "only instances" in r.json()["detail"]
    r = platform.api.post(f"{WL}/{w['id']}/start", json={"no_gpu": "maybe"}, headers=platform.tenant.headers)
    assert r.status_code == 422 and "no_gpu" in r.text


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "one", "command": "x", "resources": {"gpu": "H20", "gpus": 8, "nodes": 1, "topology": "leaf"}},
        {"name": "cap", "kind": "instance", "command": "x", "max_price_per_hour": 1000, "resources": {"gpus": 2}},
        {"name": "cpu", "command": "x", "resources": {"gpus": 0}},
    ],
    ids=["gang", "price-ceiling", "cpu"],
)
def test_the_answer_to_a_submission_is_what_describe_shows_of_it(platform: Platform, spec: dict[str, Any]) -> None:
    """The 201 body is built from the queued row, not read back: it must agree with a fresh `describe`."""
    submitted = platform.submit(spec)
    described = platform.get(submitted["id"])
    assert submitted == described
    assert submitted["state"] == "pending" and Decimal(submitted["cost"]) == 0 and submitted["events"][0]["reason"]


def test_pending_work_says_why_and_where_it_is_in_the_queue(platform: Platform) -> None:
    big = platform.submit({"name": "big", "command": "x", "duration": 60, "resources": {"gpu": "H20", "gpus": 128}})
    platform.until(big["id"], lambda w: w["state"] == "running")
    waiting = [platform.submit({"name": f"w{i}", "command": "x", "resources": {"gpu": "H20", "gpus": 64,
                                                                            "topology": "leaf"}}) for i in range(2)]  # fmt: skip
    platform.tick()
    first, second = (platform.get(w["id"]) for w in waiting)
    assert first["state"] == second["state"] == "pending"
    assert "64" in first["pending"]["reason"], first["pending"]
    assert first["pending"]["position"] < second["pending"]["position"]
    platform.api.post(f"{WL}/{big['id']}/stop", headers=platform.tenant.headers)
    platform.until(waiting[0]["id"], lambda w: w["state"] == "running")
    platform.until(waiting[1]["id"], lambda w: w["state"] == "running")


def test_max_duration_stops_the_workload_with_the_reason(platform: Platform) -> None:
    w = platform.submit({"name": "long", "kind": "instance", "max_duration": "1s",
                         "resources": {"gpu": "H20", "gpus": 8}})  # fmt: skip
    done = platform.until(w["id"], finished)
    assert done["state"] == "stopped"
    assert "max_duration" in done["reason"]


def test_a_stopped_local_job_is_terminated(platform: Platform, tmp_path: Path) -> None:
    # The job runs sandboxed: it writes its marker in its own workdir, where the test finds it from outside.
    w = platform.submit({"name": "sleeper", "command": "touch started; exec sleep 60", "resources": {"gpus": 0}})
    marker = platform.sup.home / "workloads" / w["id"] / "workdir" / "started"
    platform.until(w["id"], lambda w: w["state"] == "running" and marker.exists())
    platform.api.post(f"{WL}/{w['id']}/stop", headers=platform.tenant.headers)
    done = platform.until(w["id"], finished, timeout=15)
    assert done["state"] == "stopped" and done["exit_code"] == -15


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"spec_yaml": "name: [unclosed"}, "spec"),
        ({"spec": {"name": "x", "command": "c", "resources": {"gpu": "NOPE-9000", "gpus": 1}}}, "resources.gpu"),
        ({"spec": {"name": "x", "command": "c", "resources": {"gpus": 1_000_000}}}, "resources.gpus"),
        ({"spec": {"name": "x", "command": "c", "max_duration": "-5m"}}, "max_duration"),
        ({"spec": {"name": "x", "command": "c", "workdir": "../../etc"}}, "workdir"),
        ({"spec": {"name": "x", "command": "c", "resources": {"gpu": "B200", "gpus": 1}}}, "resources.gpu"),
        ({"spec": {"name": "x", "command": "c", "resources": {"gpu": "H20", "gpus": 100_000}}}, "resources.gpus"),
        (
            {"spec": {"name": "x", "command": "c", "resources": {"gpus": 0}}, "workdir_archive": "***"},
            "workdir_archive",
        ),
        (
            {
                "spec": {"name": "x", "command": "c", "resources": {"gpus": 0}},
                "workdir_archive": archive({"../escape.txt": "x"}),
            },
            "workdir_archive",
        ),
        ({"spec": {"name": "x", "command": "c", "colour": "blue"}}, "colour"),
        (
            {
                "spec": {"name": "x", "command": "c", "workdir": "run.py", "resources": {"gpus": 0}},
                "workdir_archive": archive({"run.py": "print()"}),
            },
            "workdir",
        ),  # a file, not a directory
        (
            {"spec": {"name": "x", "command": "c", "resources": {"gpu": "H20", "gpus": 16, "topology": "nvlink"}}},
            "resources.topology",
        ),  # an H20 node is its own NVLink domain of 8
    ],
)
def test_bad_input_is_refused_naming_the_field(platform: Platform, body: dict[str, Any], field: str) -> None:
    r = platform.api.post(WL, json=body, headers=platform.tenant.headers)
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"], r.json()
    assert platform.api.get(WL, headers=platform.tenant.headers, params={"all": True}).json() == []


def test_a_balance_that_cannot_cover_the_hold_is_refused_with_402(platform: Platform) -> None:
    poor = signup(platform.api, "poor@example.com")
    r = platform.api.post(WL, json={"spec": {"name": "x", "command": "c", "resources": {"gpu": "H20", "gpus": 64}}},
                          headers=poor.headers)  # fmt: skip
    assert r.status_code == 402, r.text
    assert "top up" in r.json()["detail"]


def test_another_org_cannot_see_or_touch_a_workload(platform: Platform) -> None:
    w = platform.submit({"name": "mine", "command": "x", "resources": {"gpus": 0}})
    other = signup(platform.api, "other@example.com")
    for method, path in (("get", ""), ("get", "/logs"), ("post", "/stop"), ("post", "/start")):
        r = platform.api.request(method, f"{WL}/{w['id']}{path}", headers=other.headers)
        assert r.status_code == 404, (method, path, r.text)
    assert platform.api.get(WL, headers=other.headers, params={"all": True}).json() == []
    r = platform.api.post(WL, json={"spec": {"name": "x", "command": "c"}, "org": platform.tenant.org_id},
                          headers=other.headers)  # fmt: skip
    assert r.status_code == 404


def _t(s: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def test_spot_work_is_preempted_for_on_demand_work_and_requeued_by_its_retry_policy(platform: Platform) -> None:
    spot = platform.submit({"name": "spot", "kind": "instance", "billing": "spot",
                            "retry": {"on": ["preemption"], "limit": 1},
                            "resources": {"gpu": "H20", "gpus": 128}})  # fmt: skip
    platform.until(spot["id"], lambda w: w["state"] == "running")
    urgent = platform.submit({"name": "urgent", "command": "x", "duration": 60,
                              "resources": {"gpu": "H20", "gpus": 64, "topology": "leaf"}})  # fmt: skip
    running = platform.until(urgent["id"], lambda w: w["state"] == "running")
    assert sum(len(g) for g in running["allocation"]["nodes"].values()) == 64
    victim = platform.until(spot["id"], lambda w: w["state"] == "pending" and w["attempt"] == 1)
    reasons = [(e["state"], e["reason"]) for e in victim["events"]]
    assert any(s == "preempted" and f"urgent ({urgent['id']})" in r for s, r in reasons), reasons
    assert any(s == "pending" and "retry 1/1 after preemption" in r for s, r in reasons), reasons
    assert "128" in victim["pending"]["reason"]  # waits for the whole cluster again
    states = [e["state"] for e in victim["events"]]
    assert states[-2:] == ["preempted", "pending"], states


def test_a_retried_workload_keeps_its_place_in_the_queue_and_waits_from_its_requeue(platform: Platform) -> None:
    """As in `suanli sim`: a preempted workload retried by its policy queues ahead of work submitted after it (its
    place is `submitted_at`), while its wait for a starvation reservation counts from the requeue (`queued_at`)."""
    from suanli.db.models import Workload

    retry = {"on": ["preemption"], "limit": 1}
    first = platform.submit({"name": "first", "kind": "instance", "billing": "spot", "retry": retry,
                             "resources": {"gpu": "H20", "gpus": 128}})  # fmt: skip
    platform.until(first["id"], lambda w: w["state"] == "running")
    later = platform.submit({"name": "later", "kind": "instance", "billing": "spot",
                             "resources": {"gpu": "H20", "gpus": 128}})  # fmt: skip
    blocker = platform.submit({"name": "urgent", "kind": "instance", "resources": {"gpu": "H20", "gpus": 64}})
    platform.until(blocker["id"], lambda w: w["state"] == "running")
    platform.until(first["id"], lambda w: w["state"] == "pending" and w["attempt"] == 1)
    platform.tick()
    position = {w: platform.get(w)["pending"]["position"] for w in (first["id"], later["id"])}
    assert position[first["id"]] < position[later["id"]], position
    with platform.db.read() as s:
        row = s.get(Workload, first["id"])
        assert row.submitted_at == row.created_at < row.queued_at
    req = next(r for k, r in platform.sched.requests.items() if k[:2] == (first["id"], 1))  # the retry's request
    assert req.waiting_since > req.submit_time


def test_the_pass_after_a_placement_reuses_the_request_it_placed(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass reads the specs of newly opened allocations only when it did not place them itself: the request it
    queued is found again although the placement counted the attempt up."""
    from suanli.control.scheduling import placing

    held = platform.submit({"name": "held", "kind": "instance", "resources": {"gpu": "H20", "gpus": 8}})
    platform.until(held["id"], lambda w: w["state"] == "running")
    first = platform.submit({"name": "first", "kind": "instance", "resources": {"gpu": "H20", "gpus": 8}})
    read: list[list[str]] = []
    real = placing.specs_of
    monkeypatch.setattr(placing, "specs_of", lambda s, ids: read.append(list(ids)) or real(s, ids))
    platform.tick()  # places `first`
    platform.submit({"name": "second", "kind": "instance", "resources": {"gpu": "H20", "gpus": 8}})
    platform.tick()  # snapshots `first`'s new allocation, then queues `second`
    assert first["id"] not in [wid for ids in read[1:] for wid in ids], read


def test_a_workload_stops_when_its_org_runs_out_of_money(platform: Platform) -> None:
    from suanli.billing.ledger import REVENUE, org_account, transfer
    from suanli.control.money import ledger

    w = platform.submit({"name": "spender", "kind": "instance", "resources": {"gpu": "H20", "gpus": 8}})
    platform.until(w["id"], lambda w: w["state"] == "running")
    platform.sup.balance_grace_minutes = 1
    with platform.db.write() as s, s.begin():  # the org spends its balance elsewhere
        have = ledger.org_balance(s, platform.tenant.org_id)
        tx = transfer("drain", "usage", org_account(platform.tenant.org_id), REVENUE, have + 100, "drain")
        ledger.post(
            s, tx, utcnow(), org_id=platform.tenant.org_id, allow_negative=[org_account(platform.tenant.org_id)]
        )
    done = platform.until(w["id"], lambda w: w["state"] == "stopped")
    assert "balance exhausted" in done["reason"], done["reason"]


def test_a_plans_gpus_run_without_per_second_charges(platform: Platform) -> None:
    r = platform.api.post(f"/api/v1/orgs/{platform.tenant.org_id}/plans", headers=platform.tenant.headers,
                          json={"plan": "hourly", "gpu": "H20", "gpus": 8})  # fmt: skip
    assert r.status_code == 201, r.text
    plan = r.json()["id"]
    w = platform.submit({"name": "planned", "command": "x", "duration": 1, "billing": f"plan:{plan}",
                         "resources": {"gpu": "any", "gpus": 8}})  # fmt: skip
    done = platform.until(w["id"], finished)
    assert done["state"] == "succeeded"
    assert done["allocation"]["billing_mode"] == f"plan:{plan}" and Decimal(done["allocation"]["rate_per_hour"]) == 0
    assert Decimal(done["cost"]) == 0
    r = platform.api.post(
        WL,
        headers=platform.tenant.headers,
        json={
            "spec": {
                "name": "too-big",
                "command": "x",
                "billing": f"plan:{plan}",
                "resources": {"gpu": "H20", "gpus": 16},
            }
        },
    )
    assert r.status_code == 422 and "plan" in r.json()["detail"], r.text


class ServerDied(BaseException):
    """Stands for the server process dying (nothing in it catches a BaseException)."""


def test_a_server_dying_while_launching_re_attaches_instead_of_launching_twice(
    platform: Platform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from suanli.control.scheduling.clock import seconds
    from suanli.control.workloads import supervisor

    w = platform.submit({"name": "once", "command": "echo x >> launches; sleep 1", "resources": {"gpus": 0}})
    launches = platform.sup.home / "workloads" / w["id"] / "workdir" / "launches"  # its own, seen from outside
    platform.sched.run(platform.db, utcnow())

    def launch_then_die(self: Supervisor, db: Any, wid: str, launch: Any, now: Any, report: Any) -> None:
        handle = self.executor("local").launch(launch, seconds(now))
        supervisor._write_handle(launch.log_dir, handle)
        raise ServerDied  # after the processes started, before their handle reached the database

    monkeypatch.setattr(Supervisor, "_start", launch_then_die)
    with pytest.raises(ServerDied):
        platform.sup.run(platform.db, utcnow())
    assert platform.get(w["id"])["state"] == "starting"
    monkeypatch.undo()
    platform.sup = Supervisor(platform.sup.home, grace_s=1.0)  # the restarted server's supervisor
    done = platform.until(w["id"], finished)
    assert done["state"] == "succeeded"
    assert launches.read_text() == "x\n", "launched once"
    assert any("re-attached" in e["reason"] for e in done["events"])


def test_a_run_that_ended_while_the_server_was_down_mid_launch_is_billed_to_its_end(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI's crash loop: a run launched just before a kill -9 ended while the server was down; the restarted server
    re-attached it and took the re-attach as its start, so its end was moved up to it: 11 s billed past the end."""
    import time

    from suanli.control.scheduling.clock import seconds
    from suanli.control.workloads import supervisor
    from suanli.db.models import Allocation

    w = platform.submit({"name": "quick", "command": "true", "resources": {"gpus": 0}})
    platform.sched.run(platform.db, utcnow())

    def launch_then_die(self: Supervisor, db: Any, wid: str, launch: Any, now: Any, report: Any) -> None:
        supervisor._write_handle(launch.log_dir, self.executor("local").launch(launch, seconds(now)))
        raise ServerDied

    monkeypatch.setattr(Supervisor, "_start", launch_then_die)
    with pytest.raises(ServerDied):
        platform.sup.run(platform.db, utcnow())
    monkeypatch.undo()
    time.sleep(4)  # the server is down; the run ends meanwhile
    platform.sup = Supervisor(platform.sup.home, grace_s=1.0)
    done = platform.until(w["id"], finished)
    assert done["state"] == "succeeded" and any("re-attached" in e["reason"] for e in done["events"])
    with platform.db.read() as s:
        a = s.get(Allocation, f"{w['id']}.1")
        held = (a.stopped_at - a.started_at).total_seconds()
    assert held < 2.5, f"billed {held:.1f} s for a run that ended at once"


def test_a_virtual_job_runs_as_long_as_the_performance_model_predicts_on_its_placement(platform: Platform) -> None:
    from suanli.topology import presets
    from suanli.topology.spec import parse
    from suanli.workloads import parse_spec
    from suanli.workloads.runtime import predicted_runtime

    spec = {"name": "modelled", "command": "train", "resources": {"gpu": "H20", "gpus": 8},
            "model": {"preset": "llama3.1-8b", "precision": "bf16", "tokens": 20_000}}  # fmt: skip
    w = platform.submit(spec)
    done = platform.until(w["id"], finished)
    assert done["state"] == "succeeded"
    assert "performance model predicts" in done["events"][1]["reason"]
    cluster = parse(presets.preset_spec("h20-roce800-128"))
    index = {f"h20-roce800-128.{cluster.node_name(i)}": i for i in range(cluster.n_nodes)}
    gpus = [cluster.gpus_of_node(index[n]).start + g for n, gs in done["allocation"]["nodes"].items() for g in gs]
    predicted = predicted_runtime(parse_spec(spec), cluster, gpus)
    assert predicted is not None and 0.2 < predicted < 20
    a = done["allocation"]
    held = (_t(a["stopped_at"]) - _t(a["started_at"])).total_seconds()
    assert predicted <= held < predicted + 2.0  # ends by the model's clock (plus at most a pass of lag before launch)


def test_a_priority_swap_moves_the_queue_place_not_the_time_waited() -> None:
    """A high-priority workload takes its org's oldest queue slot, but not the waiting time that slot's workload
    has built up (which earns a starvation reservation); that one keeps its own."""
    sp = SchedulingPass()
    old, new = Request("old", 1, 100.0, tenant="org"), Request("new", 1, 5_000.0, tenant="org")
    sp._rank.update(old=1, new=2)
    swapped = {r.id: r for r in sp._by_priority([old, new])}
    assert (swapped["new"].submit_time, swapped["old"].submit_time) == (100.0, 5_000.0)
    assert (swapped["new"].waiting_since, swapped["old"].waiting_since) == (5_000.0, 100.0)


def test_priority_reorders_an_orgs_own_queue_and_never_jumps_another_org(platform: Platform) -> None:
    blocker = platform.submit({"name": "blocker", "kind": "instance", "resources": {"gpu": "H20", "gpus": 128}})
    platform.until(blocker["id"], lambda w: w["state"] == "running")
    other = signup(platform.api, "other@example.com")
    platform.topup(other.org_id, "5000")

    def big(name: str, priority: str, who: Tenant | None = None) -> str:
        spec = {"name": name, "command": "x", "priority": priority, "resources": {"gpu": "H20", "gpus": 128}}
        return str(platform.submit(spec, who)["id"])

    low = big("mine-low", "low")
    theirs = big("theirs", "normal", other)
    high = big("mine-high", "high")
    platform.tick()
    position = {wid: platform.get(wid, who)["pending"]["position"] for wid, who in
                ((low, None), (theirs, other), (high, None))}  # fmt: skip
    assert position[high] < position[theirs] < position[low], position


def test_a_plans_gpus_are_capped_at_its_size_and_end_with_it(platform: Platform) -> None:
    from datetime import timedelta

    from suanli.db.models import Plan

    r = platform.api.post(f"/api/v1/orgs/{platform.tenant.org_id}/plans", headers=platform.tenant.headers,
                          json={"plan": "hourly", "gpu": "H20", "gpus": 8})  # fmt: skip
    plan = r.json()["id"]
    spec = {"kind": "instance", "billing": f"plan:{plan}", "resources": {"gpu": "H20", "gpus": 8}}
    first = platform.submit({"name": "first", **spec})
    second = platform.submit({"name": "second", **spec})
    platform.until(first["id"], lambda w: w["state"] == "running")
    platform.tick()
    waiting = platform.get(second["id"])
    assert waiting["state"] == "pending" and f"waits for plan {plan}" in waiting["pending"]["reason"], waiting
    r = platform.api.post(
        WL,
        headers=platform.tenant.headers,
        json={
            "spec": {
                "name": "elastic",
                "command": "x",
                "billing": f"plan:{plan}",
                "resources": {"gpus": {"min": 8, "max": 64}},
            }
        },
    )
    assert r.status_code == 422 and "may use 64" in r.json()["detail"], r.text
    from suanli.db.models import Workload

    with platform.db.write() as s, s.begin():  # the plan's hour is over (time moved; the launch set its deadline)
        end = utcnow() - timedelta(seconds=1)
        s.get(Plan, plan).ends_at = end
        assert s.get(Workload, first["id"]).deadline_at is not None  # the launch knew when the plan ends
        s.get(Workload, first["id"]).deadline_at = end
    ended = platform.until(first["id"], lambda w: w["state"] == "stopped")
    assert f"plan {plan} ended" in ended["reason"]
    refused = platform.until(second["id"], lambda w: "not active" in (w.get("pending") or {}).get("reason", ""))
    assert refused["state"] == "pending"


def test_a_preempted_instance_without_retries_is_listed_and_starts_again(platform: Platform) -> None:
    box = platform.submit({"name": "spot-box", "kind": "instance", "billing": "spot",
                           "resources": {"gpu": "H20", "gpus": 128}})  # fmt: skip
    platform.until(box["id"], lambda w: w["state"] == "running")
    urgent = platform.submit({"name": "urgent", "command": "x", "duration": 1,  # 64: evicting 128 is within 2x
                              "resources": {"gpu": "H20", "gpus": 64}})  # fmt: skip
    platform.until(box["id"], lambda w: w["state"] == "preempted")
    listed = [w["id"] for w in platform.api.get(WL, headers=platform.tenant.headers).json()]
    assert box["id"] in listed  # its disk is kept: it can start again
    platform.until(urgent["id"], finished)
    r = platform.api.post(f"{WL}/{box['id']}/start", headers=platform.tenant.headers)
    assert r.status_code == 200 and r.json()["state"] == "pending", r.text
    platform.until(box["id"], lambda w: w["state"] == "running" and w["attempt"] == 2)


def test_elastic_work_grown_past_the_orgs_quota_starts_smaller_not_never(platform: Platform) -> None:
    """The default policy grows elastic work into idle GPUs as it places it; admission then checks the grown
    size against the org's quota, and the workload starts at the most the quota admits."""
    r = platform.api.put(f"/api/v1/admin/orgs/{platform.tenant.org_id}/quota", headers=platform.admin,
                         json={"gpus": 12})  # fmt: skip
    assert r.status_code == 200, r.text
    w = platform.submit({"name": "stretchy", "command": "x", "duration": 600,
                         "model": {"preset": "llama3.1-8b", "precision": "bf16"},
                         "resources": {"gpu": "H20", "gpus": {"min": 4, "max": 32}}})  # fmt: skip
    running = platform.until(w["id"], lambda x: x["state"] == "running")
    placed = [e["reason"] for e in running["events"] if e["state"] == "scheduled"]
    assert running["allocation"]["gpus"] == 12, placed  # the most the quota admits: neither 4 nor the grown size
    assert sum(len(g) for g in running["allocation"]["nodes"].values()) == 12
    assert any("12 of" in x and "GPUs admitted" in x and "12 GPUs" in x for x in placed), placed


def test_nodes_is_a_hard_constraint_of_the_placement(platform: Platform) -> None:
    """Eight GPUs fit on one H20 node; asked for on two nodes they get four on each (one node-rank per node)."""
    one = platform.submit({"name": "one-node", "command": "x", "duration": 600,
                           "resources": {"gpu": "H20", "gpus": 8}})  # fmt: skip
    two = platform.submit({"name": "two-nodes", "command": "x", "duration": 600,
                           "resources": {"gpu": "H20", "gpus": 8, "nodes": 2}})  # fmt: skip
    one = platform.until(one["id"], lambda x: x["state"] == "running")
    two = platform.until(two["id"], lambda x: x["state"] == "running")
    assert [len(g) for g in one["allocation"]["nodes"].values()] == [8]
    assert [len(g) for g in two["allocation"]["nodes"].values()] == [4, 4]
    assert two["nodes"] == 2


def test_preempting_a_victim_already_stopping_gives_its_gpus_back_at_once(platform: Platform) -> None:
    """A victim that is stopping for another reason (its grace period running) still has its GPUs taken back
    when it is preempted: its allocation closes in that pass, so no GPU is held twice."""
    from suanli.db.models import Allocation, Workload

    box = platform.submit({"name": "spot-box", "kind": "instance", "billing": "spot",
                           "resources": {"gpu": "H20", "gpus": 128}})  # fmt: skip
    box = platform.until(box["id"], lambda w: w["state"] == "running")
    with platform.db.write() as s, s.begin():  # its owner asked it to stop; the supervisor has not finished it yet
        s.get(Workload, box["id"]).stop_requested = "stopped by its owner"
    urgent = platform.submit({"name": "urgent", "command": "x", "duration": 60,
                              "resources": {"gpu": "H20", "gpus": 64}})  # fmt: skip
    platform.sched.run(platform.db, utcnow())  # the pass that preempts (no supervisor step in between)
    with platform.db.read() as s:
        assert s.get(Workload, box["id"]).stop_requested == "stopped by its owner"  # that reason stands
        assert s.get(Allocation, box["allocation"]["id"]).stopped_at is not None
        held: list[tuple[str, int]] = []
        for a in s.query(Allocation).filter(Allocation.stopped_at.is_(None)):
            held += [(node, g) for node, gpus in a.placement.items() for g in gpus]
        assert len(held) == len(set(held))  # no GPU in two open allocations
    assert platform.get(urgent["id"])["state"] in ("scheduled", "starting", "running")


def test_no_gpu_is_given_to_waiting_work_while_a_grown_elastic_job_still_holds_it(platform: Platform) -> None:
    """The cycle may shrink a grown elastic job to make room for waiting work: the shrink is carried out (the job
    restarts at its minimum) and the waiting work gets the freed GPUs, and at no moment is a GPU in two open
    allocations."""
    grown = platform.submit({"name": "stretchy", "command": "x", "duration": 3600,
                             "model": {"preset": "llama3.1-8b", "precision": "bf16"},
                             "resources": {"gpu": "H20", "gpus": {"min": 8, "max": 128}}})  # fmt: skip
    running = platform.until(grown["id"], lambda x: x["state"] == "running")
    size = running["allocation"]["gpus"]
    assert size > 8, "the test needs a job grown past its minimum"
    free = 128 - size
    waiting = platform.submit({"name": "big", "command": "x", "duration": 60,
                               "resources": {"gpu": "H20", "gpus": free + 8}})  # fmt: skip
    sizes: list[int] = []
    for _ in range(4):
        platform.tick()
        held: dict[tuple[str, int], str] = {}
        for w in platform.api.get(WL, headers=platform.tenant.headers).json():
            alloc = w["allocation"]
            if alloc is None or alloc["stopped_at"] is not None:
                continue
            for node, gpus in alloc["nodes"].items():
                for g in gpus:
                    assert (node, g) not in held, f"{node}[{g}] held by {held[(node, g)]} and {w['name']}"
                    held[(node, g)] = w["name"]
        sizes.append(platform.get(grown["id"])["allocation"]["gpus"])
    assert min(sizes) == 8  # shrunk to its minimum for the waiting work (then grown again into what is idle)
    assert platform.get(waiting["id"])["state"] in ("scheduled", "starting", "running")
    assert sizes[-1] <= 128 - (free + 8)
