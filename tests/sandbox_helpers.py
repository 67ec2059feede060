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
