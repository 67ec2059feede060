"""Runs a workload attempt as one Slurm batch job on the nodes suanli's scheduler chose; Slurm only carries it out.

`launch` writes each node-rank's launch file (`prepare_rank`, as the local executor does), a plan mapping Slurm
NodeName → that rank's `rankrun` argv, and a batch script, then submits ONE `sbatch` pinned to those nodes
(`--nodelist`, one task per node, `--gres=gpu:K`, `--no-requeue`). The script runs one `srun` whose task on each node
(`suanli.executors.slurm_task`) starts that node's rank supervisor, so supervision and the sandbox are identical to
the local executor's, and each rank's output goes to `log_dir/rank-N.log`.

Requirements of the site: log_dir (and the workdir) are on a filesystem every node and the server share (the Slurm
site's shared home or data directory), and the server's Python (with suanli installed) is at the same path on every
node: the launch files, the plan, the exit codes and the stop file all pass through log_dir. The job gets none of
the server's environment but BATCH_ENV (PATH, HOME, locale: sbatch runs in that environment alone, with
`--export=ALL`, so nothing else is stored by slurmctld; unlike `--export=NONE` no login shell is run on the node,
and unlike NIL slurmd spends no extra 0.1-1 s on it), Slurm's own SLURM_* variables, and the launch file's env,
as rankrun builds it.

GPUs: suanli's chosen indices reach the job as CUDA_VISIBLE_DEVICES from the launch file, replacing the one Slurm
sets for its own gres choice. Slurm 22.05 cannot be asked for particular GPU indices, so its choice (recorded per
rank in `rank-N.slurm.json`) may differ from suanli's on a node it shares with other jobs; where Slurm confines
devices (cgroup ConstrainDevices=yes) suanli's indices are then wrong. Give suanli whole nodes, or nodes only
suanli schedules, when that matters. Ranks asking for different GPU counts become a heterogeneous job, one
component per count (Slurm starts those from its backfill scheduler only: up to bf_interval later).

Poll, in order (poll never raises):
1. Slurm lost the job (NODE_FAIL, BOOT_FAIL, PREEMPTED, or reason NodeDown while it completes) → "lost", with the
   dead nodes in words; unless every rank had exited 0, or a rank had failed before (then that failure).
2. Every rank has an exit code → "exited" with rank 0's or the gang's first failure, as the local executor says
   it; `ended_at` is when the last exit code was written. Reported once Slurm has let go of the job (its GPUs are
   Slurm's until then), at most ENDING_S after the last exit code (then the job is cancelled).
3. A rank failed (non-zero exit code, or its supervisor died without one: then "lost") → the others are stopped;
   "running" with reason "stopping" until they end.
4. PENDING → "running", reason "pending in Slurm: <Slurm's reason>", for at most `pending_timeout_s` after launch,
   then cancelled and "lost" (the nodes are held by work suanli does not see); at once for a reason that cannot
   clear by itself (BadConstraints, PartitionConfig, …). RUNNING/COMPLETING/… → "running".
5. The job ended (or Slurm forgot it) with exit codes missing, after `settle_s` (a network filesystem may show an
   exit code late): a stop was requested → -SIGTERM (-SIGKILL after the backstop) for those ranks; cancelled, time
   limit, deadline, OOM in Slurm → "exited" -SIGTERM with that in words; anything else (vanished, FAILED) → "lost".
6. Slurm does not answer → "running" with that reason (or "exited" when every rank has an exit code).

Stop: the stop file, then `scancel --batch --signal=TERM`: only the batch shell hears it and tells every task
through srun's stdin; each passes one SIGTERM to its supervisor (SIGTERM → grace → SIGKILL, see `slurm_task`). A job
still pending is cancelled at once. If anything is still up `grace_s + KILL_AFTER_GRACE_S` after the stop, poll
cancels the job outright (`scancel`: Slurm's SIGTERM, KillWait, SIGKILL).

Slurm is reached through `SlurmAPI` (`slurm_api`): its command-line tools (`slurm_cli`), or slurmrestd where the
operator runs it (`rest=`, see `slurm_rest` for the calls that still use the tools). The rules above are the same
over both.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from suanli.executors import slurm_nodes
from suanli.executors.base import EngineNode, Launch, NodeRank, Status
from suanli.executors.local import (
    FAILURE_FILE,
    KILL_AFTER_GRACE_S,
    STOP_FILE,
    create_exclusive,
    describe_exit,
    prepare_rank,
    read_json,
    record_first_failure,
)
from suanli.executors.proctree import write_atomic
from suanli.executors.slurm_api import JOB_PREFIX, BatchJob, Component, SlurmAPI, SlurmError
from suanli.executors.slurm_cli import SlurmCLI
from suanli.executors.slurm_nodes import ACTIVE, PENDING, JobView, job_view

PLAN_FILE = ".slurm-plan.json"
BATCH_FILE = "slurm-batch.sh"
ENDING_S = 10.0  # how long a job whose ranks all have exit codes may take to leave Slurm before it is cancelled
ENDED_FILE = "slurm-ended"  # when poll first saw the job over: exit codes may take a moment on a network filesystem
BATCH_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ")  # what the job inherits of ours
HOPELESS = ("BadConstraints", "PartitionConfig", "PartitionNodeLimit", "InvalidAccount", "InvalidQOS")
ENDED_WORDS = {"CANCELLED": "cancelled in Slurm", "TIMEOUT": "time limit reached in Slurm",
               "DEADLINE": "deadline reached in Slurm", "OUT_OF_MEMORY": "out of memory in Slurm"}  # fmt: skip


def _read_rc(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


class SlurmExecutor:
    """Workload attempts as Slurm jobs on the nodes suanli chose (see the module's docstring for the rules)."""

    name = "slurm"

    def __init__(
        self,
        slurm_conf: str | None = None,
        partition: str | None = None,
        rest: str | None = None,
        *,
        sbatch_args: tuple[str, ...] = (),
        pending_timeout_s: float = 300.0,
        settle_s: float = 5.0,
        timeout_s: float = 20.0,
    ) -> None:
        """`rest`: slurmrestd's address (`unix:/run/slurmrestd.sock`, `http://host:6820`; see `slurm_rest`), or None
        for the command-line tools alone. `slurm_conf` is SLURM_CONF for the tools and the jobs either way."""
        cli = SlurmCLI(slurm_conf, timeout_s)
        self.api: SlurmAPI = cli
        if rest:
            from suanli.executors.slurm_rest import SlurmREST  # httpx is imported only where slurmrestd is used

            self.api = SlurmREST(rest, cli=cli, timeout_s=timeout_s)
        self.slurm_conf = slurm_conf
        self.partition = partition
        self.sbatch_args = tuple(sbatch_args)  # the site's own: --account, --qos, --time, …
        self.pending_timeout_s = pending_timeout_s
        self.settle_s = settle_s

    def nodes(self) -> list[EngineNode]:
        """The nodes of the cluster (of `partition`, when set) with GPUs, topology labels and others' busy GPUs."""
        return self.api.discover(self.partition)

    # -- launch -------------------------------------------------------------------------------------------

    def launch(self, launch: Launch, now: float) -> dict[str, Any]:
        hosts = [r.host or r.node for r in launch.ranks]
        if not hosts or len(set(hosts)) != len(hosts):
            raise ValueError(f"the Slurm executor runs one node-rank per Slurm node; got nodes {hosts}")
        log_dir = launch.log_dir
        stale = [f"rank-{r.node_rank}.{x}" for r in launch.ranks for x in ("rc", "lost", "slurm.json")]
        for name in (STOP_FILE, FAILURE_FILE, ENDED_FILE, *stale):
            (log_dir / name).unlink(missing_ok=True)
        plan: dict[str, Any] = {"stop_file": str(log_dir / STOP_FILE), "ranks": {}}
        records = []
        for rank, host in zip(launch.ranks, hosts, strict=True):
            prepared = prepare_rank(launch, rank)
            n = rank.node_rank
            record = {"node_rank": n, "node": rank.node, "host": host, **prepared.record,
                      "lost_file": str(log_dir / f"rank-{n}.lost"), "slurm_file": str(log_dir / f"rank-{n}.slurm.json")}  # fmt: skip
            records.append(record)
            plan["ranks"][host] = {**record, "argv": prepared.argv, "cwd": str(prepared.cwd), "gpus": list(rank.gpus)}
        fd = os.open(log_dir / f"{PLAN_FILE}.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(plan, f)
        os.replace(log_dir / f"{PLAN_FILE}.tmp", log_dir / PLAN_FILE)
        components = self._components(launch, hosts)
        script = log_dir / BATCH_FILE
        script.write_text(self._script(launch, len(hosts), len(components)))
        script.chmod(0o700)
        job_id = self.api.submit(BatchJob(
            name=f"{JOB_PREFIX}{launch.workload_id}-a{launch.attempt}", script=script, workdir=log_dir,
            output=f"{log_dir}/slurm-%j.out", error=f"{log_dir}/slurm-%j.err", components=tuple(components),
            partition=self.partition, site_args=self.sbatch_args, environment=self._batch_env(),
        ))  # fmt: skip
        return {
            "executor": self.name, "version": 1, "job_id": job_id, "log_dir": str(log_dir),
            "grace_s": launch.grace_s, "launched_at": now, "nodes": hosts,
            "components": [{"hosts": list(c.hosts), "gpus": c.gpus} for c in components],
            "batch_out": str(log_dir / f"slurm-{job_id}.out"), "batch_err": str(log_dir / f"slurm-{job_id}.err"),
            "ranks": records,
        }  # fmt: skip

    def _components(self, launch: Launch, hosts: list[str]) -> list[Component]:
        """The job's components: one per distinct (GPUs, CPUs, memory) a rank needs, in rank order."""
        groups: dict[tuple[int, int, int], list[str]] = {}
        for rank, host in zip(launch.ranks, hosts, strict=True):
            groups.setdefault(self._needs(launch, rank), []).append(host)
        return [Component(tuple(members), gpus, cpus, mem) for (gpus, cpus, mem), members in groups.items()]

    @staticmethod
    def _needs(launch: Launch, rank: NodeRank) -> tuple[int, int, int]:
        """(GPUs, CPUs, MiB) to ask Slurm for on this rank's node; 0: Slurm's default (no sandbox limits given)."""
        from suanli.sched.state import host_share

        req = launch.sandbox
        cpu, mem = (req.cpu_milli, req.memory_mib) if req is not None else (0, 0)
        if req is not None and req.gpus_asked:
            cpu = host_share(cpu, len(rank.gpus), req.gpus_asked)
            mem = host_share(mem, len(rank.gpus), req.gpus_asked)
        return len(rank.gpus), math.ceil(cpu / 1000) if cpu else 0, int(mem)

    def _batch_env(self) -> dict[str, str]:
        """What the batch shell gets of this process's environment (BATCH_ENV), and SLURM_CONF for its srun."""
        env = {k: os.environ[k] for k in BATCH_ENV if k in os.environ}
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def _script(self, launch: Launch, n: int, components: int) -> str:
        env = self._batch_env()
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        layout = f"--nodes={n} --ntasks={n} --ntasks-per-node=1"
        if components > 1:
            layout = f"--het-group=0-{components - 1}"
        task = shlex.join([sys.executable, "-P", "-m", "suanli.executors.slurm_task", str(launch.log_dir / PLAN_FILE)])
        return f"""#!/bin/bash
# suanli: workload {launch.workload_id}, attempt {launch.attempt} (written by suanli.executors.slurm_executor).
# A stop arrives as SIGTERM to this shell alone (scancel --batch) and goes to every node's task via srun's stdin.
{exports}stop=
trap 'stop=1' TERM INT
fifo=$(mktemp -u "${{TMPDIR:-/tmp}}/suanli-stop.XXXXXXXX") && mkfifo -m 600 "$fifo" && exec 3<>"$fifo" && rm -f "$fifo" || exit 1
srun --export=ALL --input=all --kill-on-bad-exit=0 --mpi=none {layout} {task} <&3 &
srun_pid=$!
trap 'echo stop >&3' TERM INT
[ -n "$stop" ] && echo stop >&3
rc=0
while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid"; rc=$?; done
exit $rc
"""

    # -- watching -----------------------------------------------------------------------------------------

    def poll(self, handle: dict[str, Any], now: float) -> Status:
        try:
            return self._poll(handle, now)
        except SlurmError as e:
            return Status("running", reason=f"Slurm does not answer: {e}")

    def _poll(self, handle: dict[str, Any], now: float) -> Status:
        log_dir = Path(handle["log_dir"])
        stop = read_json(log_dir / STOP_FILE)
        codes = {int(r["node_rank"]): _read_rc(r["rc_file"]) for r in handle["ranks"]}
        done = all(c is not None for c in codes.values())
        try:
            recs = self.api.job_records(str(handle["job_id"]))
        except SlurmError:
            if done:  # the exit codes say all there is to say
                return self._exited(handle, read_json(log_dir / FAILURE_FILE) or self._first_failure(
                    handle, codes, now), stop)  # fmt: skip
            raise
        view = job_view(recs) if recs is not None else None
        if view is not None and view.lost and not (done and not any(codes.values())):
            # Before this poll looks at exit codes: the ranks Slurm killed on the nodes left are not the gang's
            # failure. One recorded earlier (a rank failed before the node did) still wins, in `_lost`.
            return self._lost(handle, f"Slurm job {handle['job_id']}: {view.lost}" + self._dead_nodes(handle), now)
        failure = read_json(log_dir / FAILURE_FILE) or self._first_failure(handle, codes, now)
        if done:
            live = view is not None and (view.state in PENDING or view.state in ACTIVE)
            last = max(_mtime(r["rc_file"], now) for r in handle["ranks"])
            if live and now < last + ENDING_S:
                return Status("running", reason="ending")  # its GPUs are Slurm's until the job has left
            if live:
                self.api.cancel(str(handle["job_id"]))
            return self._exited(handle, failure, stop)
        if view is not None and (view.state in PENDING or view.state in ACTIVE):
            return self._live(handle, view, failure, stop, now)
        # The job is over (or Slurm forgot it) and some rank has no exit code.
        first = read_json(log_dir / ENDED_FILE)
        if first is None:
            create_exclusive(log_dir / ENDED_FILE, json.dumps({"at": now}))
            first = read_json(log_dir / ENDED_FILE) or {"at": now}
        if now < float(first["at"]) + self.settle_s:
            return Status("running", reason="ending")
        if stop is not None:  # stopped before its handlers were up, or killed by the backstop below
            code = -signal.SIGKILL if stop.get("killed") else -signal.SIGTERM
            for r in handle["ranks"]:
                create_exclusive(Path(r["rc_file"]), f"{code}\n")
            return self.poll(handle, now)
        if failure is not None:
            return self._exited(handle, failure, stop)
        missing = [n for n, c in codes.items() if c is None]
        if view is None:
            why = "vanished from Slurm (purged after MinJobAge, or the controller lost its state)"
        elif view.state in ENDED_WORDS:
            return Status("exited", -signal.SIGTERM, f"{ENDED_WORDS[view.state]} before rank(s) "
                          f"{', '.join(map(str, missing))} recorded an exit code")  # fmt: skip
        else:
            why = f"ended ({view.state}) in Slurm"
        return self._lost(handle, f"Slurm job {handle['job_id']} {why} without an exit code from rank(s) "
                          f"{', '.join(map(str, missing))}; see {handle['batch_err']}", now)  # fmt: skip

    def _live(
        self, handle: dict[str, Any], view: JobView, failure: dict[str, Any] | None, stop: dict[str, Any] | None,
        now: float,
    ) -> Status:  # fmt: skip
        """The job is pending or running in Slurm."""
        if failure is not None and stop is None:
            self.stop(handle, now, by="gang")
            stop = read_json(Path(handle["log_dir"]) / STOP_FILE)
        if stop is not None:
            if now >= float(stop["at"]) + float(handle.get("grace_s", 10.0)) + KILL_AFTER_GRACE_S:
                if not stop.get("killed"):
                    write_atomic(str(Path(handle["log_dir"]) / STOP_FILE), json.dumps({**stop, "killed": now}))
                self.api.cancel(str(handle["job_id"]))
            return Status("running", reason="stopping")
        if view.state in PENDING:
            waited = now - float(handle["launched_at"])
            if view.reason.startswith(HOPELESS) or waited > self.pending_timeout_s:
                self.api.cancel(str(handle["job_id"]))
                return self._lost(handle, f"Slurm job {handle['job_id']} pending for {waited:.0f}s: {view.reason}"
                                  " (its nodes are held by work suanli does not see, or refused)", now)  # fmt: skip
            return Status("running", reason=f"pending in Slurm: {view.reason}")
        return Status("running", reason="suspended in Slurm" if view.state in ("SUSPENDED", "STOPPED") else "")

    def _first_failure(self, handle: dict[str, Any], codes: dict[int, int | None], now: float) -> dict[str, Any] | None:
        """Record the gang's first failure (earliest exit code or lost file, then the lowest rank); None if none."""
        failed: list[tuple[float, int, dict[str, Any]]] = []
        world = len(handle["ranks"])
        for rank in handle["ranks"]:
            n = int(rank["node_rank"])
            where = f" (rank {n} on {rank['host']})" if world > 1 else ""
            code = codes[n]
            if code is not None and code != 0:
                why = describe_exit(code)
                if reason := _read_text(rank.get("reason_file", "")):
                    why = f"{reason} ({why})"
                failed.append((_mtime(rank["rc_file"], now), n, {"state": "exited", "exit_code": code,
                                                                  "reason": why + where}))  # fmt: skip
            elif code is None and (lost := _read_text(rank["lost_file"])):
                failed.append((_mtime(rank["lost_file"], now), n, {"state": "lost", "exit_code": None, "reason": lost}))
        return record_first_failure(Path(handle["log_dir"]), failed, now)

    def _exited(self, handle: dict[str, Any], failure: dict[str, Any] | None, stop: dict[str, Any] | None) -> Status:
        note = " (stop requested)" if stop is not None and stop.get("by") == "user" else ""
        ended = max((_mtime(r["rc_file"], 0.0) for r in handle["ranks"]), default=None) or None
        if failure is None:
            return Status("exited", 0, "exit code 0" + note, ended)
        if failure["state"] == "lost":
            return Status("lost", None, failure["reason"])
        return Status("exited", int(failure["exit_code"]), failure["reason"] + note, ended)

    def _lost(self, handle: dict[str, Any], reason: str, now: float) -> Status:
        path = Path(handle["log_dir"]) / FAILURE_FILE
        create_exclusive(path, json.dumps({"state": "lost", "exit_code": None, "reason": reason, "at": now}))
        failure = read_json(path) or {"state": "lost", "reason": reason}
        if failure["state"] != "lost":  # a rank had failed first: that is what ended the attempt
            return Status("exited", int(failure["exit_code"]), failure["reason"])
        return Status("lost", None, failure["reason"])

    def _dead_nodes(self, handle: dict[str, Any]) -> str:
        """'; node2 is DOWN+NOT_RESPONDING: Not responding [...]' for the job's nodes Slurm holds dead."""
        dead = [f"{r['NodeName']} is {r.get('State', '?')}" + (f": {r['Reason']}" if r.get("Reason") else "")
                for r in self.api.node_records(handle["nodes"]) if slurm_nodes.state_dead(r.get("State", ""))]  # fmt: skip
        return f"; {'; '.join(dead)}" if dead else ""

    # -- stopping -----------------------------------------------------------------------------------------

    def stop(self, handle: dict[str, Any], now: float, by: str = "user") -> None:
        """Ask every rank to stop (SIGTERM → grace → SIGKILL by its supervisor); cancel the job if still pending.

        Non-blocking and idempotent: the first request's time counts; later calls only repeat the signal."""
        create_exclusive(Path(handle["log_dir"]) / STOP_FILE, json.dumps({"at": now, "by": by}))
        job = str(handle["job_id"])
        self.api.cancel(job, pending_only=True)
        self.api.signal_batch(job, "TERM")

    # -- logs ---------------------------------------------------------------------------------------------

    def log_path(self, handle: dict[str, Any], node_rank: int = 0) -> Path | None:
        for rank in handle["ranks"]:
            if int(rank["node_rank"]) == node_rank:
                return Path(rank["log_file"])
        return None


def _mtime(path: str, default: float) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return default
