"""The sandbox on the local executor with real bubblewrap: GPU device nodes, memory and CPU limits (cgroup, and the
rlimit fallback; the cgroup itself in test_sandbox_cgroups.py), an OOM kill in words, signals through bwrap, entering
a live sandbox, and who runs unsandboxed."""

from __future__ import annotations

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
from suanli.executors.base import NotRunning, Status
from suanli.executors.local import LocalExecutor
from suanli.sandbox import bwrap as bwrap_mod
from suanli.sandbox import limits
from suanli.sandbox.bwrap import SandboxError, SandboxSpec, bwrap_args
from suanli.workloads.spec import parse_spec
from tests.sandbox_helpers import UID, launch, run

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
    reason="bubblewrap is not installed (apt install bubblewrap); CI installs and requires it",
)


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


def test_the_rlimit_fallback_bounds_allocations_not_address_space(tmp_path: Path) -> None:
    # Seen on a cgroup2 GPU host: a CPU-only job's default 2 GiB as RLIMIT_AS stopped `import torch` (a CUDA build maps
    # gigabytes of libraries and reserves address space it never touches). RLIMIT_DATA bounds what a process
    # allocates (heap, private writable maps), so a reservation (PROT_NONE, as CUDA makes) of 8x the limit is fine,
    # while allocating past the limit still fails.
    reserve = "import mmap; m = mmap.mmap(-1, 1 << 30, prot=0); print('reserved', len(m))"
    st, log = run(tmp_path, f'python3 -c "{reserve}"', memory_mib=128, cgroup_parent=str(tmp_path))
    assert "limits by rlimit" in log
    assert st.exit_code == 0 and f"reserved {1 << 30}" in log, log
    st, log = run(tmp_path, "python3 -c 'x = bytearray(400 << 20)'", memory_mib=128, cgroup_parent=str(tmp_path))
    assert st.exit_code == 1 and "MemoryError" in log


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
        # An entered session (SSH, JupyterLab) is in the sandbox's cgroup namespace too: it sees its cgroup as "/",
        # not the host's path to it (the server's unit, `suanli/<rank>`).
        seen = subprocess.run(ex.enter_argv(handle, 0, ["cat", "/proc/self/cgroup"]), capture_output=True, text=True,
                              timeout=30, env={"TERM": "dumb"})  # fmt: skip
        assert seen.returncode == 0 and "suanli" not in seen.stdout, seen.stdout + seen.stderr
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
        SandboxPolicy().request(spec, 1 << 28, is_admin=False)
    with pytest.raises(SandboxError):  # the operator's own too, unless they opted out
        SandboxPolicy().request(spec, 1 << 28, is_admin=True)
    assert SandboxPolicy(mode="off").request(spec, 1 << 28, is_admin=True) is None
    with pytest.raises(SandboxError):  # sandbox: off never covers tenants
        SandboxPolicy(mode="off").request(spec, (1 << 28) + 1, is_admin=False)
    with pytest.raises(SandboxError):
        bwrap_args(SandboxSpec(workdir="/tmp"))


def test_image_binds_a_published_environment(tmp_path: Path) -> None:
    env = tmp_path / "envs" / "tools"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "hello-tool").write_text("#!/bin/sh\necho from the environment\n")
    (env / "bin" / "hello-tool").chmod(0o755)
    policy = SandboxPolicy(environments={"tools": str(env)})
    spec = parse_spec({"name": "t", "command": "hello-tool", "image": "tools", "resources": {"gpus": 0}})
    req = policy.request(spec, 1 << 28, is_admin=False)
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
        req = policy.request(spec, 1 << 28, is_admin=False)
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
