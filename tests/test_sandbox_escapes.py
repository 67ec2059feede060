"""Escapes tried by a foreign tenant on the local executor of a real server, each asserting the denial.

A victim tenant runs an instance holding a secret on its disk; the attacker, another tenant, runs a job that tries
to read the server's database, credentials and password files, the victim's disk and logs, to see and signal the
server's and the victim's processes, to write outside its own directories and to become root. The same job must
still read and write its own workdir and reach the network. Runs on SQLite only: the sandbox does not depend on the
database (the PostgreSQL runs of the workload tests cover the server).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.control_plane import LiveServer, live_server, signup
from tests.test_workloads_api import archive
from tests.test_workloads_e2e import FAST, TERMINAL, Api

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
    reason="bubblewrap is not installed (apt install bubblewrap); CI installs and requires it",
)

SECRET = "victim-secret-7f3a"
MARKER = f"victim-marker-{os.getpid()}-{time.monotonic_ns()}"  # this run's, not a leftover's
ATTACK = r"""
import json, os, signal, socket, sys
paths = json.loads(os.environ["TARGETS"])
out = {}

def attempt(name, fn):
    try:
        out[name] = ["allowed", repr(fn())[:200]]
    except Exception as e:
        out[name] = ["denied", type(e).__name__]

for name, path in paths.items():
    attempt("read:" + name, lambda p=path: open(p, "rb").read(64))
    attempt("list:" + name, lambda p=path: os.listdir(os.path.dirname(p)))
for name, path in {"usr": "/usr/evil", "etc": "/etc/evil", "root": "/evil", "sys": "/sys/fs/cgroup/evil"}.items():
    attempt("write:" + name, lambda p=path: open(p, "w").write("x"))
attempt("kill:server", lambda: os.kill(int(os.environ["SERVER_PID"]), signal.SIGKILL))
attempt("kill:victim", lambda: os.kill(int(os.environ["VICTIM_PID"]), signal.SIGKILL))
attempt("setuid:0", lambda: os.setuid(0))
def unshare_user():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:
        raise OSError(ctypes.get_errno(), "unshare")

attempt("userns", unshare_user)
procs = {}
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            procs[pid] = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            pass
out["procs"] = procs
out["uid"] = os.getuid()
open("own.txt", "w").write("mine")
out["own"] = [open("own.txt").read(), open("input.txt").read()]
host, port = os.environ["SERVER"].split(":")
attempt("network", lambda: socket.create_connection((host, int(port)), timeout=5).close())
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("escapes") / "home"
    db_url = f"sqlite+pysqlite:///{home.parent / 'suanli.db'}"
    with live_server(home, db_url, env=FAST) as server:
        yield server


def _host_pid_of(marker: str) -> int:
    """The host pid of a process whose command line holds `marker` (the victim's, seen from outside)."""
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmd and b"bwrap" not in cmd and b"/bin/sh" not in cmd:
            return int(pid)
    raise AssertionError(f"no process with {marker}")


@pytest.fixture(scope="module")
def api(srv: LiveServer) -> Api:
    api = Api(srv)
    api.setup()
    return api


@pytest.fixture(scope="module")
def attack(srv: LiveServer, api: Api) -> dict[str, Any]:
    victim = signup(api.http, "victim@example.com")
    api.http.post(f"/api/v1/admin/orgs/{victim.org_id}/transactions", headers=api.admin,
                  json={"kind": "topup", "amount": "100"}).raise_for_status()  # fmt: skip
    spec = {"name": "victim-box", "kind": "instance", "resources": {"gpus": 0},
            "command": f"echo {SECRET} > secret.txt; exec python3 -c \"import time; time.sleep(3600)\" {MARKER}"}  # fmt: skip
    r = api.http.post("/api/v1/workloads", json={"spec": spec}, headers=victim.headers)
    assert r.status_code == 201, r.text
    vid = r.json()["id"]
    deadline = time.monotonic() + 60
    disk = srv.home / "workloads" / vid / "disk" / "secret.txt"
    while not disk.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert disk.read_text().strip() == SECRET  # the victim's own write landed on its disk
    victim_pid = _host_pid_of(MARKER)
    logs = sorted((srv.home / "workloads" / vid).glob("attempt-*/rank-0.log"))
    targets = {
        "db": str(srv.home.parent / "suanli.db"),
        "credentials": str(srv.home / "credentials.json"),
        "password": str(srv.home / "operator-password"),
        "server-log": str(next(srv.home.glob("server-*.log"))),
        "victim-disk": str(disk),
        "victim-log": str(logs[-1]),
        "shadow": "/etc/shadow",
    }
    port = srv.url.rsplit(":", 1)[1]
    job = api.submit(
        {"name": "attacker", "command": "python3 attack.py", "resources": {"gpus": 0},
         "env": {"TARGETS": json.dumps(targets), "SERVER_PID": str(srv.proc.pid), "VICTIM_PID": str(victim_pid),
                 "SERVER": f"127.0.0.1:{port}"}},
        workdir_archive=archive({"attack.py": ATTACK, "input.txt": "given"}),
    )  # fmt: skip
    done = api.until(job, lambda w: w["state"] in TERMINAL, timeout=90)
    text = api.logs(job)
    assert done["state"] == "succeeded", (done["reason"], text)
    line = next(x for x in text.splitlines() if x.startswith("RESULT "))
    victim_now = api.http.get(f"/api/v1/workloads/{vid}", headers=victim.headers).json()
    return {"result": json.loads(line[7:]), "targets": targets, "victim": victim_now, "srv": srv, "job": job,
            "victim_pid": victim_pid, "victim_headers": victim.headers, "victim_org": victim.org_id, "attacker_org": api.tenant.org_id,
            "victim_disk_uid": disk.stat().st_uid}  # fmt: skip


@pytest.mark.parametrize("target", ["db", "credentials", "password", "server-log", "victim-disk", "victim-log"])
def test_the_servers_files_and_other_tenants_files_do_not_exist_inside(attack: dict[str, Any], target: str) -> None:
    res = attack["result"]
    assert res[f"read:{target}"][0] == "denied", res[f"read:{target}"]
    assert res[f"list:{target}"][0] == "denied", res[f"list:{target}"]


def test_host_secrets_readable_only_by_root_stay_unreadable(attack: dict[str, Any]) -> None:
    assert attack["result"]["read:shadow"] == ["denied", "PermissionError"]


@pytest.mark.parametrize("where", ["usr", "etc", "root", "sys"])
def test_nothing_outside_its_own_directories_is_writable(attack: dict[str, Any], where: str) -> None:
    assert attack["result"][f"write:{where}"][0] == "denied"
    assert not Path("/usr/evil").exists() and not Path("/etc/evil").exists()


def test_it_sees_only_its_own_processes_and_cannot_signal_others(attack: dict[str, Any]) -> None:
    res = attack["result"]
    commands = " ".join(res["procs"].values())
    assert "attack.py" in commands  # it does see itself
    assert MARKER not in commands and "suanli.cli.main" not in commands and "rankrun" not in commands
    assert res["kill:server"][0] == "denied" and res["kill:victim"][0] == "denied"
    assert attack["srv"].proc.poll() is None
    os.kill(attack["victim_pid"], 0)  # the victim's process is still alive
    assert attack["victim"]["state"] == "running"


@pytest.mark.skipif(os.geteuid() != 0, reason="a server not run as root runs every sandbox as its own user")
def test_each_org_runs_as_the_uid_recorded_for_it_and_no_other(attack: dict[str, Any]) -> None:
    import sqlite3

    with sqlite3.connect(f"file:{attack['srv'].home.parent / 'suanli.db'}?mode=ro", uri=True) as c:
        uids = dict(c.execute("SELECT id, sandbox_uid FROM orgs").fetchall())
    assert attack["victim_disk_uid"] == uids[attack["victim_org"]]
    assert attack["result"]["uid"] == uids[attack["attacker_org"]] != attack["victim_disk_uid"]
    assert len(set(uids.values())) == len(uids)


def test_there_is_no_way_back_to_root(attack: dict[str, Any]) -> None:
    res = attack["result"]
    assert res["setuid:0"][0] == "denied"
    assert res["userns"][0] == "denied"


def test_its_own_workdir_and_the_network_still_work(attack: dict[str, Any]) -> None:
    res = attack["result"]
    assert res["own"] == ["mine", "given"]
    assert res["network"][0] == "allowed"
    written = attack["srv"].home / "workloads" / attack["job"] / "workdir" / "own.txt"
    assert written.read_text() == "mine"


def test_env_values_never_show_in_a_host_process_argv(api: Api) -> None:
    token = "tok-" + os.urandom(6).hex()
    job = api.submit({"name": "env-secret", "command": "sleep 2; test \"$API_KEY\" = " + token,
                      "resources": {"gpus": 0}, "env": {"API_KEY": token}})  # fmt: skip
    seen = False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        w = api.get(job)
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"sleep 2; test" in cmd:
                seen = True
            # the command holds the token as a literal on purpose; the env value must appear nowhere else
            if token.encode() in cmd and b"sleep 2; test" not in cmd:
                raise AssertionError(f"env value in argv of {pid}: {cmd!r}")
        if w["state"] in TERMINAL:
            break
        time.sleep(0.05)
    assert seen
    assert api.until(job, lambda w: w["state"] in TERMINAL)["state"] == "succeeded"  # and the job did get it


def test_network_none_and_private_do_not_reach_the_servers_loopback(srv: LiveServer, api: Api) -> None:
    port = srv.url.rsplit(":", 1)[1]
    probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)\""
    host = api.submit({"name": "net-host", "command": probe, "resources": {"gpus": 0}})
    none = api.submit({"name": "net-none", "command": probe, "resources": {"gpus": 0}, "network": "none"})
    private = api.submit({"name": "net-private", "command": probe, "resources": {"gpus": 0}, "network": "private"})
    assert api.until(host, lambda w: w["state"] in TERMINAL)["state"] == "succeeded"
    for job in (none, private):
        w = api.until(job, lambda w: w["state"] in TERMINAL)
        assert w["state"] == "failed" and "ConnectionRefusedError" in api.logs(job), api.logs(job)
    r = api.http.post("/api/v1/workloads", json={"spec": {"name": "wide", "command": "true", "network": "none",
                      "resources": {"gpus": 0}, "ports": [8000]}}, headers=api.tenant.headers)  # fmt: skip
    assert r.status_code == 422 and "ports" in r.text


def test_an_unpublished_image_is_refused_naming_the_field(api: Api) -> None:
    r = api.http.post("/api/v1/workloads", json={"spec": {"name": "img", "command": "true", "image": "nope",
                                                          "resources": {"gpus": 0}}}, headers=api.tenant.headers)  # fmt: skip
    assert r.status_code == 422 and "image" in r.text
    assert api.http.get("/api/v1/environments", headers=api.tenant.headers).json() == []


def test_a_stopped_sandbox_leaves_no_process_behind(attack: dict[str, Any], api: Api) -> None:
    vid = attack["victim"]["id"]
    r = api.http.post(f"/api/v1/workloads/{vid}/stop", headers=attack["victim_headers"])
    assert r.status_code in (200, 202), r.text
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(attack["victim_pid"], 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(attack["victim_pid"], signal.SIGKILL)
    raise AssertionError("the victim's process outlived its stop")


def test_exceeding_its_memory_limit_ends_it_with_the_reason_in_words(api: Api) -> None:
    job = api.submit({"name": "hog", "resources": {"gpus": 0, "memory": "256Mi"},
                      "command": "python3 -c 'x = bytearray(1 << 30); print(len(x))'"})  # fmt: skip
    w = api.until(job, lambda w: w["state"] in TERMINAL, timeout=60)
    assert w["state"] == "failed"
    # a cgroup (root server): the kernel's OOM kill, said in words; rlimits: the allocation itself fails
    assert "out of memory: killed at its memory limit of 256 MiB" in w["reason"] or "MemoryError" in api.logs(job)


def test_a_published_environment_is_listed_and_runs_as_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from suanli import Client
    from tests.cli_helpers import invoke

    env = tmp_path / "envs" / "tools"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "tool").write_text("#!/bin/sh\necho from-the-published-env\n")
    (env / "bin" / "tool").chmod(0o755)
    db_url = f"sqlite+pysqlite:///{tmp_path / 'suanli.db'}"
    with live_server(tmp_path / "home", db_url, env={**FAST, "SUANLI_ENVIRONMENTS": f"tools={env}"}) as srv:
        api = Api(srv)
        api.setup()
        client = Client(srv.url, token=api.tenant.headers["Authorization"].split()[1])
        assert client.environments() == ["tools"]
        monkeypatch.setenv("SUANLI_TOKEN", api.tenant.headers["Authorization"].split()[1])
        assert json.loads(invoke(["environments", "--json", "--server", srv.url]).stdout) == ["tools"]
        job = api.submit({"name": "uses-env", "command": "tool", "image": "tools", "resources": {"gpus": 0}})
        w = api.until(job, lambda w: w["state"] in TERMINAL)
        assert w["state"] == "succeeded" and api.logs(job).strip() == "from-the-published-env"
