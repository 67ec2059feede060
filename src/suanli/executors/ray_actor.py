"""What a node-rank's Ray actor does on its node: the same launcher as everywhere (`prepare_rank` + `rankrun`),
watched by `LocalExecutor`, with the workdir and logs on the node's own disk.

`RankRunner` is a plain class; `ray_executor` makes it a detached actor (`ray.remote(RankRunner)`), so this module
imports Ray only to ask which node it is on. The workdir always travels as bytes from the driver and is unpacked
here, even when the server's path would be visible (one host): the multi-host path is the one that runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from suanli.executors.base import Launch
from suanli.executors.local import LocalExecutor, prepare_rank, spawn
from suanli.executors.proctree import proc_stat
from suanli.storage.archive import Limits

# A job inherits its supervisor's environment when unsandboxed, and a Ray worker's is the node's (the raylet's) plus
# what Ray adds for a worker: OMP_NUM_THREADS=<the actor's CPUs> (1 would throttle the job), PYTHONBREAKPOINT, its
# CUDA_VISIBLE_DEVICES (rank_env sets suanli's). Those go back to the node's values, and Ray's own variables (the
# cluster's auth token among them) go altogether.
RAY_ENV_PREFIXES = ("RAY_", "RAYLET_")


def _parent_environ() -> dict[str, str] | None:
    """The environment of this worker's parent, the raylet: the node's own. None when it cannot be read."""
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return None
    pairs = (item.decode(errors="replace").partition("=") for item in items if b"=" in item)
    return {k: v for k, _, v in pairs}


def env_fixes(environ: dict[str, str], node: dict[str, str] | None, keep: set[str]) -> dict[str, str | None]:
    """What to lay over this worker's environment for a job: Ray's variables removed (None), Ray's worker additions
    back to the node's value (or removed); keys in `keep` (the spec's) untouched."""
    fixes: dict[str, str | None] = {}
    for key, value in environ.items():
        if key in keep:
            continue
        if key.startswith(RAY_ENV_PREFIXES):
            fixes[key] = None
        elif node is not None and node.get(key) != value:
            fixes[key] = node.get(key)
        elif node is None and key == "PYTHONBREAKPOINT" and value.startswith("ray."):
            fixes[key] = None
    return fixes


def node_id() -> str:
    """The Ray node id this process runs on ("" outside Ray)."""
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:
        return ""


def default_sigchld() -> None:
    """Ray's workers ignore SIGCHLD (the kernel reaps their children), and an ignored signal stays ignored across
    exec: the rank's supervisor would never see its job's exit code and wait forever. Back to the default, for this
    worker and what it starts (this actor reaps its one child itself)."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    except ValueError:  # not the main thread: Python refuses, libc does not
        import ctypes

        ctypes.CDLL(None).signal(int(signal.SIGCHLD), 0)  # 0 is SIG_DFL


class RankRunner:
    """One node-rank on this node: started once by `start`, then `status`, `stop` and `cleanup` from any driver."""

    def __init__(self) -> None:
        self._local = LocalExecutor()
        self._handle: dict[str, Any] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._root: Path | None = None
        self._log: Path | None = None

    def start(self, launch: Launch, index: int, root: str, workdir_tar: bytes, limits: Limits) -> dict[str, Any]:
        """Unpack the workdir under `root` (within the server's `limits`, which it was accepted under), start rank
        `launch.ranks[index]` through rankrun; where it runs."""
        from suanli.storage.workdirs import unpack

        if self._handle is not None:
            raise RuntimeError("this rank was started already")
        rank = launch.ranks[index]
        base = Path(root) / launch.workload_id / f"a{launch.attempt}" / f"r{rank.node_rank}"
        shutil.rmtree(base, ignore_errors=True)  # a leftover of a run with the same names: never a live one
        (base / "logs").mkdir(parents=True)
        unpack(workdir_tar, base / "workdir", limits)
        keep = set(launch.env) | set(launch.extra_env)
        fixes: dict[str, Any] = env_fixes(dict(os.environ), _parent_environ(), keep)
        here = replace(launch, workdir=base / "workdir", log_dir=base / "logs", env={**fixes, **launch.env})
        prepared = prepare_rank(here, rank)
        log_file = Path(prepared.record["log_file"])
        default_sigchld()
        # Ray blocks SIGINT in its workers; a blocked signal stays blocked in children: unblock it for this fork.
        blocked = signal.pthread_sigmask(signal.SIG_SETMASK, set())
        try:
            self._proc = spawn(prepared)  # as on the local executor: a stop signals the job, not this actor
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        st = proc_stat(self._proc.pid)
        self._handle = {
            "executor": "local",
            "version": 1,
            "log_dir": str(here.log_dir),
            "grace_s": here.grace_s,
            "launched_at": time.time(),
            "ranks": [
                {
                    "node_rank": rank.node_rank,
                    "node": rank.node,
                    "pid": self._proc.pid,
                    "start_ticks": st[3] if st else None,
                    **prepared.record,
                }
            ],
        }
        self._root, self._log = base, log_file
        return {"node_id": node_id(), "pid": self._proc.pid, "root": str(base)}

    def status(self, offset: int, max_bytes: int) -> dict[str, Any]:
        """The rank's Status (as the local executor sees it) and up to `max_bytes` of its log from `offset`.

        The log is read after the status, so a final status comes with the whole log (`size` says how long)."""
        if self._handle is None or self._log is None:
            return {
                "state": "lost",
                "exit_code": None,
                "reason": "the rank was never started",
                "ended_at": None,
                "data": b"",
                "size": 0,
            }
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None  # reaped: no zombie for the local executor to wonder about
        st = self._local.poll(self._handle, time.time())
        data, size = b"", 0
        with contextlib.suppress(OSError), open(self._log, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, offset))
            data = f.read(max(0, min(max_bytes, size - offset)))
        return {
            "state": st.state,
            "exit_code": st.exit_code,
            "reason": st.reason,
            "ended_at": st.ended_at,
            "data": data,
            "size": size,
        }

    def stop(self) -> None:
        """SIGTERM now, SIGKILL after the grace period (rankrun's); idempotent."""
        if self._handle is not None:
            self._local.stop(self._handle, time.time(), by="gang")

    def cleanup(self) -> None:
        """Remove the rank's files on this node (its logs went to the server already)."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)

    def where(self) -> dict[str, Any]:
        return {"node_id": node_id(), "pid": os.getpid(), "root": str(self._root or "")}
