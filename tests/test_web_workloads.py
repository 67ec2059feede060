"""The console's workload pages in-process, on SQLite and PostgreSQL: the list and its toggle, a workload's page
(state, events, pending reason, where, cost growing, logs appended from an offset, per-GPU series), stop and
scale through CSRF-checked forms, and another tenant's workload refused on every route.

The loops are off in the `api` fixture: the test runs a scheduling pass, the supervisor (the virtual executor
writes its log) and the telemetry ticker (simulated GPUs of the virtual cluster report samples) itself."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.control.ids import utcnow
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.control.telemetry.telemetry_loop import TelemetryTicker
from suanli.control.workloads.supervisor import Supervisor
from tests.control_plane import admin_token, bearer
from tests.web_helpers import Console, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)

API = "/api/v1"
EN = {"Accept-Language": "en"}


class World:
    """The in-process app with a virtual RTX 4090 box, and the loops run by hand."""

    def __init__(self, api: TestClient) -> None:
        self.api = api
        admin = bearer(admin_token(api))
        r = api.post(f"{API}/admin/clusters", json={"preset": "rtx4090-box"}, headers=admin)
        assert r.status_code == 201, r.text
        srv = api.app.state.server  # type: ignore[attr-defined]
        self.db, self.sched = srv.db, SchedulingPass()
        self.sup = Supervisor(srv.settings.home, grace_s=0.0)
        self.ticker = TelemetryTicker(srv.db, srv.settings, owner="test-telemetry")

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            now = utcnow()
            self.sched.run(self.db, now)
            self.sup.run(self.db, now)
            self.ticker.tick(now)

    def tenant(self, email: str) -> tuple[Console, dict[str, str]]:
        """A signed-in console (its own cookie jar) and the same session's token for direct API calls."""
        client = TestClient(self.api.app)
        c = Console(client)
        c.signup(email)
        return c, bearer(client.cookies.get("suanli_session"))

    def submit(self, who: dict[str, str], yaml: str) -> dict[str, Any]:
        r = self.api.post(f"{API}/workloads", json={"spec_yaml": yaml}, headers=who)
        assert r.status_code == 201, r.text
        return r.json()

    def running(self, who: dict[str, str], wid: str) -> dict[str, Any]:
        for _ in range(10):
            self.tick()
            w = self.api.get(f"{API}/workloads/{wid}", headers=who).json()
            if w["state"] == "running":
                return w
        raise AssertionError(w)


JOB = "name: train\ncommand: python train.py\nresources: {gpu: RTX-4090, gpus: 2}\n"
ELASTIC = "name: elastic\ncommand: python train.py\nresources: {gpu: RTX-4090, gpus: {min: 1, max: 4}}\n"


@pytest.fixture
def world(api: TestClient) -> World:
    return World(api)


def test_the_list_shows_running_work_and_the_toggle_adds_finished(world: World) -> None:
    c, who = world.tenant("list@example.com")
    a = world.submit(who, JOB)
    b = world.submit(who, JOB.replace("train\n", "done\n", 1))
    world.running(who, a["id"])
    assert world.api.post(f"{API}/workloads/{b['id']}/stop", headers=who).status_code == 200
    world.tick(2)
    page = c.get("/workloads", headers=EN)
    assert page.status_code == 200
    assert f"/workloads/{a['id']}" in page.text and f"/workloads/{b['id']}" not in page.text
    assert "running" in page.text and "RTX-4090" in page.text and "/h" in page.text
    every = c.get("/workloads?all=true", headers=EN).text
    assert f"/workloads/{b['id']}" in every and "stopped" in every and "Show running only" in every


def test_a_pending_workload_shows_its_reason_and_events(world: World) -> None:
    c, who = world.tenant("pending@example.com")
    w = world.submit(who, "name: big\ncommand: x\nresources: {gpu: RTX-4090, gpus: 8}\n")
    html = c.get(f"/workloads/{w['id']}", headers=EN).text
    assert 'id="pending"' in html and "waiting for the next scheduling cycle" in html and "submitted" in html
    world.running(who, w["id"])
    events = c.get(f"/_/workloads/{w['id']}/events", headers=EN).text  # the events the page polls
    assert "submitted" in events and "placed: 8 x RTX-4090" in events and "state-running" in events
    queued = world.submit(who, "name: second\ncommand: x\nresources: {gpu: RTX-4090, gpus: 8}\n")
    world.tick()
    api_says = world.api.get(f"{API}/workloads/{queued['id']}", headers=who).json()["pending"]
    frag = c.get(f"/_/workloads/{queued['id']}/status", headers=EN).text
    assert 'id="pending"' in frag and api_says["reason"] in frag.replace("&#39;", "'")
    if api_says["position"] is not None:
        assert f"queue position {api_says['position']}" in frag


def test_a_running_workload_shows_where_it_runs_its_cost_growing_its_gpus_and_its_log(world: World) -> None:
    c, who = world.tenant("run@example.com")
    w = world.running(who, world.submit(who, JOB)["id"])
    html = c.get(f"/workloads/{w['id']}", headers=EN).text
    node = next(iter(w["allocation"]["nodes"]))
    assert 'id="where"' in html and node in html and 'id="stop"' in html and "/static/vendor/uPlot" in html

    def exact() -> str:
        frag = c.get(f"/_/workloads/{w['id']}/status", headers=EN).text
        return frag.split('data-exact="', 1)[1].split('"', 1)[0]

    first = exact()
    time.sleep(1.1)
    assert float(exact()) > float(first) >= 0  # the fragment the page polls: the cost grows while it runs

    world.tick(3)
    series = c.get(f"/_/workloads/{w['id']}/metrics").json()["gpus"]
    assert len(series) == 2 and all(len(g["points"]) >= 1 for g in series)
    t, util, temp, mem = series[0]["points"][-1]
    assert isinstance(t, str) and util > 0 and temp > 0 and mem >= 0

    log = c.get(f"/_/workloads/{w['id']}/logs?offset=0").text
    api_log = world.api.get(f"{API}/workloads/{w['id']}/logs", headers=who).json()
    assert api_log["data"] and api_log["data"].splitlines()[0] in log.replace("&#39;", "'")
    nxt = api_log["next_offset"]
    assert f"offset={nxt}" in log  # the poller reads on from where this chunk stopped
    rest = c.get(f"/_/workloads/{w['id']}/logs?offset={nxt}").text
    assert api_log["data"].splitlines()[0] not in rest and "hx-get" in rest  # nothing twice; still polling


def test_stop_is_a_csrf_checked_form(world: World) -> None:
    c, who = world.tenant("stop@example.com")
    w = world.running(who, world.submit(who, JOB)["id"])
    r = c.c.post(f"/workloads/{w['id']}/stop", data={}, follow_redirects=False)
    assert r.status_code == 403
    r = c.c.post(f"/workloads/{w['id']}/stop", data={"csrf": "0" * 40}, follow_redirects=False)
    assert r.status_code == 403
    assert world.api.get(f"{API}/workloads/{w['id']}", headers=who).json()["state"] == "running"
    r = c.post(f"/workloads/{w['id']}/stop", csrf_from=f"/workloads/{w['id']}")
    assert r.status_code == 303 and r.headers["location"] == f"/workloads/{w['id']}"
    world.tick(2)
    assert world.api.get(f"{API}/workloads/{w['id']}", headers=who).json()["state"] == "stopped"
    again = c.post(f"/workloads/{w['id']}/stop", csrf_from=f"/workloads/{w['id']}", headers=EN)
    assert again.status_code in (200, 303, 409) and again.status_code != 500


@pytest.mark.parametrize(("gpus", "says"), [("0", "greater than or equal to 1"), ("abc", "integer"),
                                            ("9" * 40, "less than or equal"), ("", "integer")])  # fmt: skip
def test_scale_shows_the_apis_message_at_the_field(world: World, gpus: str, says: str) -> None:
    c, who = world.tenant("scale@example.com")
    w = world.running(who, world.submit(who, ELASTIC)["id"])
    r = c.post(f"/workloads/{w['id']}/scale", {"gpus": gpus}, csrf_from=f"/workloads/{w['id']}", headers=EN)
    assert r.status_code == 422, r.text
    err = r.text.split('id="gpus-error">', 1)[1].split("</div>", 1)[0]
    assert says in err.lower() or says in err, err


def test_scale_resizes_elastic_work_and_refuses_rigid_work_with_its_reason(world: World) -> None:
    c, who = world.tenant("scale2@example.com")
    w = world.running(who, world.submit(who, ELASTIC)["id"])
    r = c.post(f"/workloads/{w['id']}/scale", {"gpus": "2"}, csrf_from=f"/workloads/{w['id']}")
    assert r.status_code == 303
    assert world.api.get(f"{API}/workloads/{w['id']}", headers=who).json()["scale_to"] == 2
    rigid = world.running(who, world.submit(who, JOB)["id"])
    r = c.post(f"/workloads/{rigid['id']}/scale", {"gpus": "1"}, csrf_from=f"/workloads/{rigid['id']}", headers=EN)
    assert r.status_code == 409 and 'id="gpus-error"' in r.text


def test_another_tenants_workload_is_refused_on_every_route(world: World) -> None:
    _, owner = world.tenant("owner@example.com")
    w = world.running(owner, world.submit(owner, JOB)["id"])
    thief, _ = world.tenant("thief@example.com")
    for path in (f"/workloads/{w['id']}", f"/_/workloads/{w['id']}/status", f"/_/workloads/{w['id']}/logs",
                 f"/_/workloads/{w['id']}/metrics", f"/_/workloads/{w['id']}/events", "/workloads/..%2Fworkloads"):  # fmt: skip
        r = thief.get(path)
        assert r.status_code == 404, (path, r.status_code)
        assert "python train.py" not in r.text and w["allocation"]["nodes"].__iter__().__next__() not in r.text
    for action, data in (("stop", {}), ("scale", {"gpus": "1"}), ("start", {})):
        r = thief.post(f"/workloads/{w['id']}/{action}", data, csrf_from="/workloads")
        assert r.status_code == 404, (action, r.status_code)
    assert "owner" not in thief.get("/workloads?all=true").text
    assert world.api.get(f"{API}/workloads/{w['id']}", headers=owner).json()["state"] == "running"


def test_workload_pages_need_a_session(world: World) -> None:
    anon = TestClient(world.api.app)
    for path in ("/workloads", "/workloads/wl_0000000000000000", "/_/workloads/x/logs"):
        r = anon.get(path, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login"), path


# ---- /run: the form and the YAML editor -------------------------------------------------------------------------
def test_the_form_submits_a_job_and_goes_to_its_page(world: World) -> None:
    c, who = world.tenant("form@example.com")
    page = c.get("/run", headers=EN)
    assert page.status_code == 200 and '<option value="RTX-4090"' in page.text and 'id="spec_yaml"' in page.text
    r = c.post("/run", {"name": "from-form", "kind": "job", "command": "python a.py", "gpu": "RTX-4090",
                        "gpus": "2", "billing": "on-demand", "env": "A=1\nB = two"}, csrf_from="/run")  # fmt: skip
    assert r.status_code == 303 and r.headers["location"].startswith("/workloads/wl_"), r.text
    w = world.api.get(f"{API}{r.headers['location']}", headers=who).json()
    assert (w["name"], w["gpus"], w["gpu"], w["kind"]) == ("from-form", 2, "RTX-4090", "job")
    assert w["spec"]["env"] == {"A": "1", "B": "two"}


def test_the_yaml_editor_posts_the_spec_the_cli_posts(world: World) -> None:
    c, who = world.tenant("yaml@example.com")
    text = "name: from-yaml\nkind: instance\nresources: {gpu: RTX-4090, gpus: 1}\n"
    r = c.post("/run/yaml", {"spec_yaml": text}, csrf_from="/run")
    assert r.status_code == 303, r.text
    w = world.api.get(f"{API}{r.headers['location']}", headers=who).json()
    assert (w["name"], w["kind"], w["gpus"]) == ("from-yaml", "instance", 1)


@pytest.mark.parametrize(
    ("form", "field", "says"),
    [({"gpus": "abc"}, "gpus", "whole number"), ({"command": ""}, "command", "required for a job"),
     ({"gpu": "NOPE-9000"}, "gpu", "NOPE-9000"), ({"name": ""}, "name", ""), ({"env": "novalue"}, "env", "KEY=VALUE"),
     ({"billing": "free"}, "billing", ""), ({"duration": "forever"}, "duration", "")],
)  # fmt: skip
def test_form_errors_are_shown_at_their_field(world: World, form: dict[str, str], field: str, says: str) -> None:
    c, _ = world.tenant("fields@example.com")
    data = {"name": "x", "kind": "job", "command": "c", "gpu": "RTX-4090", "gpus": "1", "billing": "on-demand",
            **form}  # fmt: skip
    r = c.post("/run", data, csrf_from="/run", headers=EN)
    assert r.status_code in (400, 422), r.text[:300]
    assert f'id="{field}-error"' in r.text, r.text[r.text.find("<main>") :][:1500]
    shown = r.text.split(f'id="{field}-error">', 1)[1].split("</div>", 1)[0]
    assert says in shown.replace("&#39;", "'"), shown
    assert f'value="{data["command"]}"' in r.text  # the form comes back as typed


HOSTILE = {
    "a list": "- a\n- b\n",
    "a scalar": "just text",
    "empty": "",
    "anchors": "a: &a [1,2,3,4,5,6,7,8,9]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n",
    "wrong types": "name: [1, 2]\ncommand: {a: b}\nresources: {gpus: '8'}\n",
    "tags": "name: !!python/object/apply:os.system ['true']\ncommand: x\n",
    "deep": "a: " + "[" * 5000 + "]" * 5000 + "\n",
    "bad utf-8 escapes": 'name: "\\udcff"\ncommand: x\n',
    "huge": "name: x\ncommand: " + "y" * 300_000 + "\n",
    "nul": "name: a\x00b\ncommand: x\n",
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_yaml_is_refused_with_a_message_never_a_500(world: World, text: str) -> None:
    c, who = world.tenant("hostile@example.com")
    r = c.post("/run/yaml", {"spec_yaml": text}, csrf_from="/run", headers=EN)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code != 413:  # past the server's body limit the request never reaches the page
        assert 'id="yaml-error"' in r.text
    assert world.api.get(f"{API}/workloads?all=true", headers=who).json() == []


def test_run_forms_need_their_csrf_token(world: World) -> None:
    c, who = world.tenant("csrf-run@example.com")
    c.get("/run")
    assert c.c.post("/run", data={"name": "x", "command": "c", "gpus": "0"}).status_code == 403
    assert c.c.post("/run/yaml", data={"spec_yaml": "name: x\ncommand: c\n", "csrf": "f" * 40}).status_code == 403
    assert world.api.get(f"{API}/workloads?all=true", headers=who).json() == []
