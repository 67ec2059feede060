"""What a sandboxed rank on a Ray node sees and does, probed by a hostile review, which held: the cluster's token
file, session directories, object store and other ranks' files are not there, its environment and processes hold
nothing of Ray, and Ray's agents refuse it without the token."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from suanli.executors.base import SandboxRequest
from tests.ray_cluster import RayCluster, ray_cluster_fixture  # noqa: F401  (the fixture)
from tests.test_slurm_executor import UID

SECRET = "victim-secret"


RAY_PROBE = r"""
import json, os, urllib.request, urllib.error
out = {"env": dict(os.environ), "paths": {}, "http": {}, "shm": sorted(os.listdir("/dev/shm")),
       "tmp": sorted(os.listdir("/tmp")), "procs": []}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        out["procs"].append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace"))
    except OSError:
        pass
for path in json.loads(os.environ["PROBE_PATHS"]):
    r = {"exists": os.path.lexists(path)}
    try:
        r["data"] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path, "rb").read(64).hex()
    except OSError as e:
        r["err"] = str(e)
    out["paths"][path] = r
for name, (method, url, body) in json.loads(os.environ["PROBE_URLS"]).items():
    req = urllib.request.Request(url, data=body.encode() if body else None, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            out["http"][name] = {"status": resp.status, "body": resp.read(2000).decode(errors="replace")}
    except urllib.error.HTTPError as e:
        out["http"][name] = {"status": e.code, "body": e.read(300).decode(errors="replace")}
    except OSError as e:
        out["http"][name] = {"status": -1, "body": str(e)}
print(json.dumps(out))
"""


def _port(argv: list[str], flag: str) -> int:
    return int(next(a.split("=", 1)[1] for a in argv if a.startswith(f"--{flag}=")))


@pytest.fixture(scope="module")
def ray_scene(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A victim's sandboxed rank on node-1 and an attacker's on node-2 (same host: the other node's files are the
    host's too), the attacker probing the token, Ray's session and object store, and Ray's HTTP agents."""
    import ray

    from suanli.executors.ray_executor import RayExecutor
    from tests.test_ray_executor import make_launch as ray_launch
    from tests.test_ray_executor import ranks_on
    from tests.test_ray_executor import wait_done as ray_wait

    ray.shutdown()  # a driver of its own: earlier modules' node kills and restarts leave this process's one unusable
    node_root = ray_cluster.temp_dir / "nodes"
    ex = RayExecutor(ray_cluster.address, node_root=str(node_root), ready_timeout_s=60)
    ip = ray_cluster.address.rsplit(":", 1)[0]
    victim = ray_launch(tmp_path_factory.mktemp("rvictim"), "exec sleep 120", ranks_on(ray_cluster, ("node-1", (0,))),
                        env={"TOKEN": SECRET}, sandbox=SandboxRequest(uid=UID, gid=UID))  # fmt: skip
    vh = ex.launch(victim, time.time())
    node = ray_cluster.node("node-2")
    head = ray_cluster.node("head")
    agent = f"http://{ip}:{_port(node.argv, 'dashboard-agent-listen-port')}"
    urls = {
        "agent_jobs": ("GET", f"{agent}/api/job_agent/jobs/x", ""),
        "agent_submit": ("POST", f"{agent}/api/job_agent/jobs/",
                         json.dumps({"entrypoint": "touch /tmp/probe-ray"})),
        "runtime_env": ("POST", f"http://{ip}:{_port(node.argv, 'runtime-env-agent-port')}/get_or_create_runtime_env",
                        ""),
        "head_dashboard": ("GET", f"http://127.0.0.1:{_port(head.argv, 'dashboard-port')}/api/jobs/", ""),
    }  # fmt: skip
    paths = [str(ray_cluster.token_file), str(ray_cluster.temp_dir), str(ray_cluster.temp_dir / "node-2"),
             str(ray_cluster.temp_dir / "node-1"), str(node_root), "/tmp/ray", str(victim.workdir),
             str(Path.home() / ".ray" / "auth_token"), str(Path.home() / ".ray")]  # fmt: skip
    adir = tmp_path_factory.mktemp("rattacker")
    attacker = ray_launch(adir, "/usr/bin/python3 -I probe.py", ranks_on(ray_cluster, ("node-2", (1,))),
                          env={"PROBE_PATHS": json.dumps(paths), "PROBE_URLS": json.dumps(urls)},
                          sandbox=SandboxRequest(uid=UID + 1, gid=UID + 1))  # fmt: skip
    (attacker.workdir / "probe.py").write_text(RAY_PROBE)
    ah = ex.launch(attacker, time.time())
    st = ray_wait(ex, ah, timeout=120)
    text = ex.log_path(ah, 0).read_text()
    ex.stop(vh, time.time())
    ray_wait(ex, vh, timeout=60)
    assert st.state == "exited" and st.exit_code == 0, (st, text)
    report = json.loads(text) if text.strip().startswith("{") else None
    return {"st": st, "log": text, "report": report, "cluster": ray_cluster, "paths": paths}


@pytest.mark.ray
def test_ray_rank_reads_no_token_session_or_other_rank(ray_scene: dict[str, Any]) -> None:
    seen = {p: r for p, r in ray_scene["report"]["paths"].items() if r["exists"]}
    assert seen == {}, seen
    assert ray_scene["report"]["shm"] == [] and ray_scene["report"]["tmp"] == [], ray_scene["report"]


@pytest.mark.ray
def test_ray_rank_env_and_processes_hold_nothing_of_ray(ray_scene: dict[str, Any]) -> None:
    env = ray_scene["report"]["env"]
    assert [k for k in env if k.startswith(("RAY", "RAYLET"))] == [], env
    token = ray_scene["cluster"].token_file.read_text().strip()
    assert token not in ray_scene["log"]
    assert not [c for c in ray_scene["report"]["procs"] if "ray" in c.split(" ")[0]], ray_scene["report"]["procs"]


@pytest.mark.ray
def test_ray_agents_refuse_a_rank_without_the_token(ray_scene: dict[str, Any]) -> None:
    http = ray_scene["report"]["http"]
    print(json.dumps(http)[:1500])
    assert any(r["status"] in (401, 403) for r in http.values()), http  # the agents were reached at all
    assert all(r["status"] in (-1, 401, 403) for r in http.values()), http


@pytest.mark.ray
def test_ray_rank_with_a_private_network_reaches_no_host_loopback(ray_cluster: RayCluster, tmp_path: Path) -> None:
    """`network: private` on a Ray node: the same supervisor starts pasta there. The head's dashboard listens on
    the host's 127.0.0.1: the rank cannot connect to it, while its own loopback works."""
    import ray

    from suanli.executors.ray_executor import RayExecutor
    from tests.test_ray_executor import make_launch as ray_launch
    from tests.test_ray_executor import ranks_on
    from tests.test_ray_executor import wait_done as ray_wait

    ray.shutdown()
    port = _port(ray_cluster.node("head").argv, "dashboard-port")
    probe = ("import socket\n"
             f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3); print('dashboard: reached')\n"
             "except OSError as e:\n    print('dashboard:', type(e).__name__)\n"
             "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
             "socket.create_connection(s.getsockname(), timeout=3); print('own loopback: ok')\n")  # fmt: skip
    ex = RayExecutor(ray_cluster.address, node_root=str(ray_cluster.temp_dir / "nodes"), ready_timeout_s=60)
    launch = ray_launch(tmp_path, "/usr/bin/python3 -I probe.py", ranks_on(ray_cluster, ("node-2", (1,))),
                        sandbox=SandboxRequest(uid=UID, gid=UID, network="private"))  # fmt: skip
    (launch.workdir / "probe.py").write_text(probe)
    handle = ex.launch(launch, time.time())
    st = ray_wait(ex, handle, timeout=120)
    text = ex.log_path(handle, 0).read_text()
    assert st.exit_code == 0, (st, text)
    assert "dashboard: ConnectionRefusedError" in text and "own loopback: ok" in text, text
