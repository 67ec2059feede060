"""Pretends to run workloads: no processes, a plausible log, and an end decided by the clock.

Virtual clusters use it to exercise scheduling, billing and the workload API without GPUs. Everything is a
function of (start, duration, stop time, now), so any server process polling a handle sees the same run;
`poll` appends the log lines that have come due since the last poll (nothing runs in between).
"""

from __future__ import annotations

import fcntl
import json
import math
from pathlib import Path
from typing import Any

from suanli.executors.base import Launch, Status
from suanli.executors.local import STOP_FILE, create_exclusive, read_json

STEPS = 10  # progress lines of a run with a duration
OPEN_ENDED_STEP_S = 60.0  # one progress line a minute for a run that lasts until stopped
LOG = "rank-0.log"
LINES = "rank-0.lines"  # how many lines of the log are written: appends stay idempotent across pollers


def _gpus(gpus: list[int]) -> str:
    return "GPUs " + ",".join(str(g) for g in gpus) if gpus else "no GPUs"


class VirtualExecutor:
    """A deterministic stand-in for the local executor; only node-rank 0 has a log."""

    name = "virtual"

    def launch(self, launch: Launch, now: float) -> dict[str, Any]:
        """Touches no file: the log is written by the polls (and reads) that come due, so launching thousands of
        virtual runs at once costs no disk work. A reused log directory is cleared first."""
        if launch.log_dir.exists():
            (launch.log_dir / STOP_FILE).unlink(missing_ok=True)
            (launch.log_dir / LINES).unlink(missing_ok=True)
        handle: dict[str, Any] = {
            "executor": self.name,
            "version": 1,
            "workload_id": launch.workload_id,
            "attempt": launch.attempt,
            "start": now,
            "duration_s": launch.duration_s,
            "log_dir": str(launch.log_dir),
            "ranks": [{"node": r.node, "node_rank": r.node_rank, "gpus": list(r.gpus)} for r in launch.ranks],
        }
        restart = launch.extra_env.get("SUANLI_RESTART_REASON")
        if restart:  # a restart (a resize's: the rest of the run, on its new GPUs) says so in its log
            handle["restart"] = restart
        return handle

    def _stop_at(self, handle: dict[str, Any]) -> float | None:
        """When a stop took effect; None if never, or only after the run had already ended."""
        stop = read_json(Path(handle["log_dir"]) / STOP_FILE)
        if stop is None:
            return None
        at = float(stop["at"])
        d = handle["duration_s"]
        return at if d is None or at < handle["start"] + d else None

    def poll(self, handle: dict[str, Any], now: float) -> Status:
        stop_at = self._stop_at(handle)
        self._append_log(handle, now, stop_at)
        if stop_at is not None:
            return Status("exited", -15, "stopped", max(stop_at, handle["start"]))
        d = handle["duration_s"]
        if d is not None and now >= handle["start"] + d:
            return Status("exited", 0, "exit code 0", handle["start"] + d)
        return Status("running")

    def stop(self, handle: dict[str, Any], now: float) -> None:
        Path(handle["log_dir"]).mkdir(parents=True, exist_ok=True)
        create_exclusive(Path(handle["log_dir"]) / STOP_FILE, json.dumps({"at": now, "by": "user"}))

    def log_path(self, handle: dict[str, Any], node_rank: int = 0) -> Path | None:
        return Path(handle["log_dir"]) / LOG if node_rank == 0 else None

    # -- the log ------------------------------------------------------------------------------------------

    def _steps(self, handle: dict[str, Any], horizon: float) -> int:
        """Progress lines due by `horizon`."""
        elapsed = horizon - handle["start"]
        if elapsed < 0:
            return 0
        d = handle["duration_s"]
        if d is None:
            return math.floor(elapsed / OPEN_ENDED_STEP_S)
        return STEPS if d <= 0 else min(STEPS, math.floor(elapsed * STEPS / d))

    def lines(self, handle: dict[str, Any], now: float, stop_at: float | None) -> tuple[int, int]:
        """(lines due, progress steps among them); a finished or stopped run adds a closing line."""
        d = handle["duration_s"]
        if stop_at is not None:
            steps = self._steps(handle, stop_at)
            return steps + 2, steps
        if d is not None and now >= handle["start"] + d:
            return STEPS + 2, STEPS
        steps = self._steps(handle, now)
        return steps + 1, steps

    def line(self, handle: dict[str, Any], i: int, steps: int, stop_at: float | None) -> str:
        """Line `i` (0: the header) of a log whose run shows `steps` progress lines."""
        d = handle["duration_s"]
        if i == 0:
            nodes = ", ".join(f"{r['node']} ({_gpus(r['gpus'])})" for r in handle["ranks"])
            length = "until stopped" if d is None else f"for {d:g}s"
            restart = f", restarted after {handle['restart']}" if handle.get("restart") else ""
            return (
                f"[suanli] virtual run of {handle['workload_id']} (attempt {handle['attempt']}{restart}) {length} "
                f"on {len(handle['ranks'])} node(s): {nodes}"
            )
        if i <= steps:
            if d is None:
                return f"[+{i * OPEN_ENDED_STEP_S:.0f}s] step {i}, running until stopped"
            return f"[+{d * i / STEPS:.1f}s] step {i}/{STEPS}, {100 * i // STEPS}% done"
        if stop_at is not None:
            return f"[+{stop_at - handle['start']:.1f}s] stopped by request after {steps} step(s)"
        return f"[+{d:.1f}s] finished: exit code 0"

    def _append_log(self, handle: dict[str, Any], now: float, stop_at: float | None) -> None:
        log_dir = Path(handle["log_dir"])
        due, steps = self.lines(handle, now, stop_at)
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / LINES, "a+") as counter:
            fcntl.flock(counter, fcntl.LOCK_EX)  # several server processes may poll the same run
            counter.seek(0)
            text = counter.read().strip()
            done = int(text) if text.isdigit() else 0
            if due <= done:
                return
            with open(log_dir / LOG, "a") as log:
                log.writelines(self.line(handle, i, steps, stop_at) + "\n" for i in range(done, due))
            counter.truncate(0)
            counter.write(str(due))
