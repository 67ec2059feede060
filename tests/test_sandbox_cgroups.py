"""A sandboxed rank's cgroup with real bubblewrap: its CPU quota, a cgroup of its own (never shared, removed when it
ends, even after its supervisor was SIGKILLed), and the view of /sys/fs/cgroup it gets (its own cgroup only)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from suanli.executors.local import LocalExecutor
from suanli.sandbox import limits
from suanli.sandbox.bwrap import SandboxSpec, bwrap_args
from tests.sandbox_helpers import cgroup_plan_or_skip, launch, run, sandbox_record, stop

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
    reason="bubblewrap is not installed (apt install bubblewrap); CI installs and requires it",
)


def test_cpu_limit_is_a_cfs_quota_on_the_ranks_own_cgroup(tmp_path: Path) -> None:
    cg = cgroup_plan_or_skip()
    ex = LocalExecutor()
    handle = ex.launch(launch(tmp_path, "cat /proc/self/cgroup; exec sleep 30", cpu_milli=500), time.time())
    paths = sandbox_record(tmp_path)["cgroup"]["paths"]
    try:
        if cg["mode"] == "v2":
            assert Path(paths[0], "cpu.max").read_text().split() == ["50000", "100000"]
        else:
            cpu = next(p for p in paths if "/cpu/" in p)
            assert Path(cpu, "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert Path(paths[0], "cgroup.procs").read_text().split()  # the job's processes are in it
    finally:
        stop(ex, handle)
    assert "0::/\n" in (tmp_path / "logs" / "rank-0.log").read_text()  # its own cgroup namespace: it sees "/"
    assert not any(Path(p).exists() for p in paths)  # removed with the rank


def _fake_cgroup2(root: Path, monkeypatch: pytest.MonkeyPatch, own: str) -> None:
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    monkeypatch.setattr(limits, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(limits.os, "geteuid", lambda: 0)
    real_open = open

    def proc_self_cgroup(path: str, *a: object, **kw: object) -> object:  # the server's own group
        if path == "/proc/self/cgroup":
            import io

            return io.StringIO(f"0::{own}\n")
        return real_open(path, *a, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", proc_self_cgroup)


def test_a_root_server_in_a_non_root_cgroup2_group_puts_ranks_beside_it_not_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cgroup v2 lets a group hand cpu/memory to its children only while it holds no process of its own, and the
    # server's group holds the server (seen on a cgroup2 GPU host: every rank fell back to rlimits). So the ranks go
    # under one `suanli` group at the hierarchy's root (as Docker's cgroupfs driver does), which holds no process.
    _fake_cgroup2(tmp_path / "cg", monkeypatch, "/system.slice/suanli.service")
    assert limits.plan("wl-a1-r0-0123abcd") == {
        "mode": "v2",
        "paths": [str(tmp_path / "cg" / "suanli" / "wl-a1-r0-0123abcd")],
    }


def test_a_cgroup2_parent_that_cannot_hand_out_the_controllers_falls_back_to_rlimits_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_cgroup2(tmp_path / "cg", monkeypatch, "/")
    parent = tmp_path / "cg" / "suanli"
    parent.mkdir()
    (parent / "cgroup.subtree_control").write_text("pids\n")
    real_write = limits._write

    def write(path: str, text: str) -> None:  # the kernel refuses: the group holds processes (EBUSY)
        if path.endswith("cgroup.subtree_control"):
            raise OSError(errno.EBUSY, "Device or resource busy")
        real_write(path, text)

    monkeypatch.setattr(limits, "_write", write)
    cg = limits.create({"mode": "v2", "paths": [str(parent / "wl-a1-r0-0123abcd")]}, cpu_milli=500, memory_mib=256)
    assert cg["mode"] == "rlimit"
    assert "cpu, memory not enabled" in str(cg["why"]) and str(parent) in str(cg["why"]), cg
    assert not (parent / "wl-a1-r0-0123abcd").exists()  # nothing left half made


def test_a_cgroup_still_busy_with_its_dying_processes_is_removed_once_they_are_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A SIGKILLed process leaves its cgroup a moment after it stops showing in /proc: rmdir says EBUSY until then.
    group = tmp_path / "rank"
    group.mkdir()
    busy = [2]
    real_rmdir = os.rmdir

    def rmdir(path: str) -> None:
        if busy[0]:
            busy[0] -= 1
            raise OSError(errno.EBUSY, "Device or resource busy", path)
        real_rmdir(path)

    monkeypatch.setattr(limits.os, "rmdir", rmdir)
    limits.remove({"mode": "v2", "paths": [str(group)]})
    assert not group.exists() and busy == [0]
    # What never empties is left (bounded wait), and no error escapes the supervisor.
    stuck = tmp_path / "stuck"
    stuck.mkdir()
    busy[0] = 10**9
    limits.remove({"mode": "v2", "paths": [str(stuck)]}, wait_s=0.05)
    assert stuck.exists()


def test_two_ranks_with_the_same_workload_attempt_and_rank_never_share_a_cgroup(tmp_path: Path) -> None:
    # Two servers on one host (or a server's database restored) can both run a `wl-sbx` attempt 1 rank 0: each
    # must get a cgroup of its own, or one job's processes count against, and are killed by, the other's limits.
    from suanli.executors.sandboxing import rank_config

    lau = launch(tmp_path, "true", cpu_milli=500)
    first, second = (rank_config(lau, lau.ranks[0], {})["sandbox"]["cgroup"] for _ in range(2))
    if first["mode"] != "rlimit":
        assert set(first["paths"]).isdisjoint(second["paths"])
    # A leaf that is already there (someone else's) is not joined: the rank falls back to rlimits and says why.
    parent = tmp_path / "delegated"
    (parent / "taken").mkdir(parents=True)
    made = limits.create({"mode": "v2", "paths": [str(parent / "taken")]}, cpu_milli=500, memory_mib=0)
    assert made["mode"] == "rlimit" and "taken" in str(made["why"])


def test_a_job_cannot_lift_its_own_cpu_limit(tmp_path: Path) -> None:
    # The tenant's attack on its own cgroup: write a bigger quota into every cpu.max / cfs_quota_us it can see
    # (/sys is read-only in the sandbox, and its /sys/fs/cgroup holds only the job's own cgroup).
    cg = cgroup_plan_or_skip()
    attack = (
        "for f in $(find /sys/fs/cgroup -name cpu.max -o -name cpu.cfs_quota_us 2>/dev/null); do "
        "(echo max > $f || echo -1 > $f) 2>/dev/null && echo LIFTED $f; done; echo TRIED; exec sleep 30"
    )
    ex = LocalExecutor()
    handle = ex.launch(launch(tmp_path, attack, cpu_milli=500), time.time())
    box, log_file = tmp_path / "logs" / "rank-0.sandbox.json", tmp_path / "logs" / "rank-0.log"
    deadline = time.monotonic() + 20
    while not box.exists() or not log_file.exists() or "TRIED" not in log_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    paths = json.loads(box.read_text())["cgroup"]["paths"]
    try:
        if cg["mode"] == "v2":
            assert Path(paths[0], "cpu.max").read_text().split() == ["50000", "100000"]
        else:
            cpu = next(p for p in paths if "/cpu/" in p)
            assert Path(cpu, "cpu.cfs_quota_us").read_text().strip() == "50000"
    finally:
        stop(ex, handle)
    log = log_file.read_text()
    assert "LIFTED" not in log


def test_a_job_sees_its_own_cgroup_and_no_other_ranks(tmp_path: Path) -> None:
    # The tenant's probe: the host's cgroup tree names every rank on the host (`<workload>-a<attempt>-r<rank>-…`) and
    # shows its usage counters. A job sees only its own cgroup, where container-aware code looks for its limits
    # (cgroup v2 /sys/fs/cgroup/cpu.max, v1 /sys/fs/cgroup/cpu/cpu.cfs_quota_us), and nothing where it has none.
    from dataclasses import replace

    ex = LocalExecutor()
    (tmp_path / "victim").mkdir()
    victim = ex.launch(replace(launch(tmp_path / "victim", "exec sleep 30", cpu_milli=500), workload_id="wl-victim"),
                       time.time())  # fmt: skip
    probe = (
        "find /sys/fs/cgroup -name 'wl-victim*' 2>/dev/null; echo ENTRIES $(ls -A /sys/fs/cgroup | wc -l); "
        "echo QUOTA $(cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null)"
    )
    try:
        victim_box = tmp_path / "victim" / "logs" / "rank-0.sandbox.json"
        deadline = time.monotonic() + 20
        while not victim_box.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        victim_cg = json.loads(victim_box.read_text())["cgroup"]
        assert all(Path(p).is_dir() for p in victim_cg["paths"])  # the victim's cgroup is there to be found
        st, log = run(tmp_path, probe, cpu_milli=500)
    finally:
        stop(ex, victim)
    assert st.exit_code == 0, log
    assert "wl-victim" not in log
    mode = limits.plan("probe")["mode"]
    if mode == "v2":
        assert "QUOTA 50000 100000" in log
    elif mode == "v1":
        assert "QUOTA 50000" in log and "ENTRIES 3" in log  # memory, cpu, pids: the job's own
    else:
        assert "ENTRIES 0" in log, log  # no cgroup of its own: an empty directory, not the host's tree
    # A rank whose limits are rlimits (here: a cgroup_parent that is no cgroup) sees an empty directory, on any host.
    (tmp_path / "rl").mkdir()
    st, log = run(tmp_path / "rl", probe, cpu_milli=500, cgroup_parent=str(tmp_path))
    assert st.exit_code == 0 and "limits by rlimit" in log and "ENTRIES 0\nQUOTA\n" in log, log


def test_the_cgroup_directory_is_emptied_before_the_ranks_own_cgroup_is_bound_in() -> None:
    leaf = "/sys/fs/cgroup/suanli/wl-a1-r0-00000000"
    argv = bwrap_args(SandboxSpec(workdir="/tmp", cgroup_view=((leaf, "/sys/fs/cgroup"),)))
    at = {tuple(argv[i : i + 3]): i for i in range(len(argv) - 2)}
    host_sys, empty, own = (at[("--ro-bind-try", "/sys", "/sys")], at[("--tmpfs", "/sys/fs/cgroup", "--ro-bind-try")],
                            at[("--ro-bind-try", leaf, "/sys/fs/cgroup")])  # fmt: skip
    assert host_sys < empty < own  # mounted later is what the sandbox sees
    assert limits.view({"mode": "v2", "paths": [leaf]}) == ((leaf, "/sys/fs/cgroup"),)
    v1 = limits.view({"mode": "v1", "paths": ["/m/x", "/c/x", "/p/x"]})
    assert v1 == (("/m/x", "/sys/fs/cgroup/memory"), ("/c/x", "/sys/fs/cgroup/cpu"), ("/p/x", "/sys/fs/cgroup/pids"))
    assert limits.view({"mode": "rlimit", "paths": [], "why": "none"}) == ()


def test_a_rank_whose_supervisor_was_killed_leaves_no_process_and_no_cgroup(tmp_path: Path) -> None:
    # The supervisor removes its rank's cgroup when the rank ends; SIGKILLed (the OOM killer, an operator), it cannot.
    # The executor that finds it gone kills what is left in the cgroup and removes it, or they pile up on the host.
    cgroup_plan_or_skip()
    ex = LocalExecutor()
    handle = ex.launch(launch(tmp_path, "sleep 300 & exec sleep 300", cpu_milli=500), time.time())
    paths = sandbox_record(tmp_path)["cgroup"]["paths"]
    deadline = time.monotonic() + 20
    procs = Path(paths[0], "cgroup.procs")
    while len(procs.read_text().split()) < 3:  # bwrap and the two sleeps
        assert time.monotonic() < deadline
        time.sleep(0.05)
    jobs = [int(p) for p in procs.read_text().split()]
    os.kill(int(handle["ranks"][0]["pid"]), signal.SIGKILL)
    while (st := ex.poll(handle, time.time())).state == "running":
        assert time.monotonic() < deadline + 10
        time.sleep(0.05)
    assert st.state == "lost", st
    assert not any(Path(p).exists() for p in paths)
    while any(_running(pid) for pid in jobs):  # killed: gone once their new parent reaps them
        assert time.monotonic() < deadline + 20, [pid for pid in jobs if _running(pid)]
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def test_a_starting_rank_removes_leftover_rank_cgroups_beside_its_own_and_nothing_else(tmp_path: Path) -> None:
    # A rank's supervisor killed with its node (Ray, Slurm) leaves its cgroup on that node, where no executor polls.
    # The next rank to start there removes such leftovers: empty, rank-named, and made long before; not a fresh one
    # (a rank between its mkdir and its join) and not a directory of the operator's.
    cg = cgroup_plan_or_skip()
    (tmp_path / "first").mkdir()
    st, log = run(tmp_path / "first", "true", cpu_milli=500)  # a rank first: it makes the parents, as on a clean host
    assert st.exit_code == 0 and "limits by rlimit" not in log, log
    parents = {os.path.dirname(str(p)) for p in cg["paths"]}
    token = os.urandom(4).hex()
    left, fresh, other = f"wl-gone{token}-a1-r0-{token}", f"wl-new{token}-a1-r0-{token}", f"operator-{token}"
    made = []
    for parent in parents:
        for name in (left, fresh, other):
            os.mkdir(os.path.join(parent, name))
            made.append(os.path.join(parent, name))
        day_ago = time.time() - 86_400
        for name in (left, other):
            os.utime(os.path.join(parent, name), (day_ago, day_ago))
    try:
        st, log = run(tmp_path, "true", cpu_milli=500)
        assert st.exit_code == 0 and "limits by rlimit" not in log, log
        assert not any(os.path.exists(os.path.join(p, left)) for p in parents)
        assert all(os.path.isdir(os.path.join(p, fresh)) and os.path.isdir(os.path.join(p, other)) for p in parents)
    finally:
        for path in made:
            if os.path.isdir(path):
                os.rmdir(path)


def test_reap_touches_only_rank_cgroups_under_the_root_and_never_kills_pid_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cgroup v2 lists a member outside the reader's pid namespace as 0, and kill(0) is the caller's own process group:
    # the server. A handle's path outside the cgroup root, or not named as a rank's, is never touched.
    root, outside = tmp_path / "root", tmp_path / "outside"
    leaf, other, foreign = (root / "suanli" / "wl_ab-a1-r0-0123abcd", root / "suanli" / "operator-group",
                            outside / "wl_ab-a1-r0-0123abcd")  # fmt: skip
    for d in (leaf, other, foreign):
        d.mkdir(parents=True)
        (d / "cgroup.procs").write_text(f"0\n{os.getpid()}\n")
    killed: list[int] = []
    monkeypatch.setattr(limits, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(limits.os, "kill", lambda pid, sig: killed.append(pid))
    limits.reap([str(leaf), str(other), str(foreign)])
    assert killed == [os.getpid()]  # the leaf's one real member; not 0, nothing of the other two
    assert not (leaf / "cgroup.kill").exists()  # not created where the kernel has none


def test_a_rank_whose_supervisor_still_runs_is_never_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    # The executor can misjudge a live supervisor as gone (a boot id it failed to read): its cgroup stays untouched.
    from suanli.executors.proctree import proc_stat

    reaped: list[list[str]] = []
    monkeypatch.setattr(limits, "reap", lambda paths: reaped.append(paths))
    me = proc_stat(os.getpid())
    assert me is not None
    rank = {"pid": os.getpid(), "start_ticks": me[3], "cgroup": ["/sys/fs/cgroup/x/wl_a-a1-r0-0123abcd"]}
    LocalExecutor()._kill_orphans(rank)
    assert reaped == []
    LocalExecutor()._kill_orphans({**rank, "start_ticks": me[3] + 1})  # the pid is somebody else's now: reaped
    assert reaped == [rank["cgroup"]]


def test_a_rank_that_could_not_have_its_own_cgroup_sees_none_not_the_one_in_the_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sandbox's binds are planned with the cgroup's name; if a cgroup of that name is already there (someone
    # else's), the rank falls back to rlimits, and must not see that cgroup either.
    from suanli.executors import sandboxing

    cg = limits.plan("wl-sbx-a1-r0-deadbeef")
    if cg["mode"] == "rlimit":
        pytest.skip(f"no cgroup for the server here ({cg.get('why')})")
    (tmp_path / "first").mkdir()
    run(tmp_path / "first", "true", cpu_milli=500)  # the parents exist, as on a host that ran ranks before
    monkeypatch.setattr(sandboxing.secrets, "token_hex", lambda n: "deadbeef")
    for p in cg["paths"]:
        os.mkdir(str(p))
    try:
        st, log = run(tmp_path, "echo ENTRIES $(ls -A /sys/fs/cgroup | wc -l)", cpu_milli=500)
    finally:
        for p in cg["paths"]:
            os.rmdir(str(p))
    assert st.exit_code == 0 and "limits by rlimit" in log and "ENTRIES 0" in log, log
