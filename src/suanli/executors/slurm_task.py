"""The task `srun` starts on each node of a suanli Slurm job: it runs that node's rank supervisor and relays stops.

    python -P -m suanli.executors.slurm_task PLAN_FILE

PLAN_FILE (JSON, written by `SlurmExecutor.launch` into the attempt's log_dir on the shared filesystem) maps each
Slurm NodeName to its node-rank's `rankrun` argv, cwd, log file and rc file. This task picks its entry by
SLURMD_NODENAME and starts exactly that argv (so supervision and the sandbox are the local executor's), in its own
process group, with stdout and stderr appended to the rank's log and stdin from /dev/null.

Why a relay and not `exec`: Slurm signals a step by signalling every process of it (proctrack/cgroup and linuxproc
alike), which would hit bwrap's own processes and the job at once and skip the grace period. So a suanli stop never
goes through Slurm's signals: the batch script writes a line to srun's stdin (`srun --input=all` gives it to every
task), and this task passes one SIGTERM to its supervisor only, which does SIGTERM → grace → SIGKILL as everywhere.
The stop file is watched as well, for a stop that comes before srun has a stdin to write to. Signals Slurm sends
(scancel by an admin, a time limit) reach the supervisor directly; this task ignores them and waits for it, so the
supervisor can write its exit code.

When the supervisor dies without writing its exit code, the task writes it for a stop that came before the
supervisor's signal handlers were up (as the local executor does), and else the rank's lost file (SIGKILLed, OOM),
so the executor can tell a vanished rank from a running one. Only the standard library is imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time

STOP_WATCH_S = 1.0  # how often the stop file is looked at (stdin is the prompt channel)


def _say(msg: str) -> None:
    sys.stderr.write(f"[suanli slurm_task {os.environ.get('SLURMD_NODENAME', '?')}] {msg}\n")
    sys.stderr.flush()


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def run(plan: dict, node: str) -> int:
    entry = plan["ranks"].get(node)
    if entry is None:
        _say(f"no node-rank for Slurm node {node!r} in this plan (nodes: {', '.join(plan['ranks'])})")
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # Slurm's signals are the supervisor's to act on
    slurm_gpus = os.environ.get("SLURM_STEP_GPUS") or os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    _write(entry["slurm_file"], json.dumps({
        "node": node, "job_id": os.environ.get("SLURM_JOB_ID"), "slurm_gpus": slurm_gpus,
        "suanli_gpus": entry["gpus"], "started_at": time.time(),
    }))  # fmt: skip
    with open(entry["log_file"], "ab") as out:
        proc = subprocess.Popen(entry["argv"], cwd=entry["cwd"], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, close_fds=True)  # fmt: skip
    stdin = sys.stdin.fileno()
    open_stdin = True
    stopped = False
    next_look = 0.0
    while proc.poll() is None:
        stop_now = False
        if open_stdin:
            ready, _, _ = select.select([stdin], [], [], 0.25)
            if ready:
                data = os.read(stdin, 4096)
                open_stdin = bool(data)
                stop_now = b"stop" in data
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.25)
        if time.monotonic() >= next_look:
            next_look = time.monotonic() + STOP_WATCH_S
            stop_now = stop_now or os.path.exists(plan["stop_file"])
        if stop_now and not stopped:
            stopped = True
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGTERM)
    if os.path.exists(entry["rc_file"]):
        return 0
    if stopped:  # our SIGTERM came before its handlers were up: it ended on the stop, as the local executor says
        _write(entry["rc_file"], f"{proc.returncode if proc.returncode < 0 else -signal.SIGTERM}\n")
        return 0
    why = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
    _write(entry["lost_file"], f"the supervisor of rank {entry['node_rank']} on {node} ended without an exit code "
           f"({why})\n")  # fmt: skip
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        _say("usage: python -m suanli.executors.slurm_task PLAN_FILE")
        return 2
    with open(argv[0], encoding="utf-8") as f:
        plan = json.load(f)
    return run(plan, os.environ.get("SLURMD_NODENAME", ""))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
