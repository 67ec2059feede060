"""Executors with real processes: environment, exit codes, stop with grace, re-attach, lost ranks, gangs,
torch.distributed rendezvous (plain and under torchrun); and the virtual executor's clock-driven runs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from suanli.executors import NAMES, executor
from suanli.executors.base import Launch, NodeRank, Status
from suanli.executors.local import LocalExecutor
from suanli.executors.proctree import proc_stat
from suanli.executors.virtual import VirtualExecutor


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_launch(tmp_path: Path, command: str, ranks: tuple[NodeRank, ...] | None = None, **kw: Any) -> Launch:
    workdir, log_dir = tmp_path / "work", tmp_path / "logs"
    workdir.mkdir(exist_ok=True)
    log_dir.mkdir(exist_ok=True)
    kw.setdefault("env", {})
    return Launch(
        workload_id="wl-1",
        attempt=1,
        command=command,
        workdir=workdir,
        ranks=ranks or (NodeRank("myhost", 0, ()),),
        log_dir=log_dir,
        **kw,
    )


def wait_done(ex: LocalExecutor, handle: dict[str, Any], timeout: float = 20.0) -> Status:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = ex.poll(handle, time.time())
        if st.state != "running":
            return st
        time.sleep(0.05)
    ex.stop(handle, time.time())
    raise AssertionError(f"still running after {timeout}s; log: {log_text(ex, handle)!r}")


def wait_file(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text()).endswith("\n"):
            return text
        time.sleep(0.02)
    raise AssertionError(f"{path.name} never appeared")


def log_text(ex: LocalExecutor | VirtualExecutor, handle: dict[str, Any], rank: int = 0) -> str:
    path = ex.log_path(handle, rank)
    return path.read_text() if path and path.exists() else ""


def gone(pid: int) -> bool:
    st = proc_stat(pid)
    return st is None or st[0] in ("Z", "X")


# -- local: environment and exit codes -----------------------------------------------------------------


def test_ranks_get_the_documented_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # the server's own must never leak into a job
    monkeypatch.setenv("SERVER_ONLY", "kept")
    port = free_port()
    launch = make_launch(
        tmp_path,
        'env > "env-$RANK.txt"; ulimit -c > "core-$RANK.txt"',
        ranks=(NodeRank("n001", 0, (0, 1)), NodeRank("n002", 1, ())),
        env={"EPOCHS": "3", "RANK": "99"},
        extra_env={"SUANLI_ORG": "org-1"},
        master_addr="127.0.0.1",
        master_port=port,
    )
    ex = LocalExecutor()
    handle = ex.launch(launch, time.time())
    assert wait_done(ex, handle) == Status("exited", 0, "exit code 0")
    envs = []
    for n in (0, 1):
        lines = (launch.workdir / f"env-{n}.txt").read_text().splitlines()
        envs.append(dict(line.split("=", 1) for line in lines if "=" in line))
        assert (launch.workdir / f"core-{n}.txt").read_text().strip() == "0"
    common = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "SUANLI_WORKLOAD_ID": "wl-1",
        "SUANLI_ATTEMPT": "1",
        "SUANLI_NODES": "2",
        "SUANLI_LOG_DIR": str(launch.log_dir),
        "SUANLI_ORG": "org-1",
        "EPOCHS": "3",
        "SERVER_ONLY": "kept",
    }
    for n, env in enumerate(envs):
        assert {k: env.get(k) for k in common} == common
        assert (env["RANK"], env["NODE_RANK"], env["SUANLI_NODE_RANK"]) == (str(n), str(n), str(n))
    assert (envs[0]["CUDA_VISIBLE_DEVICES"], envs[0]["SUANLI_GPUS_PER_NODE"], envs[0]["SUANLI_NODE"]) == (
        "0,1",
        "2",
        "n001",
    )
    assert (envs[1]["CUDA_VISIBLE_DEVICES"], envs[1]["SUANLI_GPUS_PER_NODE"], envs[1]["SUANLI_NODE"]) == (
        "",
        "0",
        "n002",
    )
    assert json.loads(json.dumps(handle)) == handle
    assert [r["pid"] for r in handle["ranks"]] and all(r["start_ticks"] for r in handle["ranks"])


def test_exit_code_and_output_reach_status_and_log(tmp_path: Path) -> None:
    ex = LocalExecutor()
    handle = ex.launch(make_launch(tmp_path, "echo hello from $SUANLI_NODE; echo oops >&2; exit 3"), time.time())
    assert wait_done(ex, handle) == Status("exited", 3, "exit code 3")
    assert log_text(ex, handle) == "hello from myhost\noops\n"
    assert ex.log_path(handle, 5) is None


@pytest.mark.parametrize("command", ["echo \ud800", "echo a\x00b"])
def test_a_command_no_exec_can_take_is_a_failed_start_not_a_lost_rank(tmp_path: Path, command: str) -> None:
    """A command that cannot become an argv (text no locale encodes, a NUL) fails the job with 127, as a missing
    program does: before, the rank's supervisor died in spawn without an exit code and the attempt read as a node
    failure (refunded, retried as the platform's fault). The spec refuses such text at the edge too."""
    ex = LocalExecutor()
    handle = ex.launch(make_launch(tmp_path, command), time.time())
    st = wait_done(ex, handle)
    assert (st.state, st.exit_code) == ("exited", 127), st
    assert "cannot start the job" in log_text(ex, handle)


def test_gang_fails_together_and_reports_the_first_failure(tmp_path: Path) -> None:
    command = 'if [ "$RANK" = 1 ]; then sleep 0.3; exit 3; fi; exec sleep 60'
    ranks = (NodeRank("myhost", 0, ()), NodeRank("myhost", 1, ()))
    ex = LocalExecutor()
    started = time.monotonic()
    handle = ex.launch(make_launch(tmp_path, command, ranks=ranks, grace_s=5), time.time())
    assert wait_done(ex, handle) == Status("exited", 3, "exit code 3 (rank 1)")
    assert time.monotonic() - started < 5  # rank 0 went on SIGTERM, not after its 60 s
    assert Path(handle["ranks"][0]["rc_file"]).read_text().strip() == str(-signal.SIGTERM)


# -- local: stopping -----------------------------------------------------------------------------------


def test_stop_sends_sigterm(tmp_path: Path) -> None:
    ex = LocalExecutor()
    handle = ex.launch(make_launch(tmp_path, "echo ready; exec sleep 60"), time.time())
    wait_file(Path(handle["ranks"][0]["log_file"]))
    assert ex.poll(handle, time.time()).state == "running"
    ex.stop(handle, time.time())
    assert wait_done(ex, handle, timeout=5) == Status("exited", -15, "killed by SIGTERM (stop requested)")


def test_stop_kills_a_job_that_ignores_sigterm_after_the_grace_period(tmp_path: Path) -> None:
    command = "trap '' TERM; sleep 60 & echo $! > sleep.pid; wait"
    launch = make_launch(tmp_path, command, grace_s=0.5)
    ex = LocalExecutor()
    handle = ex.launch(launch, time.time())
    sleep_pid = int(wait_file(launch.workdir / "sleep.pid"))
    stopped = time.monotonic()
    ex.stop(handle, time.time())
    time.sleep(0.3)
    assert ex.poll(handle, time.time()).state == "running"  # still inside its grace period
    assert wait_done(ex, handle, timeout=5) == Status("exited", -9, "killed by SIGKILL (stop requested)")
    assert 0.5 <= time.monotonic() - stopped < 4
    assert gone(sleep_pid)
    assert "grace period over" in log_text(ex, handle)


def test_a_stuck_supervisor_is_killed_with_its_job(tmp_path: Path) -> None:
    launch = make_launch(tmp_path, "echo $$ > job.pid; exec sleep 60", grace_s=1)
    ex = LocalExecutor()
    handle = ex.launch(launch, time.time())
    job_pid = int(wait_file(launch.workdir / "job.pid"))
    supervisor = handle["ranks"][0]["pid"]
    os.kill(supervisor, signal.SIGSTOP)  # a supervisor that never acts on the SIGTERM
    t = time.time()
    ex.stop(handle, t)
    assert ex.poll(handle, t + 5).state == "running"  # grace 1 s + 5 s not over yet
    assert not gone(job_pid)
    assert ex.poll(handle, t + 6.5).state == "running"  # kills now; the next poll sees the result
    deadline = time.monotonic() + 5
    while not (gone(job_pid) and gone(supervisor)) and time.monotonic() < deadline:
        ex.poll(handle, t + 7)
        time.sleep(0.02)
    assert gone(job_pid) and gone(supervisor)
    assert ex.poll(handle, t + 7) == Status("exited", -9, "killed by SIGKILL (stop requested)")


def test_a_stop_that_races_the_start_runs_nothing(tmp_path: Path) -> None:
    (tmp_path / "stop-requested").write_text("{}")
    rc = tmp_path / "rank-0.rc"
    config = {"rc_file": str(rc), "stop_file": str(tmp_path / "stop-requested"), "grace_s": 1, "command": "touch ran",
              "env": {}, "sandbox": None}  # fmt: skip
    (tmp_path / "launch.json").write_text(json.dumps(config))
    cmd = [sys.executable, "-P", "-m", "suanli.executors.rankrun", str(tmp_path / "launch.json")]
    subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True, timeout=30)
    assert rc.read_text().strip() == "-15"
    assert not (tmp_path / "ran").exists()
    assert not (tmp_path / "launch.json").exists()  # read and deleted: env values do not stay on disk


# -- local: re-attach and lost ranks -------------------------------------------------------------------


def test_a_new_executor_reattaches_from_the_stored_handle(tmp_path: Path) -> None:
    handle = LocalExecutor().launch(make_launch(tmp_path, "sleep 1; exit 4"), time.time())
    stored = json.loads(json.dumps(handle))
    fresh = LocalExecutor()
    assert fresh.poll(stored, time.time()) == Status("running")
    assert wait_done(fresh, stored) == Status("exited", 4, "exit code 4")


def test_a_vanished_rank_is_lost(tmp_path: Path) -> None:
    launch = make_launch(tmp_path, "echo $$ > job.pid; exec sleep 60")
    ex = LocalExecutor()
    handle = ex.launch(launch, time.time())
    job_pid = int(wait_file(launch.workdir / "job.pid"))
    supervisor = handle["ranks"][0]["pid"]
    os.kill(supervisor, signal.SIGKILL)
    os.killpg(job_pid, signal.SIGKILL)
    st = wait_done(ex, handle, timeout=5)
    assert st.state == "lost" and st.exit_code is None
    assert f"process {supervisor} of rank 0 on myhost vanished" in st.reason
    assert LocalExecutor().poll(json.loads(json.dumps(handle)), time.time()) == st


def test_the_job_of_a_killed_supervisor_does_not_outlive_it(tmp_path: Path) -> None:
    launch = make_launch(tmp_path, "echo $$ > job.pid; exec sleep 60")
    ex = LocalExecutor()
    handle = ex.launch(launch, time.time())
    job_pid = int(wait_file(launch.workdir / "job.pid"))
    os.kill(handle["ranks"][0]["pid"], signal.SIGKILL)
    assert wait_done(ex, handle, timeout=5).state == "lost"
    deadline = time.monotonic() + 5
    while not gone(job_pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gone(job_pid)


# -- local: torch.distributed --------------------------------------------------------------------------

ALL_REDUCE = """\
import datetime, os
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
if dist.get_rank() == 0:
    with open("result.txt", "w") as f:
        f.write(f"{t.item():g} {dist.get_world_size()}\\n")
dist.destroy_process_group()
"""


def torch_launch(tmp_path: Path, command: str, ranks: tuple[NodeRank, ...]) -> Launch:
    env = {"GLOO_SOCKET_IFNAME": "lo"} if sys.platform.startswith("linux") else {}  # loopback, whatever DNS says
    launch = make_launch(tmp_path, command, ranks=ranks, master_port=free_port(), env=env)
    (launch.workdir / "all_reduce.py").write_text(ALL_REDUCE)
    return launch


def test_two_node_ranks_meet_in_a_gloo_rendezvous(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ranks = (NodeRank("myhost", 0, ()), NodeRank("myhost", 1, ()))
    launch = torch_launch(tmp_path, f"{sys.executable} all_reduce.py", ranks)
    ex = LocalExecutor()
    handle = ex.launch(launch, time.time())
    assert wait_done(ex, handle, timeout=90) == Status("exited", 0, "exit code 0"), log_text(ex, handle)
    assert (launch.workdir / "result.txt").read_text() == "3 2\n"  # 1 + 2 over a world of 2


def test_torchrun_inside_the_command_builds_its_world(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    command = (
        f"{sys.executable} -m torch.distributed.run --nnodes $SUANLI_NODES --node-rank $NODE_RANK"
        " --nproc-per-node 2 --master-addr $MASTER_ADDR --master-port $MASTER_PORT all_reduce.py"
    )
    launch = torch_launch(tmp_path, command, (NodeRank("myhost", 0, ()),))
    ex = LocalExecutor()
    handle = ex.launch(launch, time.time())
    assert wait_done(ex, handle, timeout=90) == Status("exited", 0, "exit code 0"), log_text(ex, handle)
    assert (launch.workdir / "result.txt").read_text() == "3 2\n"


# -- the supervisor stays light ------------------------------------------------------------------------


def test_the_rank_supervisor_imports_little() -> None:
    code = "import sys, runpy; import suanli.executors.rankrun; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-P", "-c", code], check=True, capture_output=True, text=True, timeout=30)
    modules = set(out.stdout.split())
    assert "suanli.executors.rankrun" in modules
    assert not modules & {"typing", "subprocess", "suanli.executors.base", "suanli.executors.local", "suanli.sandbox"}


def test_registry() -> None:
    assert NAMES == ("local", "virtual", "ray", "slurm")
    assert isinstance(executor("local"), LocalExecutor) and executor("local").name == "local"
    assert isinstance(executor("virtual"), VirtualExecutor) and executor("virtual").name == "virtual"
    assert executor("slurm", slurm_conf="/nonexistent/slurm.conf").name == "slurm"  # built without asking Slurm
    assert executor("ray", address="127.0.0.1:1").name == "ray"  # connects on first use, not when built
    with pytest.raises(ValueError, match="unknown executor 'kubernetes'"):
        executor("kubernetes")


# -- virtual -------------------------------------------------------------------------------------------

T0 = 1_000_000.0


def virtual_launch(tmp_path: Path, duration_s: float | None) -> Launch:
    ranks = (NodeRank("n001", 0, (0, 1, 2, 3)), NodeRank("n002", 1, ()))
    return make_launch(tmp_path, "python train.py", ranks=ranks, duration_s=duration_s)


def test_virtual_run_follows_the_clock_and_logs_progress(tmp_path: Path) -> None:
    ex = VirtualExecutor()
    handle = ex.launch(virtual_launch(tmp_path, 100.0), T0)
    header = "[suanli] virtual run of wl-1 (attempt 1) for 100s on 2 node(s): n001 (GPUs 0,1,2,3), n002 (no GPUs)"
    assert ex.poll(handle, T0) == Status("running")
    assert log_text(ex, handle) == header + "\n"
    assert ex.poll(handle, T0 + 55) == Status("running")
    assert ex.poll(handle, T0 + 55) == Status("running")  # polling twice adds nothing
    lines = log_text(ex, handle).splitlines()
    assert lines[1:] == [f"[+{10.0 * k:.1f}s] step {k}/10, {10 * k}% done" for k in range(1, 6)]
    assert ex.poll(handle, T0 + 100) == Status("exited", 0, "exit code 0")
    other = VirtualExecutor()  # another server process sees the same run and writes nothing twice
    assert other.poll(json.loads(json.dumps(handle)), T0 + 500) == Status("exited", 0, "exit code 0")
    lines = log_text(ex, handle).splitlines()
    assert lines[0] == header and len(lines) == 12
    assert lines[10] == "[+100.0s] step 10/10, 100% done" and lines[11] == "[+100.0s] finished: exit code 0"
    assert ex.log_path(handle, 1) is None


def test_virtual_run_until_stopped(tmp_path: Path) -> None:
    ex = VirtualExecutor()
    handle = ex.launch(virtual_launch(tmp_path, None), T0)
    assert ex.poll(handle, T0 + 130) == Status("running")
    ex.stop(handle, T0 + 150)
    ex.stop(handle, T0 + 400)  # the first request counts
    assert ex.poll(handle, T0 + 500) == Status("exited", -15, "stopped")
    assert log_text(ex, handle).splitlines()[1:] == [
        "[+60s] step 1, running until stopped",
        "[+120s] step 2, running until stopped",
        "[+150.0s] stopped by request after 2 step(s)",
    ]


def test_virtual_stop_after_the_end_changes_nothing(tmp_path: Path) -> None:
    ex = VirtualExecutor()
    handle = ex.launch(virtual_launch(tmp_path, 10.0), T0)
    ex.stop(handle, T0 + 20)
    assert ex.poll(handle, T0 + 30) == Status("exited", 0, "exit code 0")
    assert log_text(ex, handle).splitlines()[-1] == "[+10.0s] finished: exit code 0"


def test_a_family_is_listed_parents_first(tmp_path: Path) -> None:
    """The supervisor passes a stop on in this order: a shell gets its SIGTERM before its children, or a child that
    dies first ends the shell's `wait` (status 0) and the shell exits before its trap could run (seen once in a
    full run under load: exit code 0 where the job's trap exits 5)."""
    from suanli.executors.proctree import family, family_top_down

    script = "sh -c 'sleep 60 & sleep 60 & wait' & sh -c 'sh -c \"sleep 60\" & wait' & wait"
    root = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while sum(_comm(p) == "sleep" for p in family(root.pid)) < 3:  # three sleeps under two or three shells
            assert time.monotonic() < deadline
            time.sleep(0.02)
        order = family_top_down(root.pid)
        assert set(order) == family(root.pid) and len(order) == len(set(order))
        seen = {root.pid}
        for pid in order:
            st = proc_stat(pid)
            assert st is not None and st[1] in seen, (pid, st, order)  # its parent came before it
            seen.add(pid)
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
