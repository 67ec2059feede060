"""`network: private`: a sandbox with its own network namespace and pasta for the way out.

The attacks are those the shared host network allowed (docs/isolation.md): another tenant on the node joins a
job's torch rendezvous on 127.0.0.1, and a job reaches the host's own loopback services. Here a listener of the
test process stands for both (a host-network tenant's TCPStore, the host's PostgreSQL); the private job must not
reach it, the host must not reach the job's own listener, and the job must still get out (to an address of this
host that is not loopback, standing for the internet) and talk to itself over its loopback.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from suanli.executors.local import LocalExecutor
from suanli.sandbox.bwrap import SandboxSpec, bwrap_args
from suanli.workloads import SpecError, parse_spec
from tests.sandbox_helpers import launch, run, sandbox_record, stop

REQUIRED = bool(os.environ.get("SUANLI_REQUIRE_BWRAP"))
needs_pasta = pytest.mark.skipif(
    (shutil.which("bwrap") is None or shutil.which("pasta") is None) and not REQUIRED,
    reason="bubblewrap or pasta is not installed (apt install bubblewrap passt); CI installs and requires both",
)
OUTSIDE = "198.51.100.77"  # TEST-NET-2: an address of this host that is not loopback, added to `lo` for the test


# ---- the spec ------------------------------------------------------------------------------------------------------
def test_private_work_runs_on_one_node_and_says_so_in_its_spec() -> None:
    spec = parse_spec({"name": "p", "command": "true", "network": "private", "resources": {"gpus": 4}})
    assert spec.network == "private" and spec.resources.nodes == 1
    assert spec.model_dump(mode="json")["resources"]["nodes"] == 1  # stored, described and placed so
    # network: none was the same mistake waiting: its ranks could never meet over two nodes
    assert (
        parse_spec({"name": "n", "command": "true", "network": "none", "resources": {"gpus": 2}}).resources.nodes == 1
    )
    assert parse_spec({"name": "h", "command": "true", "resources": {"gpus": 2}}).resources.nodes is None
    cpu = parse_spec({"name": "c", "command": "true", "network": "private", "resources": {"gpus": 0}})
    assert cpu.resources.nodes is None  # CPU-only work is on one node anyway


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"network": "private", "resources": {"gpus": 16, "nodes": 2}}, "network", "one node"),
        ({"network": "none", "resources": {"gpus": {"min": 2, "max": 8}, "nodes": 2}}, "network", "one node"),
        ({"network": "none", "ports": [8000]}, "ports", "cannot be reached"),
        ({"network": "bridge"}, "network", "private"),
    ],
)
def test_what_a_private_network_cannot_do_is_refused_naming_the_field(spec: dict, field: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "p", "command": "true", **spec})
    errs = e.value.errors
    assert any(x["field"] == field and words in x["message"] for x in errs), errs


@pytest.mark.parametrize("network", ["private", "none"])
@pytest.mark.parametrize(
    "resources",
    [
        {"gpus": {"min": 2, "max": 64}},
        {"gpus": {"min": 0, "max": 64}},
        {"gpus": 64},
        {"gpus": 16, "nodes": None},
        {"gpus": 16, "nodes": True},
        {"gpus": 16, "nodes": 2.0},
        {"gpus": 16, "nodes": "2"},
        {"gpus": 0, "cpus": 64},
        None,
        [],
    ],
)
def test_no_shape_of_resources_puts_private_work_on_two_nodes(network: str, resources: object) -> None:
    """Every spec is refused with a field error or launches on one node, even grown to 64 GPUs on 8-GPU nodes."""
    try:
        spec = parse_spec({"name": "p", "command": "true", "network": network, "resources": resources})
    except SpecError as e:
        assert e.errors and all(x["field"] for x in e.errors)
        return
    assert spec.gpu_count() == 0 or spec.nodes_for(8, 64) == 1


def test_bwrap_gives_a_private_sandbox_a_namespace_of_its_own() -> None:
    assert "--unshare-net" in bwrap_args(SandboxSpec(workdir="/tmp", network="private"))
    assert "--unshare-net" not in bwrap_args(SandboxSpec(workdir="/tmp", network="host"))


# ---- the sandbox ---------------------------------------------------------------------------------------------------
@pytest.fixture
def host_listener() -> Iterator[tuple[int, list[str]]]:
    """A TCP listener on the host's 127.0.0.1 (another tenant's rendezvous, a host service): its port, and who
    connected."""
    srv, seen = _listen("127.0.0.1", lambda conn, addr: addr[0])
    yield srv.getsockname()[1], seen
    srv.close()


def _listen(address: str, answer: Callable[[socket.socket, tuple], str]) -> tuple[socket.socket, list[str]]:
    """A listener on `address` accepting in a thread; `answer` talks to each connection and says what to record."""
    srv = socket.socket()
    srv.bind((address, 0))
    srv.listen()
    seen: list[str] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, addr = srv.accept()
                seen.append(answer(conn, addr))
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, seen


@pytest.fixture
def outside() -> Iterator[tuple[int, list[str]]]:
    """A listener on a non-loopback address of this host, standing for the world outside the sandbox (a host
    service on such an address is not fenced either: docs/isolation.md); needs root to add the address."""
    if os.geteuid() != 0:
        pytest.skip("adding an address to lo needs root")
    subprocess.run(["ip", "addr", "add", f"{OUTSIDE}/32", "dev", "lo"], check=True, capture_output=True)

    def welcome(conn: socket.socket, _: tuple) -> str:
        said = conn.recv(64).decode()
        conn.sendall(b"welcome")
        return said

    srv = None
    try:
        srv, seen = _listen(OUTSIDE, welcome)
        yield srv.getsockname()[1], seen
    finally:
        if srv is not None:
            srv.close()
        subprocess.run(["ip", "addr", "del", f"{OUTSIDE}/32", "dev", "lo"], capture_output=True)


PROBE = """
import socket, sys
host_port, out_port = int(sys.argv[1]), int(sys.argv[2])
try:
    socket.create_connection(("127.0.0.1", host_port), timeout=3).close()
    print("host loopback: reached")
except OSError as e:
    print("host loopback:", type(e).__name__)
s = socket.create_connection((sys.argv[3], out_port), timeout=5)
s.sendall(b"from the sandbox")
print("outside:", s.recv(64).decode())
own = socket.socket(); own.bind(("127.0.0.1", 0)); own.listen()
c = socket.create_connection(own.getsockname()); a, _ = own.accept(); c.sendall(b"self"); print("own loopback:", a.recv(8).decode())
print("listening on", own.getsockname()[1], flush=True)
open("port", "w").write(str(own.getsockname()[1]))
import time; time.sleep(float(sys.argv[4]))
"""


@needs_pasta
def test_a_private_job_gets_out_but_not_into_the_hosts_loopback_nor_the_host_into_its(
    tmp_path: Path, host_listener: tuple[int, list[str]], outside: tuple[int, list[str]]
) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "probe.py").write_text(PROBE)
    ex = LocalExecutor()
    handle = ex.launch(
        launch(tmp_path, f"python3 probe.py {host_listener[0]} {outside[0]} {OUTSIDE} 30", network="private"),
        time.time(),
    )
    try:
        port_file, deadline = tmp_path / "work" / "port", time.monotonic() + 30
        while not port_file.exists():
            assert time.monotonic() < deadline, (tmp_path / "logs" / "rank-0.log").read_text()
            time.sleep(0.05)
        job_port = int(port_file.read_text())
        with pytest.raises(ConnectionRefusedError):  # the job's rendezvous is not on the host's loopback
            socket.create_connection(("127.0.0.1", job_port), timeout=3).close()
        box = sandbox_record(tmp_path)
        pasta = int(box["pasta_pid"])
        assert "pasta" in Path(f"/proc/{pasta}/cmdline").read_bytes().decode(errors="replace")
        if box.get("uid") is not None:  # it runs as the sandbox's uid, not as the server's root
            assert os.stat(f"/proc/{pasta}").st_uid == box["uid"]
        # SSH and `suanli exec` join the same namespace: they see the job's listener, not the host's
        seen = subprocess.run(ex.enter_argv(handle, 0, ["cat", "/proc/net/tcp"]), capture_output=True, text=True,
                              timeout=30, env={"TERM": "dumb"})  # fmt: skip
        assert seen.returncode == 0, seen.stderr
        local_ports = {int(line.split()[1].split(":")[1], 16) for line in seen.stdout.splitlines()[1:]}
        assert job_port in local_ports and host_listener[0] not in local_ports
    finally:
        stop(ex, handle)
    log = (tmp_path / "logs" / "rank-0.log").read_text()
    assert "host loopback: ConnectionRefusedError" in log, log
    assert "outside: welcome" in log and "own loopback: self" in log, log
    assert outside[1] == ["from the sandbox"] and host_listener[1] == []
    deadline = time.monotonic() + 10  # pasta goes with the job
    while Path(f"/proc/{pasta}").exists():
        assert time.monotonic() < deadline, "pasta outlived its job"
        time.sleep(0.05)


@needs_pasta
def test_a_stopping_private_job_keeps_its_network_through_the_grace_period(
    tmp_path: Path, outside: tuple[int, list[str]]
) -> None:
    """The supervisor forwards SIGTERM to the job's processes: pasta is not one of them (a checkpoint uploaded in
    the grace period must still get out)."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "send.py").write_text(
        "import socket, sys\n"
        "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
        "s.sendall(b'last words')\n"
        "print('after TERM:', s.recv(64).decode())\n"
    )
    ex = LocalExecutor()
    trap = f'trap "python3 send.py {OUTSIDE} {outside[0]}; exit 7" TERM; echo trapped; sleep 60 & wait'
    handle = ex.launch(launch(tmp_path, trap, network="private"), time.time())
    log, deadline = tmp_path / "logs" / "rank-0.log", time.monotonic() + 30
    while not (log.exists() and "trapped" in log.read_text()):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.05)
    stop(ex, handle)
    assert "after TERM: welcome" in log.read_text(), log.read_text()
    assert outside[1] == ["last words"]


@needs_pasta
def test_without_pasta_a_private_job_does_not_run_and_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    bin_dir = Path(tempfile.mkdtemp(prefix="suanli-nopasta-"))  # PATH with what the supervisor needs, but no pasta
    bin_dir.chmod(0o755)  # the sandbox's uid runs bwrap from here
    request.addfinalizer(lambda: shutil.rmtree(bin_dir, ignore_errors=True))
    for tool in ("bwrap", "sh", "python3"):
        found = shutil.which(tool)
        assert found
        (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    st, log = run(tmp_path, "touch ran", network="private")
    assert st.exit_code == 127 and "network: private needs pasta" in log and "passt" in log, log
    assert not (tmp_path / "work" / "ran").exists()


# ---- admission -----------------------------------------------------------------------------------------------------
def test_private_work_larger_than_a_node_is_refused_at_submission_not_queued_forever(api: Any) -> None:
    from tests.test_workloads_api import make_platform

    p = make_platform(api)  # 8-GPU H20 nodes
    big = {"name": "big", "command": "x", "network": "private", "resources": {"gpu": "H20", "gpus": 16}}
    r = api.post("/api/v1/workloads", json={"spec": big}, headers=p.tenant.headers)
    assert r.status_code == 422 and r.json()["detail"].startswith("network: private runs on one node"), r.text
    r = api.post("/api/v1/workloads", json={"spec": {**big, "network": "host", "resources": {"gpu": "H20", "gpus": 16,
                                                                                           "nodes": 1}}},
                 headers=p.tenant.headers)  # fmt: skip
    assert r.status_code == 422 and r.json()["detail"].startswith("resources.nodes: 16 GPUs on each node"), r.text
    auto = {"name": "auto", "command": "x", "resources": {"gpu": "H20", "gpus": 16, "nodes": 1}}  # auto forces nothing
    r = api.post("/api/v1/workloads", json={"spec": auto}, headers=p.tenant.headers)
    assert r.status_code == 422 and r.json()["detail"].startswith("resources.nodes: 16 GPUs on each node"), r.text
    fits = p.submit({**big, "resources": {"gpu": "H20", "gpus": 8}})
    assert fits["spec"]["resources"]["nodes"] == 1 and fits["spec"]["network"] == "private"


# ---- pasta lives exactly as long as its job --------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        return "pasta" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@needs_pasta
def test_pasta_goes_when_the_job_ends_at_once_or_its_sandbox_is_killed(tmp_path: Path) -> None:
    st, log = run(tmp_path / "a" if (tmp_path / "a").mkdir() is None else tmp_path, "exit 3", network="private")
    assert st.exit_code == 3, log
    pasta = int(sandbox_record(tmp_path / "a")["pasta_pid"])
    assert _gone_within(pasta, 5)
    ex = LocalExecutor()
    handle = ex.launch(launch(tmp_path, "sleep 60", network="private"), time.time())
    box = sandbox_record(tmp_path)
    pasta = int(box["pasta_pid"])
    assert _alive(pasta)
    os.kill(int(box["init_pid"]), signal.SIGKILL)
    deadline = time.monotonic() + 20
    while ex.poll(handle, time.time()).state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _gone_within(pasta, 5)


@needs_pasta
def test_pasta_dies_with_a_supervisor_killed_by_sigkill(tmp_path: Path) -> None:
    """No executor polls a rank whose supervisor was SIGKILLed with its node (Ray, Slurm) or by the OOM killer:
    pasta must not stay behind holding the namespace and the UDP ports it bound (a review found it did, daemonised,
    as long as the host ran)."""
    ex = LocalExecutor()
    ex.launch(launch(tmp_path, "sleep 300", network="private"), time.time())
    box = sandbox_record(tmp_path)
    pasta, outer = int(box["pasta_pid"]), int(box["bwrap_pids"][0])
    supervisor = int(Path(f"/proc/{outer}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert "rankrun" in Path(f"/proc/{supervisor}/cmdline").read_bytes().decode(errors="replace")
    os.kill(supervisor, signal.SIGKILL)
    try:
        assert _gone_within(pasta, 5), "pasta outlived its supervisor"
    finally:
        for pid in (int(box["init_pid"]), outer, pasta):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# ---- network: auto, the operator's default for single-node work ------------------------------------------------------
def test_a_spec_that_names_no_network_is_auto_and_keeps_its_ports_and_nodes() -> None:
    spec = parse_spec({"name": "a", "command": "true", "ports": [8000], "resources": {"gpus": 16, "nodes": 2}})
    assert spec.network == "auto" and spec.ports == (8000,) and spec.resources.nodes == 2


@pytest.mark.parametrize(
    ("network", "nodes", "ports", "default", "expected"),
    [
        ("auto", 1, (), "private", "private"),
        ("auto", 0, (), "private", "private"),  # CPU-only work: one node
        ("auto", 2, (), "private", "host"),  # ranks on two nodes meet over the hosts' network
        ("auto", 1, (8000,), "private", "host"),  # ports the proxy could not reach in a namespace (not root, remote)
        ("auto", 1, (), "host", "host"),
        ("host", 1, (), "private", "host"),  # what a spec names, it gets
        ("private", 1, (), "host", "private"),
        ("none", 1, (), "private", "none"),
    ],
)
def test_auto_is_the_operators_default_where_the_work_can_have_it(
    network: str, nodes: int, ports: tuple[int, ...], default: str, expected: str
) -> None:
    from suanli.control.workloads.sandboxes import resolve_network

    assert resolve_network(network, nodes, ports, default) == expected
    # where the proxy can enter the namespace (a root server's local executor), ports no longer need the host's
    reachable = "private" if (network, nodes, default) == ("auto", 1, "private") else expected
    assert resolve_network(network, nodes, ports, default, ports_reachable=True) == reachable


@needs_pasta
def test_a_server_whose_default_is_private_gives_it_to_work_that_names_no_network(tmp_path: Path) -> None:
    from tests.control_plane import live_server
    from tests.test_workloads_e2e import FAST, TERMINAL, Api

    home = tmp_path / "home"
    with live_server(
        home, f"sqlite+pysqlite:///{tmp_path / 'suanli.db'}", env={**FAST, "SUANLI_NETWORK": "private"}
    ) as srv:
        api = Api(srv)
        api.setup()
        port = srv.url.rsplit(":", 1)[1]
        probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)\""
        unnamed = api.submit({"name": "net-auto", "command": probe, "resources": {"gpus": 0}})
        ported = api.submit({"name": "net-ports", "command": probe, "resources": {"gpus": 0}, "ports": [8123]})
        host = api.submit({"name": "net-host", "command": probe, "resources": {"gpus": 0}, "network": "host"})
        for job in (unnamed, ported):  # ports too, where the proxy can enter a namespace (root)
            w = api.until(job, lambda w: w["state"] in TERMINAL)
            wants = "failed" if os.geteuid() == 0 or job == unnamed else "succeeded"
            assert w["state"] == wants, api.logs(job)
            assert wants == "succeeded" or "ConnectionRefusedError" in api.logs(job), api.logs(job)
            assert w["spec"]["network"] == "auto"
        assert api.until(host, lambda w: w["state"] in TERMINAL)["state"] == "succeeded", api.logs(host)


@needs_pasta
def test_the_server_says_at_start_what_auto_means_and_warns_when_pasta_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from suanli.control.workloads.sandboxes import SandboxPolicy

    assert "network" not in SandboxPolicy().startup_note()
    assert "gets its own (network: private)" in SandboxPolicy(network="private").startup_note()
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "pasta" else "/usr/bin/" + name)
    assert "WARNING: network: private is the default, but pasta is not installed" in (
        SandboxPolicy(network="private").startup_note()
    )


@needs_pasta
def test_torch_rendezvouses_inside_a_private_network_and_its_store_is_on_no_host_port(tmp_path: Path) -> None:
    """What private is for: three ranks meet through torch.distributed (a TCPStore on MASTER_ADDR:MASTER_PORT, gloo
    over loopback) inside the job's own namespace, and while they do, the host sees no listener on that port."""
    pytest.importorskip("torch")
    from tests.control_plane import live_server
    from tests.test_workloads_api import archive
    from tests.test_workloads_e2e import FAST, TERMINAL, TRAIN, Api

    train = "import os, socket, time\n" + TRAIN.replace(
        "dist.destroy_process_group()",
        "open(f'port-{rank}', 'w').write(os.environ['MASTER_PORT'])\ntime.sleep(3)\ndist.destroy_process_group()",
    )
    home = tmp_path / "home"
    with live_server(home, f"sqlite+pysqlite:///{tmp_path / 'suanli.db'}", env=FAST) as srv:
        api = Api(srv)
        api.setup()
        command = ("python3 -m torch.distributed.run --nnodes $SUANLI_NODES --node-rank $NODE_RANK "
                   "--nproc-per-node 3 --master-addr $MASTER_ADDR --master-port $MASTER_PORT train.py")  # fmt: skip
        wid = api.submit({"name": "ddp", "command": command, "network": "private", "env": {"GLOO_SOCKET_IFNAME": "lo"},
                          "resources": {"gpus": 0}}, workdir_archive=archive({"train.py": train}))  # fmt: skip
        marker, deadline = srv.home / "workloads" / wid / "workdir" / "port-0", time.monotonic() + 120
        while not marker.exists():
            assert time.monotonic() < deadline and api.get(wid)["state"] not in TERMINAL, api.logs(wid)
            time.sleep(0.1)
        port = int(marker.read_text())
        host_ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                host_ports.add(int(line.split()[1].rsplit(":", 1)[1], 16))
        assert port not in host_ports  # torch's store listens in the job's namespace only
        done = api.until(wid, lambda w: w["state"] in TERMINAL, timeout=120)
        assert done["state"] == "succeeded", api.logs(wid)
        assert (srv.home / "workloads" / wid / "workdir" / "result.txt").read_text() == "3 6"


# ---- ports: the proxy reaches a private namespace --------------------------------------------------------------------
@needs_pasta
def test_the_proxy_reaches_a_port_served_inside_a_private_network(tmp_path: Path) -> None:
    """An instance with `network: private` and `ports:` serves on its own loopback: no host port listens, and the
    server's proxy still reaches it (a socket made in the sandbox's namespace), for its owner only."""
    import httpx

    from tests.control_plane import admin_token, bearer, free_port, live_server, signup
    from tests.test_proxy_e2e import World, _browser, _submit, _wait_running
    from tests.test_workloads_e2e import FAST

    port = free_port()
    with live_server(tmp_path / "home", f"sqlite+pysqlite:///{tmp_path / 'suanli.db'}", env=FAST) as srv:
        http = httpx.Client(base_url=srv.url, timeout=30)
        adm = bearer(admin_token(http))
        assert http.post("/api/v1/admin/clusters", json={"local": True, "name": "this-host"}, headers=adm).status_code == 201  # fmt: skip
        tenant = signup(http, "tenant@example.com")
        http.post(f"/api/v1/admin/orgs/{tenant.org_id}/transactions", json={"kind": "topup", "amount": "100"},
                  headers=adm).raise_for_status()  # fmt: skip
        ws_port = free_port()
        echo = ("import asyncio\nfrom websockets.asyncio.server import serve\n"
                "async def echo(ws):\n    async for m in ws:\n        await ws.send('private ' + m)\n"
                "async def main():\n    async with serve(echo, '127.0.0.1', PORT):\n        await asyncio.Future()\n"
                "asyncio.run(main())\n").replace("PORT", str(ws_port))  # fmt: skip
        serve = (f"echo served-privately > hello.txt; printf %s {shlex.quote(echo)} > echo.py; python3 echo.py & "
                 f"exec python3 -m http.server {port} --bind 127.0.0.1")  # fmt: skip
        wid = _submit(http, tenant, {"name": "private-box", "kind": "instance", "command": serve, "network": "private",
                                     "ports": [port, ws_port], "resources": {"gpus": 0}})  # fmt: skip
        _wait_running(http, tenant, wid)
        try:
            world = World(srv, http, tenant, tenant, adm, wid, wid, wid, port)
            b = _browser(world, tenant, wid, port)
            deadline = time.monotonic() + 30
            while (r := b.get(f"/i/{wid}/port/{port}/hello.txt")).status_code == 503:
                assert time.monotonic() < deadline, r.text
                time.sleep(0.3)
            assert (r.status_code, r.text) == (200, "served-privately\n")
            host_ports = {int(line.split()[1].rsplit(":", 1)[1], 16) for t in ("/proc/net/tcp", "/proc/net/tcp6")
                          for line in Path(t).read_text().splitlines()[1:]}  # fmt: skip
            assert port not in host_ports and ws_port not in host_ports  # served in its own namespace, not the host's
            # A ¥10 sign-up of another org: no link into it, nothing without a session, nothing on its own session.
            mallory = signup(http, "mallory@example.com")
            assert http.post(f"/api/v1/workloads/{wid}/proxy", json={"port": port},
                             headers=mallory.headers).status_code == 404  # fmt: skip
            anon = httpx.Client(base_url=srv.url, timeout=30)
            assert anon.get(f"/i/{wid}/port/{port}/hello.txt").status_code == 403
            assert anon.get(f"/i/{wid}/port/{port + 1 if port < 65535 else 1024}/").status_code == 403  # unlisted
            theirs = _submit(http, mallory, {"name": "m-box", "kind": "instance", "resources": {"gpus": 0},
                                             "network": "private", "ports": [port]})  # fmt: skip
            _wait_running(http, mallory, theirs)
            mine = _browser(
                World(srv, http, mallory, mallory, adm, theirs, theirs, theirs, port), mallory, theirs, port
            )
            assert mine.get(f"/i/{wid}/port/{port}/hello.txt").status_code == 403  # her session, the tenant's path
            http.post(f"/api/v1/workloads/{theirs}/stop", headers=mallory.headers)
            from websockets.sync.client import connect

            cookie = "; ".join(f"{k}={v}" for k, v in b.cookies.items())
            url = srv.url.replace("http://", "ws://") + f"/i/{wid}/port/{ws_port}/"
            deadline = time.monotonic() + 30
            while True:
                try:
                    with connect(url, additional_headers={"Cookie": cookie}, open_timeout=10) as ws:
                        ws.send("hello")
                        assert ws.recv(timeout=10) == "private hello"
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        finally:
            http.post(f"/api/v1/workloads/{wid}/stop", headers=tenant.headers)


def test_no_thread_to_enter_a_namespace_is_a_refusal_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy answers 503 for what `NoWayIn` says; a RuntimeError (no thread to be had) would be a 500."""
    import threading

    from suanli.sandbox import ns_socket

    monkeypatch.setattr(ns_socket, "running", lambda f: ({"network": "private"}, os.getpid(), {os.getppid()}))

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(ns_socket.NoWayIn):
        ns_socket.socket_in("record.json", socket.AF_INET)


# ---- hostile values --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value", [None, 1, True, "PRIVATE", "private\x00", ["private"], {"private": 1}, "auto " * 2000, "host;none"]
)
def test_a_malformed_network_from_a_fresh_sign_up_is_a_422_naming_the_field(api: Any, value: object) -> None:
    """A ¥10 sign-up (no top-up) sends junk in `network`: a 422 naming the field, nothing queued, never a 500."""
    from tests.control_plane import signup

    cheap = signup(api, "cheap@example.com")
    spec = {"name": "junk", "command": "true", "resources": {"gpus": 0}, "network": value}
    r = api.post("/api/v1/workloads", json={"spec": spec}, headers=cheap.headers)
    detail = r.json()["detail"]  # NUL is refused at the edge for every field: "(at network)"
    assert r.status_code == 422 and (detail.startswith("network: ") or "(at network)" in detail), r.text
    assert api.get("/api/v1/workloads", headers=cheap.headers).json() == []


@pytest.mark.parametrize("value", ["none", "auto", "bridge", "PRIVATE", ""])
def test_the_operators_network_setting_takes_host_or_private_only(value: str) -> None:
    from suanli.control.errors import Invalid
    from suanli.control.settings import load

    if value == "":  # unset: the default
        assert load(environ={"SUANLI_NETWORK": value}).network == "host"
        return
    with pytest.raises(Invalid, match="network"):
        load(environ={"SUANLI_NETWORK": value})
    assert load(environ={"SUANLI_NETWORK": "private"}).network == "private"
