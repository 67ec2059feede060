"""The launcher's sandbox half: what a node-rank's supervisor needs to start its job inside bubblewrap.

Every executor that starts ranks through `rankrun` calls `rank_config` for the sandbox part of the launch file,
so isolation is written once (`suanli.sandbox`), and `enter_argv` to run a command inside a live sandbox (SSH,
JupyterLab).
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Any

from suanli.executors.base import Launch, NodeRank
from suanli.sandbox import limits
from suanli.sandbox.bwrap import Mount, SandboxSpec, bwrap_args, is_rootfs, oci_rootfs, sandbox_env
from suanli.sched.state import host_share

OCI_PREFIX = "oci:"  # an environment published as `oci:IMAGE`: an image loaded into the node's podman
TMP_DEFAULT_BYTES = 4 << 30  # the private /tmp and /dev/shm when no memory limit bounds them


def _own(path: Path, uid: int, gid: int) -> None:
    """Hand a workdir to the sandbox's uid (a root server runs tenants as their own uid): once, when it isn't."""
    try:
        st = path.stat()
    except OSError:
        return
    if st.st_uid == uid and st.st_gid == gid:
        return
    # By descriptor, never through a path a running sandbox could swap for a link meanwhile (its old uid's, say).
    for _, dirs, files, dfd in os.fwalk(path, follow_symlinks=False):
        for name in (*dirs, *files):
            os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
    os.lchown(path, uid, gid)


def rank_config(launch: Launch, rank: NodeRank, env: dict[str, str | None]) -> dict[str, Any]:
    """The sandbox entries of one rank's launch file (and the env as the sandbox sees it)."""
    req = launch.sandbox
    assert req is not None
    cpu, mem = req.cpu_milli or req.share_cpu_milli, req.memory_mib or req.share_memory_mib
    if req.gpus_asked:
        cpu = host_share(cpu, len(rank.gpus), req.gpus_asked)
        mem = host_share(mem, len(rank.gpus), req.gpus_asked)
    rootfs = None
    if req.environment and req.environment.startswith(OCI_PREFIX):
        rootfs = oci_rootfs(req.environment[len(OCI_PREFIX) :])
    elif req.environment and is_rootfs(req.environment):
        rootfs = req.environment
    # Unique on this host even across servers (the cgroup sits under the server's own group, or the one delegated).
    name = f"{launch.workload_id}-a{launch.attempt}-r{rank.node_rank}-{secrets.token_hex(4)}"
    cgroup = limits.plan(name, req.cgroup_parent)
    spec = SandboxSpec(
        workdir=str(launch.workdir),
        hostname=f"{launch.workload_id}-{rank.node_rank}",
        gpus=rank.gpus,
        dev_root=req.dev_root,
        network=req.network,
        environment=None if rootfs else req.environment,
        rootfs=rootfs,
        mounts=tuple(Mount(s, d, w) for s, d, w in req.mounts),
        tmp_bytes=(mem << 20) if mem else TMP_DEFAULT_BYTES,
        cgroup_view=limits.view(cgroup),
    )
    argv = bwrap_args(spec)
    if req.uid is not None and os.geteuid() == 0:
        _own(launch.workdir, req.uid, req.gid if req.gid is not None else req.uid)
        for m in spec.mounts:  # a writable mount (a volume) is the tenant's to write, like the workdir
            if m.writable:
                _own(Path(m.source), req.uid, req.gid if req.gid is not None else req.uid)
    plain = {k: v for k, v in env.items() if v is not None}
    return {
        "env": sandbox_env(plain, spec),
        "sandbox": {
            "bwrap": argv,
            "cgroup": cgroup,
            "cpu_milli": cpu,
            "memory_mib": mem,
            "network": req.network,
            "etc": os.path.join(rootfs, "etc") if rootfs else "/etc",
            "uid": req.uid if os.geteuid() == 0 else None,
            "gid": (req.gid if req.gid is not None else req.uid) if os.geteuid() == 0 else None,
        },
        "sandbox_file": str(launch.log_dir / f"rank-{rank.node_rank}.sandbox.json"),
        "reason_file": str(launch.log_dir / f"rank-{rank.node_rank}.reason"),
    }


def enter_argv(sandbox_file: Path, argv: list[str]) -> list[str]:
    """Run `argv` inside the sandbox a rank's supervisor recorded in `sandbox_file` (see `suanli.sandbox.join`)."""
    from suanli.executors.base import NotRunning

    if not sandbox_file.exists():
        raise NotRunning("the sandbox is still starting")
    return [sys.executable, "-P", "-m", "suanli.sandbox.join", str(sandbox_file), "--", *argv]
