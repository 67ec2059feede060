"""Runs every node-rank of a workload as processes on this host, each under a `rankrun` supervisor.

All state lives in files under the attempt's log_dir (exit codes, the stop request, the gang's first
failure) and in the handle (pids with their start times), so any server process, including one started
after a crash, can poll or stop what another launched.

A gang fails together: when one rank exits non-zero or vanishes, the others are stopped. The attempt
stays "running" until no rank has a live process (its GPUs are busy until then); the status then names the
first failure, not the SIGTERMs that followed it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suanli.executors import sandboxing
from suanli.executors.base import Launch, NodeRank, NotRunning, Status, rank_env
from suanli.executors.proctree import family, proc_stat, session_members, write_atomic
from suanli.sandbox import limits

STOP_FILE = "stop-requested"
FAILURE_FILE = "gang-failure"
KILL_AFTER_GRACE_S = 5.0  # a supervisor still alive this long after its grace period is SIGKILLed with its job


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def create_exclusive(path: Path, text: str) -> bool:
    """Write `path` only if it does not exist yet (first writer wins, atomically); whether we wrote it."""
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    tmp.write_text(text)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_rc(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _last_exit(handle: dict[str, Any]) -> float | None:
    """When the last rank's supervisor recorded its exit code: the end of the attempt."""
    try:
        return max(os.stat(r["rc_file"]).st_mtime for r in handle["ranks"])
    except (OSError, ValueError):
        return None


def describe_exit(code: int) -> str:
    """'exit code 3' or 'killed by SIGTERM'."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


@dataclass(frozen=True)
class PreparedRank:
    """How to start one node-rank's supervisor: its argv and cwd, and the file paths its record keeps."""

    argv: list[str]
    cwd: Path
    record: dict[str, str]


def prepare_rank(launch: Launch, rank: NodeRank) -> PreparedRank:
    """Write one rank's launch file (mode 0600: it holds the env) and say how to start its `rankrun` supervisor.

    The one launcher: the local executor runs the argv as a process of its own, Slurm's `srun` and Ray's node-rank
    actors run the same argv on their nodes, so supervision and the sandbox are the same on every executor."""
    log_file = launch.log_dir / f"rank-{rank.node_rank}.log"
    rc_file = launch.log_dir / f"rank-{rank.node_rank}.rc"
    # rank_env always sets CUDA_VISIBLE_DEVICES, so the server's own never reaches the job.
    env: dict[str, str | None] = {**launch.env, **launch.extra_env, **rank_env(launch, rank)}
    config: dict[str, Any] = {
        "rc_file": str(rc_file),
        "stop_file": str(launch.log_dir / STOP_FILE),
        "grace_s": float(launch.grace_s),
        "command": launch.command,
        "env": env,
        "sandbox": None,
    }
    cwd = launch.workdir
    if launch.sandbox is not None:
        config.update(sandboxing.rank_config(launch, rank, env))
        cwd = launch.log_dir  # the supervisor's; the job's is /workspace inside the sandbox
    launch_file = launch.log_dir / f".rank-{rank.node_rank}.launch.json"
    launch_file.unlink(missing_ok=True)
    fd = os.open(launch_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(config, f)
    argv = [
        sys.executable,
        "-P",  # the workdir is the cwd: its json.py must not shadow the supervisor's imports
        "-m",
        "suanli.executors.rankrun",
        str(launch_file),
    ]
    record = {"rc_file": str(rc_file), "log_file": str(log_file)}
    if launch.sandbox is not None:
        record["sandbox_file"] = config["sandbox_file"]
        record["reason_file"] = config["reason_file"]
        record["cgroup"] = config["sandbox"]["cgroup"]["paths"]  # what to reap if its supervisor is SIGKILLed
    return PreparedRank(argv, cwd, record)


def spawn(prepared: PreparedRank) -> subprocess.Popen[bytes]:
    """Start a prepared rank's supervisor in a session of its own (it outlives its starter), its output appended to
    the rank's log."""
    with open(prepared.record["log_file"], "ab") as out:
        return subprocess.Popen(prepared.argv, cwd=prepared.cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, close_fds=True, start_new_session=True)  # fmt: skip


def record_first_failure(
    log_dir: Path, failed: list[tuple[float, int, dict[str, Any]]], now: float
) -> dict[str, Any] | None:
    """The gang's first failure (earliest, then the lowest rank) among `failed` (when, node-rank, record), written
    once for every server that polls this attempt: the first writer's stays."""
    if not failed:
        return None
    _, n, record = min(failed, key=lambda f: (f[0], f[1]))
    path = log_dir / FAILURE_FILE
    create_exclusive(path, json.dumps({**record, "node_rank": n, "at": now}))
    return read_json(path) or record


class LocalExecutor:
    """Processes on this host. `state_dir` is accepted and unused: all state lives in log_dir and the handle."""

    name = "local"

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = state_dir
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # -- launch -------------------------------------------------------------------------------------------

    def launch(self, launch: Launch, now: float) -> dict[str, Any]:
        log_dir = launch.log_dir
        # A reused log_dir must not hand a new attempt the exit codes or stop request of the previous one.
        for stale in [STOP_FILE, FAILURE_FILE, *(f"rank-{r.node_rank}.rc" for r in launch.ranks)]:
            (log_dir / stale).unlink(missing_ok=True)
        ranks: list[dict[str, Any]] = []
        handle: dict[str, Any] = {
            "executor": self.name,
            "version": 1,
            "log_dir": str(log_dir),
            "grace_s": launch.grace_s,
            "boot_id": _boot_id(),
            "launched_at": now,
            "ranks": ranks,
        }
        try:
            for rank in launch.ranks:
                ranks.append(self._start_rank(launch, rank))
        except BaseException:
            self.stop(handle, now)
            raise
        return handle

    def _start_rank(self, launch: Launch, rank: NodeRank) -> dict[str, Any]:
        prepared = prepare_rank(launch, rank)
        proc = spawn(prepared)
        self._children[proc.pid] = proc
        st = proc_stat(proc.pid)
        return {"node_rank": rank.node_rank, "node": rank.node, "pid": proc.pid,
                "start_ticks": st[3] if st else None, **prepared.record}  # fmt: skip

    def enter_argv(self, handle: dict[str, Any], node_rank: int, argv: list[str]) -> list[str]:
        """The argv that runs `argv` inside the live sandbox of one node-rank (its namespaces, cgroup, uid; cwd
        /workspace). Raises NotRunning when that rank has no live sandbox."""
        rank = next((r for r in handle.get("ranks", []) if int(r["node_rank"]) == node_rank), None)
        if rank is None or not self._alive(handle, rank):
            raise NotRunning(f"node-rank {node_rank} is not running")
        if "sandbox_file" not in rank:
            raise NotRunning(f"node-rank {node_rank} runs unsandboxed; there is no sandbox to enter")
        return sandboxing.enter_argv(Path(rank["sandbox_file"]), argv)

    # -- watching -----------------------------------------------------------------------------------------

    def _reap(self, pid: int) -> None:
        """Collect our own exited supervisors so they don't linger as zombies."""
        proc = self._children.get(pid)
        if proc is not None:
            if proc.poll() is not None:
                del self._children[pid]
            return
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)  # not our child after a server restart: init reaps it

    def _alive(self, handle: dict[str, Any], rank: dict[str, Any]) -> bool:
        """Whether this rank's supervisor still runs: same pid, same start time, same boot, not a zombie."""
        if handle.get("boot_id") and handle["boot_id"] != _boot_id():
            return False
        pid = int(rank["pid"])
        self._reap(pid)
        st = proc_stat(pid)
        if st is None:
            if Path("/proc/self/stat").exists():
                return False
            try:  # no /proc (not Linux): all we can ask is whether the pid exists
                os.kill(pid, 0)
                return True
            except OSError:
                return False
        if st[0] in ("Z", "X"):
            return False
        return rank.get("start_ticks") is None or st[3] == rank["start_ticks"]

    def poll(self, handle: dict[str, Any], now: float) -> Status:
        log_dir = Path(handle["log_dir"])
        stop = read_json(log_dir / STOP_FILE)
        alive: dict[int, bool] = {}
        codes: dict[int, int | None] = {}
        for rank in handle["ranks"]:
            n = int(rank["node_rank"])
            # Liveness before the exit code: a supervisor writes its rc file before it exits.
            alive[n] = self._alive(handle, rank)
            codes[n] = _read_rc(Path(rank["rc_file"]))
            if alive[n] or codes[n] is not None:
                continue
            self._kill_orphans(rank)
            if stop is not None:
                # Stopped before its signal handlers were up, or SIGKILLed below: it ended on our request.
                code = -signal.SIGKILL if stop.get("killed") else -signal.SIGTERM
                create_exclusive(Path(rank["rc_file"]), f"{code}\n")
                codes[n] = _read_rc(Path(rank["rc_file"]))
        failure = read_json(log_dir / FAILURE_FILE) or self._first_failure(handle, alive, codes, now)
        if any(alive.values()):
            if failure is not None or stop is not None:
                self.stop(handle, now, by="user" if failure is None else "gang")
                self._kill_stragglers(handle, now)
            return Status("running", reason="stopping" if failure is not None or stop is not None else "")
        note = " (stop requested)" if stop is not None and stop.get("by") == "user" else ""
        ended = _last_exit(handle)
        if failure is None:
            return Status("exited", 0, "exit code 0" + note, ended)
        if failure["state"] == "lost":
            return Status("lost", None, failure["reason"])
        return Status("exited", int(failure["exit_code"]), failure["reason"] + note, ended)

    def _first_failure(
        self, handle: dict[str, Any], alive: dict[int, bool], codes: dict[int, int | None], now: float
    ) -> dict[str, Any] | None:
        """Record the gang's first failure (earliest exit code file, then the lowest rank); None if none yet."""
        failed: list[tuple[float, int, dict[str, Any]]] = []
        world = len(handle["ranks"])
        for rank in handle["ranks"]:
            n = int(rank["node_rank"])
            code = codes[n]
            if code is not None and code != 0:
                try:
                    at = os.stat(rank["rc_file"]).st_mtime
                except OSError:
                    at = now
                where = f" (rank {n})" if world > 1 else ""
                why = describe_exit(code)
                with contextlib.suppress(OSError, KeyError):
                    why = f"{Path(rank['reason_file']).read_text().strip()} ({why})"
                failed.append((at, n, {"state": "exited", "exit_code": code, "reason": why + where}))
            elif code is None and not alive[n]:
                reason = (
                    f"process {rank['pid']} of rank {n} on {rank['node']} vanished without an exit code"
                    " (its supervisor was killed, or the host rebooted)"
                )
                failed.append((now, n, {"state": "lost", "exit_code": None, "reason": reason}))
        return record_first_failure(Path(handle["log_dir"]), failed, now)

    # -- stopping -----------------------------------------------------------------------------------------

    def stop(self, handle: dict[str, Any], now: float, by: str = "user") -> None:
        """SIGTERM every live supervisor; each passes it to its job and SIGKILLs it after grace_s.

        Idempotent: the first request's time counts, and a supervisor acts on the first SIGTERM only.
        """
        create_exclusive(Path(handle["log_dir"]) / STOP_FILE, json.dumps({"at": now, "by": by}))
        for rank in handle["ranks"]:
            if self._alive(handle, rank):
                with contextlib.suppress(OSError):
                    os.kill(int(rank["pid"]), signal.SIGTERM)

    def _kill_stragglers(self, handle: dict[str, Any], now: float) -> None:
        """A supervisor that outlived its grace period by KILL_AFTER_GRACE_S goes, with its whole family."""
        path = Path(handle["log_dir"]) / STOP_FILE
        stop = read_json(path)
        if stop is None or now < float(stop["at"]) + float(handle.get("grace_s", 10.0)) + KILL_AFTER_GRACE_S:
            return
        if not stop.get("killed"):
            write_atomic(str(path), json.dumps({**stop, "killed": now}))
        for rank in handle["ranks"]:
            if self._alive(handle, rank):
                for pid in family(int(rank["pid"])):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.kill(int(rank["pid"]), signal.SIGKILL)
                create_exclusive(Path(rank["rc_file"]), f"{-signal.SIGKILL}\n")

    def _kill_orphans(self, rank: dict[str, Any]) -> None:
        """SIGKILL what a vanished supervisor left in its session and its sandbox's cgroup, and remove the cgroup:
        nobody would report, stop or clean up after it any more."""
        pid = int(rank["pid"])
        st = proc_stat(pid)
        same = st is not None and st[3] == rank.get("start_ticks") and st[0] not in ("Z", "X")
        if rank.get("cgroup") and not same:  # the sandbox is a session of its own; its cgroup holds all of it
            limits.reap(list(rank["cgroup"]))  # (never while its very supervisor still runs: a misread boot id)
        if st is not None and not (st[0] in ("Z", "X") and st[3] == rank.get("start_ticks")):
            return  # the pid is in use by someone else's process: its session is not ours
        for member in session_members(pid):
            with contextlib.suppress(OSError):
                os.kill(member, signal.SIGKILL)

    # -- logs ---------------------------------------------------------------------------------------------

    def log_path(self, handle: dict[str, Any], node_rank: int = 0) -> Path | None:
        for rank in handle["ranks"]:
            if int(rank["node_rank"]) == node_rank:
                return Path(rank["log_file"])
        return None
