"""Workloads in the SDK and the CLI against a scripted stand-in server (httpx.MockTransport).

The stand-in answers as the API contract says (routes, JSON shapes); what the real server does with a workload
is tested end to end elsewhere. Here: what the client sends, how it reads answers, and how the CLI behaves.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

import suanli.client
import suanli.workdir_upload
from suanli.cli import workload_views
from suanli.cli import workloads as cli_workloads
from suanli.client import ApiError, Client, LogChunk, Workload, WorkloadAllocation, pack_workdir
from tests.cli_helpers import invoke

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WL = "wl_7f3a9c0e12b4d5a6"
WORKDIRS = "/api/v1/workdirs"
T0 = "2025-03-01T08:00:00+00:00"


def workload(state: str = "pending", **over: Any) -> dict[str, Any]:
    """A Workload document as the list answers it (no events, no spec)."""
    doc = {
        "id": WL, "name": "hello", "kind": "job", "org_id": "org_a", "user_id": "usr_a", "state": state,
        "reason": "submitted", "created_at": T0, "started_at": None, "finished_at": None, "gpu": "H20",
        "gpus": 16, "nodes": 2, "attempt": 1, "exit_code": None, "pending": None, "allocation": None,
        "cost": "0.00000000", "rate_per_hour": None, "currency": "CNY",
    }  # fmt: skip
    return doc | over


ALLOCATION = {
    "id": "al_1", "gpu_model": "H20", "gpus": 16, "milli": 1000,
    "nodes": {"h20-roce800-128.h20-0001": list(range(8)), "h20-roce800-128.h20-0002": list(range(8))},
    "rate_per_hour": "123.00", "billing_mode": "on-demand", "started_at": "2025-03-01T08:01:00+00:00",
    "stopped_at": None,
}  # fmt: skip
PENDING = {"reason": "needs 64 H100 on one leaf; largest free block is 40", "position": 3}
EVENTS = [
    {"at": T0, "state": "pending", "reason": "submitted"},
    {"at": "2025-03-01T08:01:00+00:00", "state": "running", "reason": "started on 2 nodes"},
]


class FakeServer:
    """Answers /api/v1 workload routes from scripts: `states` are what successive GETs of the workload return
    (the last one repeats), `chunks` what successive log reads return."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.states: list[dict[str, Any]] = [workload()]
        self.listing: list[dict[str, Any]] = [workload()]
        self.chunks: list[tuple[str, bool]] = [("", True)]
        self.interrupt_logs = False
        self.uploads: dict[str, tuple[str | None, bytes]] = {}  # POST /workdirs: id -> (org, .tar.gz)

    @property
    def bodies(self) -> list[Any]:
        return [json.loads(r.content) for r in self.requests if r.method == "POST" and r.url.path != WORKDIRS]

    def calls(self, prefix: str = "/api/v1/workloads") -> list[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests if r.url.path.startswith(prefix)]

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        assert request.headers["authorization"] == "Bearer sl_test"
        path = request.url.path.removeprefix("/api/v1")
        parts = path.strip("/").split("/")
        if request.method == "POST" and request.url.path == WORKDIRS:
            assert request.headers["content-type"] == "application/octet-stream"
            upload_id = f"wd_{len(self.uploads):016x}"
            self.uploads[upload_id] = (request.url.params.get("org"), request.content)
            return httpx.Response(201, json={"id": upload_id, "org_id": "org_a", "bytes": 4096, "files": 1,
                                             "expires_at": T0})  # fmt: skip
        if request.method == "GET" and path == "/me":  # the caller: the workloads' submitter (`logs` asks)
            user = {"id": "usr_a", "email": "a@example.com", "is_admin": False, "personal_org_id": "org_a",
                    "created_at": T0}  # fmt: skip
            return httpx.Response(200, json={"user": user, "orgs": []})
        if parts[0] != "workloads":
            return httpx.Response(404, json={"detail": f"no route {path}"})
        if request.method == "POST" and len(parts) == 1:
            return httpx.Response(201, json=self.states[0])
        if request.method == "GET" and len(parts) == 1:
            return httpx.Response(200, json=self.listing)
        if len(parts) == 3 and parts[2] == "logs":
            if self.interrupt_logs:
                raise KeyboardInterrupt
            offset = int(request.url.params["offset"])
            data, done = self.chunks.pop(0) if len(self.chunks) > 1 else self.chunks[0]
            return httpx.Response(200, json={"data": data, "next_offset": offset + len(data.encode()), "done": done})
        if len(parts) == 3 and parts[2] == "start" and self.states[-1]["kind"] == "job":
            return httpx.Response(409, json={"detail": f"workload {WL} is a job; only instances start again"})
        if len(parts) == 3:  # stop, start
            return httpx.Response(200, json=self.states[-1])
        doc = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return httpx.Response(200, json=doc)


@pytest.fixture
def fake() -> FakeServer:
    return FakeServer()


@pytest.fixture
def client(fake: FakeServer) -> Iterator[Client]:
    with Client("http://suanli.test", "sl_test", transport=httpx.MockTransport(fake.handler)) as c:
        yield c


def archive_names(fake: FakeServer, body: dict[str, Any]) -> dict[str, bytes | None]:
    """Member names of the workdir uploaded for this submission, with file contents (None for directories)."""
    assert "workdir_archive" not in body
    org, raw = fake.uploads[body["workdir_upload"]]
    assert org == body.get("org"), "uploaded for the org that pays"
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else None) for m in tar}  # type: ignore[union-attr]


def make_workdir(root: Path) -> Path:
    for rel, text in {"train.py": "print(1)\n", "pkg/mod.py": "x = 1\n", "pkg/__pycache__/mod.pyc": "junk",
                      ".git/HEAD": "ref", "sub/.venv/bin/python": "elf", "data/.gitignore": "*\n"}.items():  # fmt: skip
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "empty").mkdir()
    return root


# ---- SDK ------------------------------------------------------------------------------------------------------
def test_submit_sends_the_spec_as_given(client: Client, fake: FakeServer, tmp_path: Path) -> None:
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: hello\ncommand: echo hi\n")
    client.submit({"name": "hello", "command": "echo hi"})
    client.submit("name: hello\ncommand: echo hi\n", org_id="org_team")
    w = client.submit(spec_file)
    assert fake.bodies == [
        {"spec": {"name": "hello", "command": "echo hi"}},
        {"spec_yaml": "name: hello\ncommand: echo hi\n", "org": "org_team"},
        {"spec_yaml": "name: hello\ncommand: echo hi\n"},
    ]
    assert fake.calls() == ["POST /api/v1/workloads"] * 3
    assert isinstance(w, Workload) and (w.id, w.state, w.gpus, w.cost) == (WL, "pending", 16, Decimal(0))
    with pytest.raises(ValueError, match=r"Path\('job.yaml'\)"):
        client.submit("job.yaml")
    with pytest.raises(TypeError):
        client.submit(42)  # type: ignore[arg-type]
    assert len(fake.requests) == 3


def test_submit_uploads_the_workdir_without_caches(client: Client, fake: FakeServer, tmp_path: Path) -> None:
    root = make_workdir(tmp_path / "proj")
    client.submit("name: hello\ncommand: python3 train.py\n", workdir=root)
    files = archive_names(fake, fake.bodies[0])
    assert fake.calls("/api/v1/") == ["POST /api/v1/workdirs", "POST /api/v1/workloads"], "uploaded, then named"
    assert files == {
        "train.py": b"print(1)\n", "pkg": None, "pkg/mod.py": b"x = 1\n", "data": None,
        "data/.gitignore": b"*\n", "sub": None, "empty": None,
    }  # fmt: skip
    assert pack_workdir(root) == pack_workdir(root)  # deterministic order, so retries send the same bytes


def test_workdir_over_the_limit_is_refused_before_sending(
    client: Client, fake: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert suanli.workdir_upload.WORKDIR_LIMIT == 64 << 20
    root = tmp_path / "big"
    root.mkdir()
    (root / "weights.bin").write_bytes(os.urandom(40_000))  # incompressible
    monkeypatch.setattr(suanli.workdir_upload, "WORKDIR_LIMIT", 32_000)
    with pytest.raises(ValueError, match=r"over 0.03\d* MiB compressed \(without .git, .venv, __pycache__\)"):
        client.submit("name: big\ncommand: 'true'\n", workdir=root)
    assert fake.requests == []
    (root / "weights.bin").write_bytes(bytes(40_000))  # compresses to almost nothing: fits
    client.submit("name: big\ncommand: 'true'\n", workdir=root)
    assert archive_names(fake, fake.bodies[0]) == {"weights.bin": bytes(40_000)}
    with pytest.raises(ValueError, match="not a directory"):
        pack_workdir(root / "weights.bin")


def test_list_and_describe_parse_the_contract(client: Client, fake: FakeServer) -> None:
    fake.listing = [workload("running", allocation=ALLOCATION, rate_per_hour="123.00", cost="2.05"),
                    workload("pending", id="wl_2", gpu=None, pending=PENDING)]  # fmt: skip
    running, waiting = client.workloads()
    assert isinstance(running.allocation, WorkloadAllocation) and running.events == [] and running.spec is None
    assert running.allocation.nodes["h20-roce800-128.h20-0002"] == tuple(range(8))
    assert (running.cost, running.rate_per_hour, running.allocation.rate_per_hour) == (
        Decimal("2.05"), Decimal("123.00"), Decimal("123.00"))  # fmt: skip
    assert waiting.pending is not None and (waiting.pending.position, waiting.gpu) == (3, None)
    assert not running.finished and not waiting.finished
    client.workloads(all=True, org_id="org_team")
    assert [dict(r.url.params) for r in fake.requests] == [{}, {"all": "true", "org": "org_team"}]

    fake.states = [workload("succeeded", events=EVENTS, spec={"name": "hello", "resources": {"gpus": 16}},
                            exit_code=0, finished_at="2025-03-01T08:01:12+00:00", future_field="ignored")]  # fmt: skip
    w = client.workload("hello@2")
    assert fake.requests[-1].url.raw_path == b"/api/v1/workloads/hello@2"  # one path segment, as _seg quotes it
    assert w.finished and w.exit_code == 0 and w.spec == {"name": "hello", "resources": {"gpus": 16}}
    assert [(e.state, e.reason) for e in w.events] == [("pending", "submitted"), ("running", "started on 2 nodes")]
    assert isinstance(w.events[1].at, datetime) and w.events[1].at.minute == 1
    assert suanli.client.jsonable(w)["events"][0] == {"at": T0, "state": "pending", "reason": "submitted"}


def test_follow_logs_reads_until_done(client: Client, fake: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    naps: list[float] = []
    monkeypatch.setattr(suanli.client.workloads.time, "sleep", naps.append)
    fake.states = [workload("running")]
    fake.chunks = [("step 1\n", False), ("", False), ("步 2\n", False), ("done\n", True), ("never", True)]
    assert list(client.follow_logs("hello", poll_s=0.5)) == ["step 1\n", "步 2\n", "done\n"]
    logs = [r for r in fake.requests if r.url.path.endswith("/logs")]
    assert fake.calls()[0] == "GET /api/v1/workloads/hello"  # the name is resolved once, then the id is used
    assert {r.url.path for r in logs} == {f"/api/v1/workloads/{WL}/logs"}
    assert [int(r.url.params["offset"]) for r in logs] == [0, 7, 7, 13]
    assert naps == [0.5]  # slept only when nothing new came
    assert client.logs(WL, offset=13, rank=1) == LogChunk("never", 18, True)
    assert fake.requests[-1].url.params["rank"] == "1"


def test_wait_stop_start(client: Client, fake: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(suanli.client.workloads.time, "sleep", lambda s: None)
    fake.states = [workload("pending"), workload("running"), workload("failed", exit_code=3)]
    assert client.wait("hello", poll_s=0).state == "failed"
    assert client.wait(WL, states={"failed"}).exit_code == 3
    fake.states = [workload("running")]
    with pytest.raises(TimeoutError, match=f"{WL} is still running"):
        client.wait(WL, timeout=0.01, poll_s=0)
    fake.states = [workload("stopped")]
    assert client.stop("hello").state == "stopped"
    with pytest.raises(ApiError) as e:
        client.start("hello")
    assert e.value.status == 409 and "only instances" in e.value.message
    assert fake.calls()[-2:] == ["POST /api/v1/workloads/hello/stop", "POST /api/v1/workloads/hello/start"]


# ---- CLI ------------------------------------------------------------------------------------------------------
@pytest.fixture
def cli(fake: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeServer:
    """The CLI with its Client talking to the stand-in, logged in by SUANLI_TOKEN, and no waiting between polls."""
    transport = httpx.MockTransport(fake.handler)

    class MockClient(Client):
        def __init__(self, server: str | None = None, token: str | None = None, **kw: Any) -> None:
            super().__init__(server, token, transport=transport)

    monkeypatch.setattr(suanli.client, "Client", MockClient)
    monkeypatch.setattr(cli_workloads, "POLL_S", 0)
    monkeypatch.setenv("SUANLI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SUANLI_SERVER", "http://suanli.test")
    monkeypatch.setenv("SUANLI_TOKEN", "sl_test")
    return fake


def test_run_uploads_a_jobs_workdir_from_the_spec(cli: FakeServer, tmp_path: Path) -> None:
    out = invoke(["run", str(EXAMPLES / "hello.yaml")])
    assert f"submitted {WL} (hello): pending" in out.stdout and f"suanli logs -f {WL}" in out.stdout
    body = cli.bodies[0]
    assert body["spec_yaml"] == (EXAMPLES / "hello.yaml").read_text()
    files = archive_names(cli, body)
    assert files["hello.py"] == (EXAMPLES / "hello.py").read_bytes() and "hello.yaml" in files

    proj = make_workdir(tmp_path / "proj")
    (proj / "job.yaml").write_text("name: t\ncommand: python3 mod.py\nworkdir: pkg\n")  # runs in proj/pkg
    doc = json.loads(invoke(["run", str(proj / "job.yaml"), "--json", "--org", "org_team"]).stdout)
    assert doc["id"] == WL and doc["state"] == "pending"
    uploaded = archive_names(cli, cli.bodies[1])
    assert cli.bodies[1]["org"] == "org_team" and {"train.py", "job.yaml", "pkg/mod.py"} <= set(uploaded)
    assert ".git/HEAD" not in uploaded and "pkg/__pycache__/mod.pyc" not in uploaded

    other = tmp_path / "other"
    (other / "pkg").mkdir(parents=True)
    (other / "pkg" / "x.py").write_text("x")
    invoke(["run", str(proj / "job.yaml"), "--workdir", str(other)])
    assert set(archive_names(cli, cli.bodies[2])) == {"pkg", "pkg/x.py"}
    bad = invoke(["run", str(proj / "job.yaml"), "--workdir", str(other / "pkg")], code=2)
    assert "is not a directory (it is looked for in --workdir" in bad.stderr
    (proj / "bare.yaml").write_text("name: t\ncommand: echo hi\n")
    invoke(["run", str(proj / "bare.yaml")])
    assert "workdir_upload" not in cli.bodies[-1]  # no workdir named: nothing uploaded
    assert len(cli.bodies) == 4 and len(cli.uploads) == 3


def test_run_refuses_bad_input_before_calling(cli: FakeServer, tmp_path: Path) -> None:
    instance = EXAMPLES / "instance.yaml"
    invoke(["run", str(instance)])
    assert "workdir_upload" not in cli.bodies[0] and cli.uploads == {}  # an instance uploads nothing
    bad = invoke(["run", str(instance), "--workdir", str(tmp_path)], code=2)
    assert bad.stderr.startswith("error: --workdir: only a job uploads a workdir")
    missing = tmp_path / "job.yaml"
    missing.write_text("name: t\ncommand: x\nworkdir: nowhere\n")
    assert "is not a directory" in invoke(["run", str(missing)], code=2).stderr
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    assert "a workload spec is a mapping" in invoke(["run", str(tmp_path / "list.yaml")], code=2).stderr
    assert "error: " in invoke(["run", str(tmp_path / "absent.yaml")], code=2).stderr
    assert "at most one of" in invoke(["run", str(instance), "-f", "--json"], code=2).stderr
    assert len(cli.bodies) == 1


def test_run_follow_shows_the_queue_then_the_log_then_the_end(cli: FakeServer) -> None:
    waiting = workload("pending", pending=PENDING)
    cli.states = [
        waiting, waiting, waiting | {"pending": {**PENDING, "position": 1}}, workload("scheduled", reason="placed"),
        workload("running", allocation=ALLOCATION, started_at="2025-03-01T08:01:00+00:00", reason="started"),
        workload("succeeded", started_at="2025-03-01T08:01:00+00:00", finished_at="2025-03-01T08:01:12+00:00",
                 exit_code=0, cost="0.41"),
    ]  # fmt: skip
    cli.chunks = [("hello\n", False), ("no newline", True)]
    out = invoke(["run", str(EXAMPLES / "leaf64.yaml"), "--follow"]).stdout
    lines = out.splitlines()
    assert lines.count(f"pending: {PENDING['reason']} (queue position 3)") == 1  # printed when it changes
    assert f"pending: {PENDING['reason']} (queue position 1)" in lines and "scheduled: placed" in lines
    assert "running on h20-roce800-128.h20-0001, h20-roce800-128.h20-0002: started" in lines
    assert workload_views.where({f"n{i}": (0,) for i in range(8)}) == "8 nodes (n0, n1, …)"
    assert lines[-3:] == ["hello", "no newline", f"{WL} succeeded in 12s, cost ¥0.41"]
    assert "workdir_upload" not in cli.bodies[0] and cli.uploads == {}  # leaf64 has no workdir


def test_run_follow_failure_and_detach(cli: FakeServer) -> None:
    cli.states = [workload("running"), workload("failed", exit_code=3, reason="exit code 3",
                                                started_at=T0, finished_at="2025-03-01T08:00:05+00:00")]  # fmt: skip
    cli.chunks = [("Traceback …\n", True)]
    out = invoke(["run", str(EXAMPLES / "leaf64.yaml"), "-f"], code=1)
    assert "Traceback …" in out.stdout
    assert out.stderr == f"error: {WL} failed (exit code 3) after 5s: exit code 3; cost ¥0.00\n"

    cli.states = [workload("stopped", reason="stopped by a@example.com")]  # stopped while it waited
    cli.chunks = [("", True)]
    out = invoke(["run", str(EXAMPLES / "leaf64.yaml"), "-f"], code=1)
    assert "stopped without starting: stopped by a@example.com" in out.stderr

    cli.states = [workload("running")]
    cli.interrupt_logs = True
    out = invoke(["run", str(EXAMPLES / "leaf64.yaml"), "-f"])
    assert out.stdout.splitlines()[-1] == f"detached; the workload keeps running: suanli logs -f {WL}"


def test_ps_and_describe(cli: FakeServer) -> None:
    cli.listing = [
        workload("running", allocation=ALLOCATION, started_at=T0, rate_per_hour="123.00", cost="2.05"),
        workload("pending", id="wl_2", name="big", gpu=None, gpus=64, pending=PENDING),
        workload("running", id="wl_3", name="cpu", gpu=None, gpus=0, nodes=1, started_at=T0),
    ]
    out = invoke(["ps"]).stdout
    for text in ("workloads (money in CNY)", "16×H20", "64×any", "123.00", "2.05", "needs 64 H100 on"):
        assert text in out, text
    assert all(w in out for w in (WL, "wl_2", "wl_3"))
    row = next(line for line in out.splitlines() if "wl_3" in line)
    assert " - " in row  # no GPUs
    assert [w["id"] for w in json.loads(invoke(["ps", "--json", "--all"]).stdout)] == [WL, "wl_2", "wl_3"]
    assert cli.requests[-1].url.params["all"] == "true"
    cli.listing = []
    assert "no workloads running or waiting" in invoke(["ps"]).stdout

    cli.states = [workload("running", allocation=ALLOCATION, events=EVENTS, started_at=T0, cost="2.05",
                           spec={"name": "hello", "command": "python3 -c 'print([1])'", "env": {"SECRET": "s3"},
                                 "resources": {"gpu": "H20", "gpus": 16}, "billing": "on-demand"})]  # fmt: skip
    out = invoke(["describe", "hello"]).stdout
    for text in ("h20-roce800-128.h20-0001", "0,1,2,3,4,5,6,7", "python3 -c 'print([1])'", "gpu=H20 gpus=16",
                 "¥2.05 so far", "on-demand, ¥123.00/h", "started on 2 nodes", "SECRET"):  # fmt: skip
        assert text in out, text
    assert "s3" not in out  # env values may be secrets
    assert json.loads(invoke(["describe", WL, "--json"]).stdout)["events"][1]["state"] == "running"
    cli.states = [workload("pending", pending=PENDING)]
    assert "(queue position 3)" in invoke(["describe", WL]).stdout


def test_logs_stop_start(cli: FakeServer) -> None:
    cli.chunks = [("part 1\n", False), ("part 2\n", False), ("", False)]
    assert invoke(["logs", WL, "--rank", "1"]).stdout == "part 1\npart 2\n"
    assert {r.url.params["rank"] for r in cli.requests if r.url.path.endswith("/logs")} == {"1"}
    cli.chunks = [("a\n", False), ("", False), ("b\n", True)]
    assert invoke(["logs", "-f", "hello"]).stdout == "a\nb\n"

    cli.states = [workload("running")]
    assert f"stopping {WL} (hello)" in invoke(["stop", "hello"]).stdout
    cli.states = [workload("stopped", kind="instance")]
    assert f"{WL} (hello) stopped" in invoke(["stop", WL]).stdout
    cli.states = [workload("pending", kind="instance", reason="started by a@example.com")]
    assert "pending" in invoke(["start", WL]).stdout
    cli.states = [workload("stopped")]
    refused = invoke(["start", WL], code=2)
    assert refused.stderr == f"error: workload {WL} is a job; only instances start again\n"


def test_not_logged_in(cli: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUANLI_TOKEN")
    assert "not logged in" in invoke(["ps"], code=2).stderr
    assert cli.requests == []
