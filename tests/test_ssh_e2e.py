"""SSH into a real instance end to end: a `suanli server` process with its gateway, an instance running in its
bubblewrap sandbox on the local executor, and Debian's OpenSSH client: commands and exit codes, a terminal,
scp in and out of the instance's disk (and nothing else), `ssh -L` to a server the instance runs, another org's
key refused, `suanli keys` and `suanli ssh`, and a stopped instance answering with its state."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.control_plane import LiveServer, Tenant, admin_token, bearer, free_port, live_server, signup
from tests.ssh_helpers import keygen, options, require_openssh, scp, ssh, wait_listening

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
    reason="bubblewrap is not installed (apt install bubblewrap); CI installs and requires it",
)
FAST = {"SUANLI_SCHEDULE_INTERVAL_S": "0.2", "SUANLI_METER_INTERVAL_S": "0.5", "SUANLI_STOP_GRACE_S": "2"}


@dataclass
class World:
    srv: LiveServer
    http: httpx.Client
    tenant: Tenant
    ssh_port: int
    web_port: int
    key: Path
    mallory_key: Path
    box: str  # the instance's id

    @property
    def disk(self) -> Path:
        return self.srv.home / "workloads" / self.box / "disk"


def cli(world: World, *args: str, code: int = 0, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUANLI_")}
    env.update(SUANLI_HOME=str(world.srv.home.parent / "cli"), SUANLI_SERVER=world.srv.url,
               SUANLI_TOKEN=world.tenant.token, COLUMNS="200")  # fmt: skip
    p = subprocess.run([sys.executable, "-m", "suanli.cli.main", *args], capture_output=True, text=True, env=env,
                       timeout=60, input=stdin)  # fmt: skip
    assert p.returncode == code, (args, p.returncode, p.stdout, p.stderr)
    return p


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    require_openssh()
    tmp = tmp_path_factory.mktemp("ssh-e2e")
    ssh_port, web_port = free_port(), free_port()
    home = tmp / "home"
    with live_server(home, f"sqlite+pysqlite:///{tmp / 'suanli.db'}", env={**FAST, "SUANLI_SSH_PORT": str(ssh_port)}) as srv:  # fmt: skip
        http = httpx.Client(base_url=srv.url, timeout=30)
        adm = bearer(admin_token(http))
        assert http.post("/api/v1/admin/clusters", json={"local": True, "name": "this-host"}, headers=adm).status_code == 201  # fmt: skip
        tenant, mallory = signup(http, "tenant@example.com"), signup(http, "mallory@example.com")
        r = http.post(f"/api/v1/admin/orgs/{tenant.org_id}/transactions", json={"kind": "topup", "amount": "100"},
                      headers=adm)  # fmt: skip
        assert r.status_code == 201, r.text
        key, mallory_key = keygen(tmp / "id_ed25519"), keygen(tmp / "mallory")
        r = http.post("/api/v1/keys", json={"password": "tenant-password", "public_key": Path(f"{mallory_key}.pub").read_text()},
                      headers=mallory.headers)  # fmt: skip
        assert r.status_code == 201, r.text
        command = f"echo made-by-the-instance > hello.txt; exec python3 -m http.server {web_port} --bind 127.0.0.1"
        spec = {"name": "my-box", "kind": "instance", "command": command, "resources": {"gpus": 0}}
        r = http.post("/api/v1/workloads", json={"spec": spec}, headers=tenant.headers)
        assert r.status_code == 201, r.text
        w = World(srv, http, tenant, ssh_port, web_port, key, mallory_key, r.json()["id"])
        added = cli(
            w, "keys", "add", f"{key}.pub", "--name", "laptop", "--json", "--password-stdin", stdin="tenant-password\n"
        )  # the tenant's key, by the CLI (a key outlives its login)
        assert '"name": "laptop"' in added.stdout
        deadline = time.monotonic() + 60
        while (state := http.get(f"/api/v1/workloads/{w.box}", headers=tenant.headers).json())["state"] != "running":
            assert time.monotonic() < deadline and state["state"] in ("pending", "scheduled", "starting"), state
            time.sleep(0.2)
        while not (w.disk / "hello.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        wait_listening(ssh_port)
        yield w
        http.close()


def test_commands_run_inside_the_sandbox_with_their_exit_status(world: World) -> None:
    p = ssh(world.key, world.ssh_port, "my-box", "echo hi")
    assert (p.returncode, p.stdout) == (0, "hi\n"), p.stderr
    assert ssh(world.key, world.ssh_port, "my-box", "exit 3").returncode == 3
    p = ssh(world.key, world.ssh_port, world.box, f"pwd; cat hello.txt; echo from-ssh > note.txt; test -e {world.srv.home} || echo no-server-home")  # fmt: skip
    assert p.stdout.split() == ["/workspace", "made-by-the-instance", "no-server-home"], p.stderr
    assert (world.disk / "note.txt").read_text() == "from-ssh\n"  # written where the instance writes: its disk
    assert ssh(world.key, world.ssh_port, "my-box.1", "true").stderr.strip().endswith("node-rank 1 is not running")


def test_a_terminal_session(world: World) -> None:
    p = ssh(world.key, world.ssh_port, "my-box", "test -t 0 && test -t 1 && echo on-a-terminal; exit 5", tty=True)
    assert "on-a-terminal" in p.stdout and p.returncode == 5, (p.stdout, p.stderr)


def test_scp_in_and_out_of_the_instances_disk_and_nothing_else(world: World, tmp_path: Path) -> None:
    data = os.urandom(5 << 20)
    (tmp_path / "in.bin").write_bytes(data)
    p = scp(world.key, world.ssh_port, str(tmp_path / "in.bin"), "my-box@127.0.0.1:uploaded.bin")
    assert p.returncode == 0, p.stderr
    assert (world.disk / "uploaded.bin").read_bytes() == data
    p = scp(world.key, world.ssh_port, "my-box@127.0.0.1:/workspace/uploaded.bin", str(tmp_path / "out.bin"))
    assert p.returncode == 0 and (tmp_path / "out.bin").read_bytes() == data, p.stderr
    for outside in (world.srv.log, world.srv.home.parent / "suanli.db"):  # the server's files do not exist inside
        p = scp(world.key, world.ssh_port, f"my-box@127.0.0.1:{outside}", str(tmp_path / "stolen"))
        assert p.returncode != 0 and not (tmp_path / "stolen").exists()


def test_local_port_forwarding_reaches_a_server_the_instance_runs(world: World) -> None:
    assert _fetch_through(world, "my-box", world.web_port, "hello.txt") == b"made-by-the-instance\n"


def _fetch_through(world: World, login: str, port: int, path: str) -> bytes:
    local = free_port()
    fwd = subprocess.Popen(["ssh", *options(world.key, world.ssh_port), "-N", "-L", f"{local}:127.0.0.1:{port}",
                            f"{login}@127.0.0.1"], stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{local}/{path}", timeout=10) as r:
                    return bytes(r.read())
            except OSError:
                assert time.monotonic() < deadline and fwd.poll() is None, fwd.stderr
                time.sleep(0.2)
    finally:
        fwd.terminate()
        fwd.wait(10)


def test_forwarding_into_an_instance_with_a_network_of_its_own(world: World) -> None:
    """`network: none`: the instance's loopback is not this host's; a relay inside its sandbox reaches it."""
    port = free_port()
    spec = {"name": "offline-box", "kind": "instance", "network": "none", "resources": {"gpus": 0},
            "command": f"echo offline > page.txt; exec python3 -m http.server {port} --bind 127.0.0.1"}  # fmt: skip
    r = world.http.post("/api/v1/workloads", json={"spec": spec}, headers=world.tenant.headers)
    assert r.status_code == 201, r.text
    deadline = time.monotonic() + 60
    while world.http.get(f"/api/v1/workloads/{r.json()['id']}", headers=world.tenant.headers).json()["state"] != "running":  # fmt: skip
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert _fetch_through(world, "offline-box", port, "page.txt") == b"offline\n"
    with pytest.raises(OSError):  # serving, but not on this host's loopback
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    world.http.post("/api/v1/workloads/offline-box/stop", headers=world.tenant.headers)


def test_another_orgs_key_is_refused(world: World) -> None:
    for login in ("my-box", world.box):
        p = ssh(world.mallory_key, world.ssh_port, login, "echo hi")
        assert p.returncode == 255 and "Permission denied (publickey)" in p.stderr and p.stdout == ""


def test_suanli_ssh_and_keys_commands(world: World) -> None:
    p = cli(world, "ssh", "-i", str(world.key), "my-box", "--", "echo", "via-suanli-ssh")
    assert p.stdout == "via-suanli-ssh\n", p.stderr  # host key pinned from GET /ssh (StrictHostKeyChecking=yes)
    known = (world.srv.home.parent / "cli" / "ssh_known_hosts").read_text()
    assert known.startswith(f"[127.0.0.1]:{world.ssh_port} ssh-ed25519 ")
    printed = cli(world, "ssh", "my-box", "--print", "-L", "8888:127.0.0.1:8888").stdout.split()
    assert printed[:3] == ["ssh", "-p", str(world.ssh_port)] and "my-box@127.0.0.1" in printed
    listed = cli(world, "keys", "ls").stdout
    assert "laptop" in listed and "ssh-ed25519" in listed
    bad = cli(world, "keys", "add", str(world.key), code=2)  # the private key: refused before it is sent
    assert "private key" in bad.stderr


def test_a_shell_ends_when_the_key_it_came_in_by_is_removed(world: World, tmp_path: Path) -> None:
    """Not only new sessions: an open connection is closed once its key is gone (the gateway re-reads open
    connections' grants every 10 s), and what its shell ran inside the sandbox is hung up."""
    spare = keygen(tmp_path / "spare")
    r = world.http.post("/api/v1/keys", json={"password": "tenant-password", "public_key": Path(f"{spare}.pub").read_text(), "name": "spare"},
                        headers=world.tenant.headers)  # fmt: skip
    assert r.status_code == 201, r.text
    tick = world.disk / "tick"
    argv = [
        "ssh",
        *options(spare, world.ssh_port),
        "my-box@127.0.0.1",
        "while :; do date +%s%N > tick; sleep 0.2; done",
    ]
    shell = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not tick.exists():
            assert time.monotonic() < deadline and shell.poll() is None, shell.communicate()
            time.sleep(0.1)
        assert world.http.delete(f"/api/v1/keys/{r.json()['id']}", headers=world.tenant.headers).status_code == 200
        _, err = shell.communicate(timeout=30)
    finally:
        shell.kill()
    assert shell.returncode == 255 and "your key was removed" in err, err
    last = tick.read_text()
    time.sleep(1.0)
    assert tick.read_text() == last  # the loop inside the sandbox is gone with the connection
    assert ssh(world.key, world.ssh_port, "my-box", "echo hi").stdout == "hi\n"  # the other key's access stands


def test_a_stopped_instance_answers_with_its_state(world: World) -> None:
    r = world.http.post(f"/api/v1/workloads/{world.box}/stop", headers=world.tenant.headers)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 30
    while world.http.get(f"/api/v1/workloads/{world.box}", headers=world.tenant.headers).json()["state"] != "stopped":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    p = ssh(world.key, world.ssh_port, "my-box", "echo hi")
    assert p.returncode == 1 and p.stdout == ""
    assert "instance my-box is stopped; `suanli start my-box`" in p.stderr
    key_id = cli(world, "keys", "ls", "--json").stdout.split('"id": "')[1].split('"')[0]
    cli(world, "keys", "rm", key_id)
    p = ssh(world.key, world.ssh_port, "my-box", "echo hi")
    assert p.returncode == 255 and "Permission denied" in p.stderr
