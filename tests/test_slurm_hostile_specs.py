"""Tenant-controlled values (command, env keys and values) on the Slurm path reach the job verbatim, inside the
sandbox, and never the sbatch script, its argv or the batch shell (from a hostile review of the engines)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from suanli.executors.base import SandboxRequest
from suanli.executors.slurm_executor import SlurmExecutor
from tests.slurm_cluster import SlurmCluster
from tests.slurm_cluster import slurm_session as slurm_session
from tests.test_slurm_executor import UID, logs, make_launch, rank, wait_done

pytestmark = pytest.mark.slurm


def test_hostile_env_and_command_stay_inside_the_sandbox(slurm_session: SlurmCluster, tmp_path: Path) -> None:
    mark = tmp_path / "pwned"
    evil = [
        f"'; touch {mark}; '",
        f"$(touch {mark})",
        f"`touch {mark}`",
        f"x\ntouch {mark}\n#SBATCH --uid=0",
        f'"; touch {mark}; "',
        "\\",
        "\r\n--wrap=id",
    ]
    env = {f"V{i}": v for i, v in enumerate(evil)}
    command = "#SBATCH --nodelist=node1\n" + "".join(
        f'printf "%s\\0" "$V{i}" >> /workspace/out\n' for i in range(len(evil))
    )
    ex = SlurmExecutor(str(slurm_session.conf))
    launch = make_launch(tmp_path, command, (rank("node2", 0),), env=env, sandbox=SandboxRequest(uid=UID, gid=UID))
    handle = ex.launch(launch, time.time())
    st = wait_done(ex, handle, timeout=60)
    assert st.state == "exited" and st.exit_code == 0, logs(handle)
    assert not mark.exists()
    got = (launch.workdir / "out").read_bytes().split(b"\0")[:-1]
    assert [g.decode() for g in got] == evil
    script = (launch.log_dir / "slurm-batch.sh").read_text()
    assert all(v not in script for v in evil)


def _alive_with(marker: str) -> list[int]:
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_double_forked_setsid_daemon_dies_with_the_stop(slurm_session: SlurmCluster, tmp_path: Path) -> None:
    import uuid

    marker = f"zzreview{uuid.uuid4().hex[:8]}"
    command = (
        f"(trap '' TERM HUP INT; setsid sh -c 'trap \"\" TERM HUP INT; exec -a {marker} sleep 600' &) ; "
        f"nohup setsid sh -c 'exec -a {marker} sleep 600' >/dev/null 2>&1 & echo ready; sleep 600"
    )
    ex = SlurmExecutor(str(slurm_session.conf))
    launch = make_launch(tmp_path, command, (rank("node3", 0),), sandbox=SandboxRequest(uid=UID, gid=UID))
    handle = ex.launch(launch, time.time())
    deadline = time.monotonic() + 30
    while not _alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive_with(marker), logs(handle)
    ex.stop(handle, time.time())
    st = wait_done(ex, handle, timeout=40)
    assert st.state == "exited", st
    time.sleep(1)
    assert _alive_with(marker) == [], f"still alive after the attempt ended ({st}): the tenant computes unbilled"
