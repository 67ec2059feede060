"""The Slurm executor against a real one-host Slurm cluster (tests/slurm_cluster.py: slurmctld and 4 slurmd):
discovery, ranks pinned to the nodes asked for, a torch.distributed (gloo) all-reduce across two Slurm nodes
(unsandboxed and sandboxed), exit codes and gang failure, stop with grace, heterogeneous GPU counts, pending jobs,
a killed slurmd, and a job Slurm no longer knows.

The core of it runs twice, `[cli]` over Slurm's tools and `[rest]` over the cluster's real slurmrestd (openapi/v0.0.38
on a unix socket): the same assertions, the records either transport reads compared field by field with scontrol's,
and with REST no call to the tools but those `slurm_rest` says 22.05's REST API cannot make."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from suanli.executors import slurm_nodes
from suanli.executors.base import Launch, NodeRank, SandboxRequest, Status
from suanli.executors.slurm_api import SlurmError
from suanli.executors.slurm_cli import SlurmCLI
from suanli.executors.slurm_executor import SlurmExecutor
from tests.slurm_cluster import SlurmCluster, require_slurm
from tests.slurm_cluster import slurm_session as slurm_session

pytestmark = pytest.mark.slurm
UID = 0x10000123 if os.geteuid() == 0 else None  # a root server runs sandboxes as a uid of their own
ADDR = "127.0.0.1"  # every node's NodeAddr in the fixture


@pytest.fixture
def slurm(slurm_session: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster, with no job left behind by the test and every node idle again after it."""
    yield slurm_session
    slurm_session.run("scancel", "--user", str(os.geteuid()), check=False)
    slurm_session.wait_idle(timeout=30)


# What the REST transport may still ask of the tools (see slurm_rest): the batch shell's signal, the switch tree.
CLI_UNDER_REST = {("scancel", "--batch"), ("scontrol", "show")}


@pytest.fixture(params=["cli", "rest"])
def rest(request: pytest.FixtureRequest, slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[str | None]:
    """The transport under test: None for the tools, else slurmrestd's address. Under REST every call that reaches
    the tools is recorded, and must be one of CLI_UNDER_REST."""
    if request.param == "cli":
        yield None
        return
    require_slurm(rest=True)
    assert slurm.rest is not None
    calls: list[tuple[str, ...]] = []
    real = SlurmCLI.run

    def run(self: SlurmCLI, tool: str, args: Sequence[str], check: bool = True, timeout_s: float | None = None,
            env: Any = None) -> str:  # fmt: skip
        calls.append((tool, *args))
        return real(self, tool, args, check, timeout_s, env)

    monkeypatch.setattr(SlurmCLI, "run", run)
    yield slurm.rest
    assert {c[:2] for c in calls} <= CLI_UNDER_REST, calls


def scontrol_job(slurm: SlurmCluster, job_id: str) -> list[dict[str, str]]:
    """`scontrol -o show job` of the job, straight from the tool (not through a transport under test)."""
    return slurm_nodes.records(slurm.run("scontrol", "-o", "show", "job", job_id).stdout)


def same_as_scontrol(records: list[dict[str, str]] | None, scontrol: list[dict[str, str]], least: int) -> None:
    """Every field a transport gives that scontrol prints too reads as scontrol's (at least `least` of them)."""
    assert records is not None and len(records) == len(scontrol)
    for rec, want in zip(records, scontrol, strict=True):
        common = [k for k in rec if k in want]
        assert len(common) >= least, (rec, want)
        assert {k: rec[k] for k in common} == {k: want[k] for k in common}


def free_port() -> int:
    with socket.socket() as s:
        s.bind((ADDR, 0))
        return int(s.getsockname()[1])


def make_launch(tmp_path: Path, command: str, ranks: tuple[NodeRank, ...], **kw: Any) -> Launch:
    workdir, log_dir = tmp_path / "work", tmp_path / "logs"
    workdir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    kw.setdefault("env", {})
    kw.setdefault("grace_s", 3.0)
    return Launch(workload_id="wl-1", attempt=1, command=command, workdir=workdir, ranks=ranks, log_dir=log_dir,
                  master_addr=ranks[0].address or ADDR, **kw)  # fmt: skip


def rank(node: str, n: int, gpus: tuple[int, ...] = ()) -> NodeRank:
    return NodeRank(f"slurm/{node}", n, gpus, host=node, address=ADDR)


def wait_done(ex: SlurmExecutor, handle: dict[str, Any], timeout: float = 30.0) -> Status:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = ex.poll(handle, time.time())
        if st.state != "running":
            return st
        time.sleep(0.2)
    raise AssertionError(f"still running after {timeout}s: {st}; {logs(handle)}")


def wait_for(path: Path, text: str = "", timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{path} has no {text!r}"
        time.sleep(0.1)


def logs(handle: dict[str, Any]) -> str:
    paths = [Path(r["log_file"]) for r in handle["ranks"]] + [Path(handle["batch_err"])]
    return " | ".join(f"{p.name}: {p.read_text()!r}" for p in paths if p.exists())


# -- discovery ------------------------------------------------------------------------------------------


def test_discovery_finds_every_node_its_gpus_topology_and_others_busy_gpus(slurm: SlurmCluster,
                                                                             tmp_path: Path) -> None:  # fmt: skip
    ex = SlurmExecutor(str(slurm.conf))
    nodes = {n.name: n for n in ex.nodes()}
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    for n in nodes.values():
        assert (n.host, n.address, n.gpu_count, n.gpu_model, n.cpu_count, n.memory_mib) == (
            n.name, ADDR, 8, "H100-SXM", 8, 16384)  # fmt: skip
        assert n.alive and n.busy_gpus == 0
    assert {n: (v.labels["suanli.io/leaf"], v.labels["suanli.io/spine"]) for n, v in nodes.items()} == {
        "node1": ("leaf1", "spine"), "node2": ("leaf1", "spine"), "node3": ("leaf2", "spine"),
        "node4": ("leaf2", "spine")}  # fmt: skip
    assert nodes["node1"].labels["suanli.io/slurm-partitions"] == "gpu,half"
    assert [n.name for n in SlurmExecutor(str(slurm.conf), partition="half").nodes()] == ["node1", "node2"]

    # A job submitted with plain sbatch holds 3 GPUs of node4; suanli's own job there (2 GPUs) is not "busy".
    slurm.run("sbatch", "-w", "node4", "--gres=gpu:3", "--job-name=outsider", "--wrap", "sleep 60")
    handle = ex.launch(make_launch(tmp_path, "sleep 60", (rank("node4", 0, (6, 7)),)), time.time())
    wait_for(tmp_path / "logs" / "rank-0.slurm.json")
    node4 = next(n for n in ex.nodes() if n.name == "node4")
    assert node4.busy_gpus == 3 and node4.alive
    ex.stop(handle, time.time())
    assert wait_done(ex, handle).state == "exited"


def test_discovery_over_slurmrestd_finds_what_the_tools_find(slurm: SlurmCluster, tmp_path: Path) -> None:
    require_slurm(rest=True)
    tools, restd = SlurmExecutor(str(slurm.conf)), SlurmExecutor(str(slurm.conf), rest=slurm.rest)
    # Others' GPUs, suanli's own (submitted over REST), and a drained node with a reason: all read from JSON.
    slurm.run("sbatch", "-w", "node4", "--gres=gpu:3", "--job-name=outsider", "--wrap", "sleep 60")
    handle = restd.launch(make_launch(tmp_path, "sleep 60", (rank("node4", 0, (6, 7)),)), time.time())
    wait_for(tmp_path / "logs" / "rank-0.slurm.json")
    slurm.run("scontrol", "update", "nodename=node2", "state=drain", "reason=fan failure on node2")
    try:
        found = restd.nodes()
        assert found == tools.nodes()
        assert {n.name: (n.alive, n.busy_gpus) for n in found if not n.alive or n.busy_gpus} == {
            "node2": (False, 0), "node4": (True, 3)}  # fmt: skip
        assert "fan failure on node2" in next(n.reason for n in found if n.name == "node2")
        half = SlurmExecutor(str(slurm.conf), partition="half", rest=slurm.rest).nodes()
        assert half == SlurmExecutor(str(slurm.conf), partition="half").nodes() and len(half) == 2
        scontrol = slurm_nodes.records(slurm.run("scontrol", "-d", "-o", "show", "node", "node2,node4").stdout)
        assert len(scontrol) == 2
        same_as_scontrol(restd.api.node_records(["node4", "node2"]), scontrol, least=10)  # in Slurm's order
    finally:
        slurm.run("scontrol", "update", "nodename=node2", "state=resume")
        restd.stop(handle, time.time())
    assert wait_done(restd, handle).state == "exited"


def test_over_tcp_with_a_jwt_as_slurm_names_it(slurm: SlurmCluster, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    require_slurm(jwt=True)
    assert slurm.rest_jwt is not None
    monkeypatch.setenv("SLURM_JWT", slurm.token(lifespan_s=600))  # what `scontrol token` prints, as an operator sets it
    ex = SlurmExecutor(str(slurm.conf), rest=slurm.rest_jwt)
    launch = make_launch(tmp_path, 'echo "$SLURMD_NODENAME"; exit $((RANK * 5))', (rank("node2", 0, (0,)),
                                                                                 rank("node4", 1, (1,))))  # fmt: skip
    handle = ex.launch(launch, time.time())
    assert wait_done(ex, handle) == Status("exited", 5, "exit code 5 (rank 1 on node4)"), logs(handle)
    assert [ex.log_path(handle, n).read_text() for n in (0, 1)] == ["node2\n", "node4\n"]  # type: ignore[union-attr]
    same_as_scontrol(ex.api.job_records(handle["job_id"]), scontrol_job(slurm, handle["job_id"]), least=10)
    assert ex.nodes() == SlurmExecutor(str(slurm.conf)).nodes()
    monkeypatch.setenv("SLURM_JWT", "not-a-token")
    with pytest.raises(SlurmError, match=r"^slurmrestd GET nodes: .+ \(HTTP \d+\)$"):
        SlurmExecutor(str(slurm.conf), rest=slurm.rest_jwt).nodes()


# -- running ranks --------------------------------------------------------------------------------------


def test_each_rank_runs_on_the_node_it_was_given(slurm: SlurmCluster, tmp_path: Path, rest: str | None) -> None:
    ex = SlurmExecutor(str(slurm.conf), rest=rest, sbatch_args=("--time=7", "--comment", "site-args"))
    command = 'echo "$SLURMD_NODENAME rank=$RANK of $WORLD_SIZE gpus=$CUDA_VISIBLE_DEVICES master=$MASTER_ADDR"'
    launch = make_launch(tmp_path, command, (rank("node3", 0, (4, 5)), rank("node1", 1, (0, 1))))
    handle = ex.launch(launch, time.time())
    assert json.loads(json.dumps(handle)) == handle
    assert handle["nodes"] == ["node3", "node1"] and handle["job_id"].isdigit()
    st = wait_done(ex, handle)
    assert st == Status("exited", 0, "exit code 0"), logs(handle)
    assert st.ended_at is not None and st.ended_at <= time.time()
    assert ex.log_path(handle, 0).read_text() == "node3 rank=0 of 2 gpus=4,5 master=127.0.0.1\n"
    assert ex.log_path(handle, 1).read_text() == "node1 rank=1 of 2 gpus=0,1 master=127.0.0.1\n"
    assert ex.log_path(handle, 2) is None
    slurm_view = json.loads((tmp_path / "logs" / "rank-0.slurm.json").read_text())
    assert slurm_view["node"] == "node3" and len(slurm_view["slurm_gpus"].split(",")) == 2  # Slurm's own pick
    job = slurm.run("scontrol", "-o", "show", "job", handle["job_id"]).stdout
    assert "JobName=suanli-wl-1-a1" in job and "NumNodes=2" in job and "TresPerNode=gres:gpu:2" in job
    assert "Requeue=0" in job and "TimeLimit=00:07:00" in job and "Comment=site-args" in job
    same_as_scontrol(ex.api.job_records(handle["job_id"]), scontrol_job(slurm, handle["job_id"]), least=10)


ALL_REDUCE = """\
import datetime, os
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} on {os.environ.get('SLURMD_NODENAME', 'sandbox')}: sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""


def torch_run(slurm: SlurmCluster, tmp_path: Path, sandbox: SandboxRequest | None) -> tuple[Status, list[str]]:
    pytest.importorskip("torch")
    ex = SlurmExecutor(str(slurm.conf))
    ranks = (rank("node2", 0), rank("node3", 1))
    launch = make_launch(tmp_path, f"{sys.executable} all_reduce.py", ranks, master_port=free_port(),
                         env={"GLOO_SOCKET_IFNAME": "lo"}, sandbox=sandbox)  # fmt: skip
    (launch.workdir / "all_reduce.py").write_text(ALL_REDUCE)
    handle = ex.launch(launch, time.time())
    st = wait_done(ex, handle, timeout=90)
    return st, [ex.log_path(handle, n).read_text().strip() for n in (0, 1)]  # type: ignore[union-attr]


def test_two_slurm_nodes_all_reduce_through_torch_distributed_gloo(slurm: SlurmCluster, tmp_path: Path) -> None:
    st, out = torch_run(slurm, tmp_path, sandbox=None)
    assert st == Status("exited", 0, "exit code 0"), out
    assert out == ["rank 0 on node2: sum 3", "rank 1 on node3: sum 3"]


@pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
                    reason="bubblewrap is not installed (apt install bubblewrap)")  # fmt: skip
def test_sandboxed_ranks_all_reduce_too(slurm: SlurmCluster, tmp_path: Path) -> None:
    # The venv and its base Python, read-only at their own paths, are what the sandbox needs to run torch.
    mounts = ((sys.prefix, sys.prefix, False), (sys.base_prefix, sys.base_prefix, False))
    st, out = torch_run(slurm, tmp_path, SandboxRequest(uid=UID, gid=UID, mounts=mounts))
    assert st == Status("exited", 0, "exit code 0"), out
    assert out == ["rank 0 on sandbox: sum 3", "rank 1 on sandbox: sum 3"]  # no Slurm variables inside


def test_exit_codes_and_a_failing_rank_stops_the_gang(slurm: SlurmCluster, tmp_path: Path, rest: str | None) -> None:
    ex = SlurmExecutor(str(slurm.conf), rest=rest)
    handle = ex.launch(make_launch(tmp_path / "a", "exit 7", (rank("node1", 0),)), time.time())
    assert wait_done(ex, handle) == Status("exited", 7, "exit code 7")

    command = 'if [ "$RANK" = 1 ]; then sleep 1; exit 3; fi; exec sleep 60'
    launch = make_launch(tmp_path / "b", command, (rank("node2", 0), rank("node4", 1)))
    started = time.monotonic()
    handle = ex.launch(launch, time.time())
    assert wait_done(ex, handle) == Status("exited", 3, "exit code 3 (rank 1 on node4)")
    assert time.monotonic() - started < 20
    assert (launch.log_dir / "rank-0.rc").read_text() == "-15\n"  # stopped by the gang, not left to sleep
    assert "JobState=COMPLETED" in slurm.run("scontrol", "-o", "show", "job", handle["job_id"]).stdout


def test_nothing_of_the_servers_environment_reaches_slurm(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sbatch runs in PATH, HOME, locale and SLURM_CONF alone: a secret of the server's is not stored by slurmctld
    nor seen by the job, and an SBATCH_* variable of the server's does not become an option."""
    monkeypatch.setenv("SUANLI_TEST_SECRET", "hunter2")
    monkeypatch.setenv("SBATCH_TIMELIMIT", "7")
    ex = SlurmExecutor(str(slurm.conf))
    launch = make_launch(tmp_path, "cat /proc/$$/environ | tr '\\0' '\\n'; env", (rank("node1", 0),))
    handle = ex.launch(launch, time.time())
    rec = scontrol_job(slurm, handle["job_id"])[0]
    assert rec["TimeLimit"] != "00:07:00", rec["TimeLimit"]
    assert wait_done(ex, handle).state == "exited"
    batch = Path(handle["batch_out"]).read_text() + Path(handle["batch_err"]).read_text()
    assert "hunter2" not in logs(handle) + batch
    assert "PATH=" in logs(handle)  # the rank's own environment was printed


def test_stop_sends_sigterm_to_the_job_and_sigkill_after_grace(slurm: SlurmCluster, tmp_path: Path,
                                                               rest: str | None) -> None:  # fmt: skip
    ex = SlurmExecutor(str(slurm.conf), rest=rest)
    command = ('if [ "$RANK" = 0 ]; then trap "echo got TERM; exit 0" TERM; else trap "" TERM; fi; '
               "echo ready; while true; do sleep 0.1; done")  # fmt: skip
    launch = make_launch(tmp_path, command, (rank("node1", 0), rank("node3", 1)), grace_s=2.0)
    handle = ex.launch(launch, time.time())
    for n in (0, 1):
        wait_for(launch.log_dir / f"rank-{n}.log", "ready")
    started = time.monotonic()
    ex.stop(handle, time.time())
    ex.stop(handle, time.time())  # idempotent
    st = wait_done(ex, handle, timeout=15)
    assert time.monotonic() - started < 2.0 + 5.0
    assert st == Status("exited", -9, "killed by SIGKILL (rank 1 on node3) (stop requested)"), logs(handle)
    assert "got TERM" in ex.log_path(handle, 0).read_text()  # type: ignore[union-attr]
    assert (launch.log_dir / "rank-0.rc").read_text() == "0\n"


@pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
                    reason="bubblewrap is not installed (apt install bubblewrap)")  # fmt: skip
def test_a_sandboxed_job_gets_its_grace_period(slurm: SlurmCluster, tmp_path: Path) -> None:
    # Slurm signals every process of a step, bwrap's included; the stop goes past Slurm to the supervisor instead.
    ex = SlurmExecutor(str(slurm.conf))
    command = 'trap "sleep 1; echo graceful; exit 0" TERM; echo ready; while true; do sleep 0.1; done'
    launch = make_launch(tmp_path, command, (rank("node2", 0),), sandbox=SandboxRequest(uid=UID, gid=UID))
    handle = ex.launch(launch, time.time())
    wait_for(launch.log_dir / "rank-0.log", "ready")
    ex.stop(handle, time.time())
    assert wait_done(ex, handle, timeout=15) == Status("exited", 0, "exit code 0 (stop requested)"), logs(handle)
    assert "graceful" in ex.log_path(handle, 0).read_text()  # type: ignore[union-attr]


def test_ranks_with_different_gpu_counts_become_a_heterogeneous_job(slurm: SlurmCluster, tmp_path: Path,
                                                                    rest: str | None) -> None:  # fmt: skip
    ex = SlurmExecutor(str(slurm.conf), rest=rest)
    launch = make_launch(tmp_path, "true", (rank("node1", 0, (0, 1, 2)), rank("node2", 1, (5,))))
    handle = ex.launch(launch, time.time())
    assert [c["gpus"] for c in handle["components"]] == [3, 1]
    assert wait_done(ex, handle) == Status("exited", 0, "exit code 0"), logs(handle)
    picks = [json.loads((launch.log_dir / f"rank-{n}.slurm.json").read_text())["slurm_gpus"] for n in (0, 1)]
    assert [len(p.split(",")) for p in picks] == [3, 1]
    recs = ex.api.job_records(handle["job_id"])
    same_as_scontrol(recs, scontrol_job(slurm, handle["job_id"]), least=12)
    assert recs is not None and [r["HetJobOffset"] for r in recs] == ["0", "1"]


def test_a_job_pending_on_taken_nodes_says_so_then_is_lost(slurm: SlurmCluster, tmp_path: Path,
                                                           rest: str | None) -> None:  # fmt: skip
    outsider = slurm.run("sbatch", "--parsable", "-w", "node3", "--gres=gpu:8", "--wrap", "sleep 60").stdout.strip()
    deadline = time.monotonic() + 10
    while "JobState=RUNNING" not in slurm.run("scontrol", "-o", "show", "job", outsider).stdout:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # Long enough for slurmctld to have looked at the job (its reason is "None" until then) on a busy machine.
    ex = SlurmExecutor(str(slurm.conf), rest=rest, pending_timeout_s=8.0)
    handle = ex.launch(make_launch(tmp_path, "true", (rank("node3", 0, (0,)),)), time.time())
    deadline = time.monotonic() + 8
    while (st := ex.poll(handle, time.time())).reason in ("", "pending in Slurm: None"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert st.state == "running" and st.reason in ("pending in Slurm: Resources", "pending in Slurm: Priority")
    st = wait_done(ex, handle)
    assert st.state == "lost" and "pending for" in st.reason and st.reason.endswith("or refused)")
    assert "JobState=CANCELLED" in slurm.run("scontrol", "-o", "show", "job", handle["job_id"]).stdout


def test_a_job_slurm_does_not_know_or_a_slurm_that_does_not_answer(slurm: SlurmCluster, tmp_path: Path,
                                                                   rest: str | None) -> None:  # fmt: skip
    ex = SlurmExecutor(str(slurm.conf), rest=rest, settle_s=0)
    handle = ex.launch(make_launch(tmp_path, "true", (rank("node1", 0),)), time.time())
    assert wait_done(ex, handle).state == "exited"
    fake = {**handle, "job_id": "999999", "ranks": [{**handle["ranks"][0], "rc_file": str(tmp_path / "none.rc")}]}
    st = ex.poll(fake, time.time())
    assert st.state == "lost" and "vanished from Slurm" in st.reason
    # A controller that does not answer: this cluster's config with a port nobody listens on.
    dead = tmp_path / "dead-slurm.conf"
    dead.write_text(re.sub(r"SlurmctldPort=\d+", f"SlurmctldPort={free_port()}", slurm.conf.read_text()))
    (tmp_path / "logs" / "gang-failure").unlink()
    fake["ranks"][0]["rc_file"] = str(tmp_path / "other.rc")
    if rest is None:
        mute = SlurmExecutor(str(dead), timeout_s=1.0)
        st = mute.poll(fake, time.time())
        assert st.state == "running" and st.reason.startswith("Slurm does not answer")
        mute.stop(fake, time.time())  # no raise either
        return
    # A slurmrestd that is not there, and one that takes the connection and never answers.
    with tempfile.TemporaryDirectory(prefix="suanli-") as short:  # a unix socket's path has at most 107 bytes
        hung = socket.socket(socket.AF_UNIX)
        hung.bind(f"{short}/hung.sock")
        hung.listen(8)
        try:
            for where in (f"unix:{short}/none.sock", f"unix:{short}/hung.sock"):
                mute = SlurmExecutor(str(dead), rest=where, timeout_s=0.5)
                started = time.monotonic()
                st = mute.poll(fake, time.time())
                assert st.state == "running" and st.reason.startswith("Slurm does not answer: slurmrestd at"), st
                mute.stop(fake, time.time())  # no raise either
                with pytest.raises(SlurmError, match="slurmrestd at"):
                    mute.nodes()
                assert time.monotonic() - started < 6  # a few timeouts, no hang
        finally:
            hung.close()


def test_a_killed_slurmd_makes_the_attempt_lost(slurm: SlurmCluster, tmp_path: Path) -> None:
    ex = SlurmExecutor(str(slurm.conf))
    launch = make_launch(tmp_path, "echo ready; exec sleep 120", (rank("node1", 0), rank("node4", 1)))
    handle = ex.launch(launch, time.time())
    for n in (0, 1):
        wait_for(launch.log_dir / f"rank-{n}.log", "ready")
    try:
        killed = time.monotonic()
        slurm.kill_node("node4")
        st = wait_done(ex, handle, timeout=30)
        assert time.monotonic() - killed < 30
        assert st.state == "lost" and "node failure" in st.reason and "node4 is DOWN" in st.reason, st
    finally:
        slurm.restart_node("node4")
