"""The sandbox on the local executor with real bubblewrap: GPU device nodes, memory and CPU limits (cgroup, and the
rlimit fallback), an OOM kill in words, signals through bwrap, entering a live sandbox, and who runs unsandboxed."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from suanli.control.errors import Invalid
from suanli.control.workloads.sandboxes import SandboxPolicy
from suanli.executors.base import Launch, NodeRank, NotRunning, SandboxRequest, Status
from suanli.executors.local import LocalExecutor
from suanli.sandbox import bwrap as bwrap_mod
from suanli.sandbox import limits
from suanli.sandbox.bwrap import SandboxError, SandboxSpec, bwrap_args
from suanli.workloads.spec import parse_spec

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
    reason="bubblewrap is not installed (apt install bubblewrap); CI installs and requires it",
)
UID = 0x10000123 if os.geteuid() == 0 else None  # a root server runs sandboxes as a uid of their own


def launch(tmp_path: Path, command: str, gpus: tuple[int, ...] = (), **sandbox: Any) -> Launch:
    workdir, log_dir = tmp_path / "work", tmp_path / "logs"
    workdir.mkdir(exist_ok=True)
    log_dir.mkdir(exist_ok=True)
    sandbox.setdefault("uid", UID)
    sandbox.setdefault("gid", UID)
    return Launch(workload_id="wl-sbx", attempt=1, command=command, workdir=workdir, env={"GREETING": "hi there"},
                  ranks=(NodeRank("myhost", 0, gpus),), log_dir=log_dir, grace_s=2,
                  sandbox=SandboxRequest(**sandbox))  # fmt: skip


def run(tmp_path: Path, command: str, timeout: float = 30, **kw: Any) -> tuple[Status, str]:
    ex = LocalExecutor()
    handle = ex.launch(launch(tmp_path, command, **kw), time.time())
    deadline = time.monotonic() + timeout
    while (st := ex.poll(handle, time.time())).state == "running":
        assert time.monotonic() < deadline, "still running"
        time.sleep(0.05)
    return st, (tmp_path / "logs" / "rank-0.log").read_text()


@pytest.fixture
def dev() -> Any:
    """Fake device nodes where the sandbox's uid can reach them, as it reaches /dev."""
    path = Path(tempfile.mkdtemp(prefix="suanli-dev-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_only_the_given_gpus_device_nodes_exist_inside(tmp_path: Path, dev: Path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text(name)
    st, log = run(tmp_path, "for d in /dev/nvidia*; do echo $d $(cat $d); done", gpus=(1, 3), dev_root=str(dev))
    assert st == Status("exited", 0, "exit code 0", st.ended_at)
    seen = sorted(line.split()[0] for line in log.splitlines())
    assert seen == ["/dev/nvidia-uvm", "/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl"]
    assert "/dev/nvidia1 nvidia1" in log  # bound, not made up


def test_no_gpu_means_no_gpu_device_at_all(tmp_path: Path, dev: Path) -> None:
    (dev / "nvidia0").write_text("x")
    (dev / "nvidiactl").write_text("x")
    st, log = run(tmp_path, "ls /dev", dev_root=str(dev))
    assert st.exit_code == 0 and "nvidia" not in log


def test_the_spec_env_reaches_the_job_and_the_servers_does_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPERATOR_SECRET", "do-not-leak")
    st, log = run(tmp_path, 'echo "[$GREETING] [$OPERATOR_SECRET] [$HOME] [$(pwd)]"')
    assert st.exit_code == 0
    assert log.strip() == "[hi there] [] [/workspace] [/workspace]"


def test_memory_limit_ends_in_an_oom_kill_said_in_words(tmp_path: Path) -> None:
    cg = limits.plan("probe")
    if cg["mode"] == "rlimit":
        pytest.skip(f"no cgroup for the server here ({cg.get('why')}); the rlimit test covers this host")
    st, _ = run(tmp_path, "python3 -c 'x = bytearray(400 << 20); print(len(x))'", memory_mib=128)
    assert st.state == "exited" and st.exit_code == -9
    assert st.reason.startswith("out of memory: killed at its memory limit of 128 MiB"), st.reason


def test_without_a_cgroup_memory_is_bounded_by_rlimit(tmp_path: Path) -> None:
    # A cgroup_parent that is no cgroup makes the supervisor fall back to rlimits.
    st, log = run(tmp_path, "python3 -c 'x = bytearray(400 << 20)'", memory_mib=128, cgroup_parent=str(tmp_path))
    assert st.exit_code == 1 and "MemoryError" in log
    assert "limits by rlimit" in log
    st, log = run(tmp_path, "python3 -c 'x = bytearray(16 << 20); print(len(x))'", memory_mib=128,
                  cgroup_parent=str(tmp_path))  # fmt: skip
    assert st.exit_code == 0 and str(16 << 20) in log


def test_cpu_limit_is_a_cfs_quota_on_the_ranks_own_cgroup(tmp_path: Path) -> None:
    cg = limits.plan("probe")
    if cg["mode"] == "rlimit":
        pytest.skip(f"no cgroup for the server here ({cg.get('why')})")
    ex = LocalExecutor()
    handle = ex.launch(launch(tmp_path, "cat /proc/self/cgroup; exec sleep 30", cpu_milli=500), time.time())
    box = tmp_path / "logs" / "rank-0.sandbox.json"
    deadline = time.monotonic() + 20
    while not box.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    paths = json.loads(box.read_text())["cgroup"]["paths"]
    try:
        if cg["mode"] == "v2":
            assert Path(paths[0], "cpu.max").read_text().split() == ["50000", "100000"]
        else:
            cpu = next(p for p in paths if "/cpu/" in p)
            assert Path(cpu, "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert Path(paths[0], "cgroup.procs").read_text().split()  # the job's processes are in it
    finally:
        ex.stop(handle, time.time())
        while ex.poll(handle, time.time()).state == "running":
            time.sleep(0.05)
    assert "0::/\n" in (tmp_path / "logs" / "rank-0.log").read_text()  # its own cgroup namespace: it sees "/"
    assert not any(Path(p).exists() for p in paths)  # removed with the rank


def test_a_stop_reaches_the_job_through_bwrap_and_its_exit_code_counts(tmp_path: Path) -> None:
    ex = LocalExecutor()
    handle = ex.launch(
        launch(tmp_path, 'trap "echo got TERM; exit 5" TERM; echo trapped; sleep 60 & wait'), time.time()
    )
    log, deadline = tmp_path / "logs" / "rank-0.log", time.monotonic() + 20
    while not (log.exists() and "trapped" in log.read_text()):  # the trap is set (a fixed sleep raced a busy host)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ex.stop(handle, time.time())
    deadline = time.monotonic() + 20
    while (st := ex.poll(handle, time.time())).state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert st.exit_code == 5 and "stop requested" in st.reason
    assert "got TERM" in (tmp_path / "logs" / "rank-0.log").read_text()


def test_a_command_can_be_run_inside_a_live_sandbox(tmp_path: Path) -> None:
    ex = LocalExecutor()
    handle = ex.launch(launch(tmp_path, "echo ready > ready; exec sleep 60"), time.time())
    deadline = time.monotonic() + 20
    while not (tmp_path / "work" / "ready").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        argv = ex.enter_argv(
            handle, 0, ["/bin/sh", "-c", 'echo "$GREETING"; pwd; cat ready; ps -e -o comm=; touch made']
        )
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"TERM": "dumb"})
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[:3] == ["hi there", "/workspace", "ready"]
        assert "sleep" in lines[3:] and "python3" not in lines  # the sandbox's processes, not the host's
        assert (tmp_path / "work" / "made").exists()
        code = subprocess.run(ex.enter_argv(handle, 0, ["/bin/sh", "-c", "exit 3"]), timeout=30).returncode
        assert code == 3
    finally:
        ex.stop(handle, time.time())
        while ex.poll(handle, time.time()).state == "running":
            time.sleep(0.05)
    with pytest.raises(NotRunning):
        ex.enter_argv(handle, 0, ["true"])


def test_a_missing_bwrap_refuses_tenant_work_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bwrap_mod.shutil, "which", lambda _name: None)
    spec = parse_spec({"name": "t", "command": "true", "resources": {"gpus": 0}})
    with pytest.raises(SandboxError, match="apt install bubblewrap"):
        SandboxPolicy().request(spec, "org-1", is_admin=False)
    with pytest.raises(SandboxError):  # the operator's own too, unless they opted out
        SandboxPolicy().request(spec, "org-1", is_admin=True)
    assert SandboxPolicy(mode="off").request(spec, "org-1", is_admin=True) is None
    with pytest.raises(SandboxError):  # sandbox: off never covers tenants
        SandboxPolicy(mode="off").request(spec, "org-2", is_admin=False)
    with pytest.raises(SandboxError):
        bwrap_args(SandboxSpec(workdir="/tmp"))


def test_image_binds_a_published_environment(tmp_path: Path) -> None:
    env = tmp_path / "envs" / "tools"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "hello-tool").write_text("#!/bin/sh\necho from the environment\n")
    (env / "bin" / "hello-tool").chmod(0o755)
    policy = SandboxPolicy(environments={"tools": str(env)})
    spec = parse_spec({"name": "t", "command": "hello-tool", "image": "tools", "resources": {"gpus": 0}})
    req = policy.request(spec, "org-1", is_admin=False)
    assert req is not None and req.environment == str(env)
    with pytest.raises(Invalid, match="image"):
        policy.check_image(parse_spec({"name": "t", "command": "x", "image": "other"}))
    st, log = run(tmp_path, "hello-tool; touch $VIRTUAL_ENV/x 2>&1 || echo read-only", environment=str(env))
    assert st.exit_code == 0, log
    assert log.splitlines()[0] == "from the environment" and "read-only" in log


def test_the_supervisor_takes_a_ranks_share_of_the_workloads_cores_and_memory(tmp_path: Path) -> None:
    from suanli.executors.sandboxing import rank_config

    lau = launch(tmp_path, "true", gpus=(0, 1), cpu_milli=16000, memory_mib=64 * 1024, gpus_asked=8)
    cfg = rank_config(lau, lau.ranks[0], {"A": "1"})
    assert cfg["sandbox"]["cpu_milli"] == 4000 and cfg["sandbox"]["memory_mib"] == 16 * 1024
    assert "SUANLI_LOG_DIR" not in cfg["env"] and cfg["env"]["HOME"] == "/workspace"


def make_rootfs(root: Path) -> Path:
    """A minimal root filesystem: the host's dash and the libraries it loads, and a marker in /etc."""
    for rel in ("usr/bin", "etc", "lib/x86_64-linux-gnu", "lib64"):
        (root / rel).mkdir(parents=True, exist_ok=True)
    shutil.copy2("/bin/dash", root / "usr/bin/sh")
    out = subprocess.run(["ldd", "/bin/dash"], capture_output=True, text=True, check=True).stdout
    for lib in (part for line in out.splitlines() for part in line.split() if part.startswith("/")):
        dest = root / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), dest)
    (root / "bin").symlink_to("usr/bin")
    (root / "etc" / "os-release").write_text("ID=suanli-test-rootfs\n")
    return root


def test_an_environment_that_is_a_root_filesystem_becomes_the_sandboxs_root(tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    st, log = run(tmp_path, "read line < /etc/os-release; echo $line; echo $PATH; test -e /usr/bin/python3 || "
                  "echo no-host-usr; echo x > /workspace/w && echo wrote; echo y 2>/dev/null > /etc/z || echo ro",
                  environment=str(rootfs))  # fmt: skip
    assert st.exit_code == 0, log
    assert log.splitlines() == ["ID=suanli-test-rootfs", "/usr/local/bin:/usr/bin:/bin", "no-host-usr", "wrote", "ro"]


@pytest.mark.skipif(
    shutil.which("podman") is None or os.geteuid() != 0,
    reason="needs Debian's podman, as root (an image already loaded on the node); CI installs it",
)
def test_an_oci_image_loaded_in_podman_is_an_environment(tmp_path: Path) -> None:
    rootfs = make_rootfs(tmp_path / "rootfs")
    (rootfs / "etc" / "os-release").write_text("ID=from-oci\n")
    tar = tmp_path / "image.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
    image = f"localhost/suanli-test-{os.getpid()}"
    subprocess.run(["podman", "import", str(tar), image], check=True, capture_output=True, timeout=120)
    try:
        policy = SandboxPolicy(environments={"tiny": f"oci:{image}"})
        spec = parse_spec({"name": "t", "command": "x", "image": "tiny", "resources": {"gpus": 0}})
        req = policy.request(spec, "org-1", is_admin=False)
        assert req is not None and req.environment == f"oci:{image}"
        st, log = run(tmp_path, "read line < /etc/os-release; echo $line; echo x > /workspace/w && echo wrote",
                      environment=req.environment)  # fmt: skip
        assert st.exit_code == 0, log
        assert log.splitlines() == ["ID=from-oci", "wrote"]
        with pytest.raises(SandboxError, match="image not known"):  # the supervisor fails the attempt with it
            run(tmp_path, "true", environment="oci:localhost/no-such-image")
    finally:
        subprocess.run(["podman", "image", "unmount", image], capture_output=True, timeout=60)
        subprocess.run(["podman", "rmi", "-f", image], capture_output=True, timeout=60)


def test_the_sandboxs_user_has_a_name(tmp_path: Path) -> None:
    st, log = run(tmp_path, "whoami; getent passwd $(id -u) | cut -d: -f6; id -gn")
    assert st.exit_code == 0, log
    name = "tenant" if UID is not None else subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert log.splitlines()[0] == name
    if UID is not None:
        assert log.splitlines()[1:] == ["/workspace", "tenant"]


def test_every_tmpfs_is_sized_and_the_root_is_read_only() -> None:
    argv = bwrap_args(SandboxSpec(workdir="/tmp", tmp_bytes=1 << 30))
    tmpfs = [i for i, a in enumerate(argv) if a == "--tmpfs"]
    # /sys/fs/cgroup, /dev/shm, /tmp, /run, /var/tmp
    assert len(tmpfs) == 5 and all(argv[i - 2] == "--size" for i in tmpfs)
    remounted = [argv[i + 1] for i, a in enumerate(argv) if a == "--remount-ro"]
    assert remounted == ["/sys/fs/cgroup", "/"]
    assert "--disable-userns" in argv and "--unshare-pid" in argv and "--unshare-net" not in argv
    assert "--unshare-net" in bwrap_args(SandboxSpec(workdir="/tmp", network="none"))


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
    cg = limits.plan("probe")
    if cg["mode"] == "rlimit":
        pytest.skip(f"no cgroup for the server here ({cg.get('why')})")
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
        ex.stop(handle, time.time())
        while ex.poll(handle, time.time()).state == "running":
            time.sleep(0.05)
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
        ex.stop(victim, time.time())
        while ex.poll(victim, time.time()).state == "running":
            time.sleep(0.05)
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
