"""The node agent: NVML readings (an in-memory NVML behind the sampler's own interface) posted over real HTTP to a
real server's ingest route, stored against the node's GPUs, kept and re-sent when the server cannot be reached;
and `suanli agent --once` on a host without NVML says so and exits cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from suanli.client import Client
from suanli.telemetry.agent import AgentLoop
from suanli.telemetry.nvml_sampler import NvmlSampler
from tests.control_plane import admin_token, bearer, free_port, live_server
from tests.test_nvml_sampler import FakeNvml, gpu


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("agent")
    with live_server(tmp / "home", f"sqlite+pysqlite:///{tmp / 'suanli.db'}",
                     env={"SUANLI_TELEMETRY_INTERVAL_S": "3600"}) as srv:  # fmt: skip
        http = httpx.Client(base_url=srv.url, timeout=30)
        token = admin_token(http)
        r = http.post("/api/v1/admin/clusters", json={"preset": "1x8:H100", "name": "box"}, headers=bearer(token))
        assert r.status_code == 201, r.text
        yield srv, token
        http.close()


def test_readings_reach_the_server_and_count_as_the_nodes_heartbeat(server) -> None:  # type: ignore[no-untyped-def]
    srv, token = server
    node = "box.h100-sxm-0000"
    with Client(srv.url, token) as c:
        names = {n.name for n in c.admin_nodes()}
        assert node in names, names
        loop = AgentLoop(NvmlSampler(node, FakeNvml([gpu(i) for i in range(8)])), c.post_samples, interval_s=0.05)
        loop.run(threading.Event(), ticks=3)
        assert (loop.sent, loop.failures) == (24, 0)
        gpus = [g for g in c.admin_gpus() if g["node"] == node]
        assert len(gpus) == 8 and all(g["util"] is not None for g in gpus), gpus[:2]


def test_a_batch_the_server_cannot_take_is_kept_and_sent_later(server) -> None:  # type: ignore[no-untyped-def]
    srv, token = server
    node = "box.h100-sxm-0000"
    down = Client(f"http://127.0.0.1:{free_port()}", token, timeout=2)
    with Client(srv.url, token) as up:
        target = {"c": down}
        loop = AgentLoop(NvmlSampler(node, FakeNvml([gpu(i) for i in range(8)])),
                         lambda batch: target["c"].post_samples(batch), clock=iter(range(10**9, 10**10, 7)).__next__)  # fmt: skip
        assert loop.tick() is False and len(loop.pending) == 8 and loop.failures == 1
        target["c"] = up
        assert loop.tick() is True and loop.pending == [] and loop.sent == 16  # both readings, none lost
    down.close()


def test_the_cli_on_a_host_without_nvml(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv, token = server
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUANLI_")}
    env.update(SUANLI_HOME=str(tmp_path), SUANLI_SERVER=srv.url, SUANLI_TOKEN=token, COLUMNS="200")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "suanli.cli.main", "agent", "--node", "box.h100-sxm-0000", "--once"],
                       capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "sent 0 samples" in p.stdout and time.monotonic() - t0 < 60
    assert "no GPU readings" in p.stdout  # this machine has no NVIDIA driver


def _agent_until_sigterm(burst: int) -> subprocess.CompletedProcess[str]:
    """`suanli agent` against a server that is not there, sent `burst` SIGTERMs once it says it runs (a fixed sleep
    was not enough on a loaded machine: the SIGTERM came before the handler and the agent died of it silently)."""
    import signal

    cmd = [sys.executable, "-m", "suanli.cli.main", "agent", "--node", "n1", "--server", "http://127.0.0.1:9",
           "--token", "x", "--interval", "0.5"]  # fmt: skip
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert p.stdout is not None
    guard = threading.Timer(60, p.kill)  # a start line that never comes fails the test instead of hanging it
    guard.start()
    first = p.stdout.readline()  # the agent prints its start line after its SIGTERM handler is in place
    guard.cancel()
    assert first.startswith("agent for n1: a reading every 0.5 s"), first
    for _ in range(burst):
        p.send_signal(signal.SIGTERM)
        time.sleep(0.005)
    try:
        out, _ = p.communicate(timeout=15)
        out = first + out
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        pytest.fail(f"the agent hung after {burst} SIGTERM(s): {out[-500:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, out)


def test_the_agent_stops_on_sigterm_and_a_storm_of_them_never_hangs_it() -> None:
    """A SIGTERM handler that set a threading.Event could take the Event's lock while the same thread held it in
    `wait`, and hang for ever (as the server's loop process did); SIGTERM now acts as Ctrl-C."""
    one = _agent_until_sigterm(1)
    assert one.returncode == 0 and "sent 0 samples" in one.stdout, one.stdout
    storm = _agent_until_sigterm(20)
    assert storm.returncode in (0, -15), storm.stdout  # ended, by its own exit or the default action of a later one
