"""Helpers of the sandbox tests: one rank of workload `wl-sbx` on the local executor, sandboxed."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from suanli.executors.base import Launch, NodeRank, SandboxRequest, Status
from suanli.executors.local import LocalExecutor

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


def cgroup_plan_or_skip() -> dict[str, Any]:
    """Where a rank's cgroup would go here; the test is skipped where the server gets none (rlimits)."""
    import pytest

    from suanli.sandbox import limits

    cg = limits.plan("probe")
    if cg["mode"] == "rlimit":
        pytest.skip(f"no cgroup for the server here ({cg.get('why')})")
    return cg


def sandbox_record(tmp_path: Path, timeout: float = 20) -> dict[str, Any]:
    """The running rank's sandbox record (its cgroup, its pids), once its supervisor has written it."""
    import json

    box = tmp_path / "logs" / "rank-0.sandbox.json"
    deadline = time.monotonic() + timeout
    while not box.exists():
        assert time.monotonic() < deadline, "the sandbox did not start"
        time.sleep(0.05)
    return dict(json.loads(box.read_text()))


def stop(ex: LocalExecutor, handle: dict[str, Any]) -> None:
    """Stop a launched rank and wait until it has ended."""
    ex.stop(handle, time.time())
    while ex.poll(handle, time.time()).state == "running":
        time.sleep(0.05)
