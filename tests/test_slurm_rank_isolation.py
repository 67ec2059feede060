"""What a sandboxed rank on a Slurm node sees and does, probed by a hostile review, which held: with a victim tenant's
job running on another node and every path and its job id given, an attacker's rank finds no Slurm, munge, JWT or
server state, no other rank's files, descriptors or processes, nothing in its environment, and cannot list, submit,
attach to or cancel jobs; Slurm's own cancel leaves no process of the tenant. (What it can read: the host path of its
own workdir in /proc/self/mountinfo, as docs/isolation.md says.)"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from suanli.executors.base import SandboxRequest
from suanli.executors.slurm_executor import SlurmExecutor
from tests.slurm_cluster import SlurmCluster
from tests.slurm_cluster import slurm_session as slurm_session
from tests.test_slurm_executor import UID, logs, make_launch, rank, wait_done

PROBE = r"""
import json, os, socket, subprocess, sys
out = {"env": dict(os.environ), "fds": {}, "procs": {}, "paths": {}, "tools": {}}
for fd in os.listdir("/proc/self/fd"):
    try:
        out["fds"][fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as e:
        out["fds"][fd] = f"ERR {e}"
for pid in filter(str.isdigit, os.listdir("/proc")):
    p = {}
    try:
        p["cmdline"] = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError as e:
        p["cmdline"] = f"ERR {e}"
    for link in ("cwd", "root"):
        try:
            p[link] = os.readlink(f"/proc/{pid}/{link}")
            p[link + "_ls"] = sorted(os.listdir(f"/proc/{pid}/{link}"))
        except OSError as e:
            p.setdefault(link, f"ERR {e}")
    try:
        p["fds"] = {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError as e:
        p["fds"] = f"ERR {e}"
    out["procs"][pid] = p
out["mountinfo"] = open("/proc/self/mountinfo").read()
for path in json.loads(os.environ["PROBE_PATHS"]):
    r = {"exists": os.path.lexists(path)}
    try:
        if os.path.isdir(path):
            r["ls"] = sorted(os.listdir(path))
        else:
            with open(path, "rb") as f:
                r["read"] = f.read(64).hex()
    except OSError as e:
        r["err"] = str(e)
    out["paths"][path] = r
env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": "/workspace/slurm.conf", "HOME": "/workspace"}
victim = os.environ["VICTIM_JOB"]
for name, argv in {
    "squeue": ["squeue", "-h", "-a", "-o", "%i|%j|%u|%o"],
    "scontrol": ["scontrol", "show", "job", victim],
    "sbatch": ["sbatch", "--wrap", "touch /tmp/probe-sbatch"],
    "srun_overlap": ["srun", f"--jobid={victim}", "--overlap", "-N1", "true"],
    "scancel": ["scancel", victim],
}.items():
    try:
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20)
        out["tools"][name] = {"rc": r.returncode, "out": r.stdout, "err": r.stderr[-400:]}
    except (OSError, subprocess.TimeoutExpired) as e:
        out["tools"][name] = {"rc": -1, "out": "", "err": str(e)}
json.dump(out, open("/workspace/report.json", "w"))
print("PROBE-DONE", flush=True)
"""


def _alive_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


SECRET = "victim-secret"


@pytest.fixture(scope="module")
def scene(slurm_session: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A victim tenant's Slurm job running, then an attacker's sandboxed rank that probes everything it can."""
    cluster = slurm_session
    ex = SlurmExecutor(str(cluster.conf))
    vdir = tmp_path_factory.mktemp("victim")
    victim = make_launch(vdir, "echo started; exec sleep 300", (rank("node1", 0),), env={"TOKEN": SECRET},
                         sandbox=SandboxRequest(uid=UID, gid=UID))  # fmt: skip
    (victim.workdir / "model.bin").write_text(SECRET)
    vh = ex.launch(victim, time.time())
    deadline = time.monotonic() + 60
    while "RUNNING" not in cluster.run("squeue", "-h", "-j", str(vh["job_id"]), "-o", "%T", check=False).stdout:
        assert time.monotonic() < deadline, logs(vh)
        time.sleep(0.3)
    adir = tmp_path_factory.mktemp("attacker")
    root = cluster.root
    paths = [str(root), str(cluster.conf), str(root / "munge" / "munge.key"), str(root / "run" / "munge.socket"),
             str(root / "jwt.key"), str(root / "state"), str(root / "spool"), str(root / "spool" / "node2"),
             str(root / "log"), str(victim.log_dir), str(victim.workdir), str(victim.workdir / "model.bin"),
             str(victim.log_dir / ".slurm-plan.json"), str(victim.log_dir / "slurm-batch.sh"),
             str(victim.log_dir / "rank-0.sandbox.json"), str(victim.log_dir / "rank-0.log"),
             str(adir / "logs"), str(adir / "logs" / ".slurm-plan.json"), str(adir / "logs" / "slurm-batch.sh"),
             "/etc/munge/munge.key", "/run/munge", "/var/run/munge", "/var/spool/slurmd", "/var/spool/slurm",
             "/var/lib/slurm", "/etc/slurm/jwt.key", "/root"]  # fmt: skip
    attacker = make_launch(adir, "/usr/bin/python3 -I probe.py", (rank("node2", 0),),
                           env={"PROBE_PATHS": json.dumps(paths), "VICTIM_JOB": str(vh["job_id"])},
                           sandbox=SandboxRequest(uid=UID + 1, gid=UID + 1))  # fmt: skip
    (attacker.workdir / "probe.py").write_text(PROBE)
    # What an attacker on a real node reads in /etc/slurm/slurm.conf (world-readable by Slurm's design).
    (attacker.workdir / "slurm.conf").write_text(cluster.conf.read_text())
    ah = ex.launch(attacker, time.time())
    st = wait_done(ex, ah, timeout=120)
    report = json.loads((attacker.workdir / "report.json").read_text())
    yield {"cluster": cluster, "ex": ex, "victim": victim, "vh": vh, "attacker": attacker, "ah": ah, "st": st,
           "report": report, "paths": paths}  # fmt: skip
    ex.stop(vh, time.time())
    wait_done(ex, vh, timeout=60)


@pytest.mark.slurm
def test_slurm_rank_env_holds_nothing_of_slurm_or_the_server(scene: dict[str, Any]) -> None:
    env = scene["report"]["env"]
    bad = {k: v for k, v in env.items() if k.startswith(("SLURM", "SUANLI_LOG", "RAY", "MUNGE", "PG"))}
    assert bad == {}, bad
    host = str(scene["cluster"].root)
    own = {"PROBE_PATHS"}  # the probe's own list of paths to try
    assert not [k for k, v in env.items() if k not in own and (host in v or str(scene["attacker"].log_dir) in v)]


@pytest.mark.slurm
def test_slurm_rank_sees_no_shared_state_no_munge_no_jwt(scene: dict[str, Any]) -> None:
    seen = {p: r for p, r in scene["report"]["paths"].items() if r["exists"]}
    assert seen == {}, seen


@pytest.mark.slurm
def test_slurm_rank_inherits_no_host_descriptors(scene: dict[str, Any]) -> None:
    fds = scene["report"]["fds"]
    extra = {fd: t for fd, t in fds.items() if int(fd) > 2 and not t.startswith(("/proc/", "ERR"))}  # listdir's
    assert extra == {}, fds
    assert fds.get("0") == "/dev/null", fds


@pytest.mark.slurm
def test_slurm_rank_proc_shows_no_host_process_nor_its_directories(scene: dict[str, Any]) -> None:
    procs = scene["report"]["procs"]
    leaks = []
    for pid, p in procs.items():
        text = json.dumps(p)
        for word in ("rankrun", "slurm_task", "slurmstepd", ".slurm-plan", "slurm-batch", "launch.json",
                     str(scene["cluster"].root), "rank-0.sandbox"):  # fmt: skip
            if word in p.get("cmdline", "") or word in str(p.get("cwd_ls", "")) or word in str(p.get("root_ls", "")):
                leaks.append((pid, word, text[:300]))
    assert leaks == [], leaks


@pytest.mark.slurm
def test_slurm_tools_inside_a_rank_neither_list_nor_submit_nor_cancel(scene: dict[str, Any]) -> None:
    tools = scene["report"]["tools"]
    victim_job = str(scene["vh"]["job_id"])
    assert "suanli-wl-1" not in tools["squeue"]["out"] and victim_job not in tools["squeue"]["out"], tools
    assert SECRET not in json.dumps(tools), tools
    assert tools["scontrol"]["rc"] != 0 and "JobName" not in tools["scontrol"]["out"], tools
    assert tools["sbatch"]["rc"] != 0 and "Submitted" not in tools["sbatch"]["out"], tools
    assert tools["srun_overlap"]["rc"] != 0, tools
    out = scene["cluster"].run("squeue", "-h", "-j", victim_job, "-o", "%T", check=False).stdout
    assert "RUNNING" in out, f"the victim's job was cancelled from inside a rank: {tools['scancel']}"


@pytest.mark.slurm
def test_slurm_plain_scancel_leaves_no_tenant_process(slurm_session: SlurmCluster, tmp_path: Path) -> None:
    """Slurm's own cancel (an admin's scancel, a time limit: SIGTERM to the step, KillWait, SIGKILL) must take a
    detached, TERM-ignoring daemon of the rank with it."""
    marker = f"zzrv6{uuid.uuid4().hex[:8]}"
    command = (f"(trap '' TERM HUP INT; setsid sh -c 'trap \"\" TERM HUP INT; exec -a {marker} sleep 600' &); "
               f"trap '' TERM; echo ready; while :; do sleep 1; done")  # fmt: skip
    ex = SlurmExecutor(str(slurm_session.conf))
    launch = make_launch(tmp_path, command, (rank("node3", 0),), sandbox=SandboxRequest(uid=UID, gid=UID))
    handle = ex.launch(launch, time.time())
    deadline = time.monotonic() + 60
    while not _alive_with(marker):
        assert time.monotonic() < deadline, logs(handle)
        time.sleep(0.2)
    slurm_session.run("scancel", str(handle["job_id"]))
    st = wait_done(ex, handle, timeout=60)
    time.sleep(2)
    left = _alive_with(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"still alive after Slurm cancelled the job ({st})"


@pytest.mark.slurm
def test_slurm_rank_with_a_private_network_reaches_no_host_loopback(
    slurm_session: SlurmCluster, tmp_path: Path
) -> None:
    """`network: private` on a Slurm node: the same supervisor starts pasta there. slurmctld listens on the host's
    127.0.0.1 (SlurmctldPort): the rank cannot connect to it, while its own loopback works."""
    import re

    port = int(re.search(r"^SlurmctldPort=(\d+)", slurm_session.conf.read_text(), re.M).group(1))  # type: ignore[union-attr]
    probe = ("import socket\n"
             f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3); print('slurmctld: reached')\n"
             "except OSError as e:\n    print('slurmctld:', type(e).__name__)\n"
             "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
             "socket.create_connection(s.getsockname(), timeout=3); print('own loopback: ok')\n")  # fmt: skip
    ex = SlurmExecutor(str(slurm_session.conf))
    launch = make_launch(tmp_path, "/usr/bin/python3 -I probe.py", (rank("node1", 0),),
                         sandbox=SandboxRequest(uid=UID, gid=UID, network="private"))  # fmt: skip
    (launch.workdir / "probe.py").write_text(probe)
    handle = ex.launch(launch, time.time())
    st = wait_done(ex, handle, timeout=120)
    out = logs(handle)
    assert st.exit_code == 0, out
    assert "slurmctld: ConnectionRefusedError" in out and "own loopback: ok" in out, out
