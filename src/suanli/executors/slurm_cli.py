"""Slurm through its command-line tools (`sbatch`, `squeue`, `scontrol`, `scancel`), each run with a timeout: the
`SlurmAPI` transport every Slurm site has on its submit hosts, with the site's own auth (munge) and no token to
manage. `slurm_rest.SlurmREST` is the other one, where the operator runs slurmrestd; it still calls these tools for
what slurmrestd 22.05 cannot do. The parsing of their text is `slurm_nodes`'s (pure).
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Mapping, Sequence
from functools import lru_cache

from suanli.executors import slurm_nodes
from suanli.executors.base import EngineNode
from suanli.executors.slurm_api import ACTIVE_STATES, JOB_PREFIX, BatchJob, SlurmError

__all__ = ["ACTIVE_STATES", "JOB_PREFIX", "SlurmCLI", "SlurmError", "discover"]


class SlurmCLI:
    """Runs Slurm's tools against one cluster: `slurm_conf` (SLURM_CONF) names it, None means the host's default.

    `bin_dir` is where the tools are (None: PATH). Each call times out after `timeout_s`: a controller that does
    not answer must not hang the server's supervisor loop."""

    def __init__(self, slurm_conf: str | None = None, timeout_s: float = 30.0, bin_dir: str | None = None) -> None:
        self.slurm_conf = slurm_conf
        self.timeout_s = timeout_s
        self.bin_dir = bin_dir

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def run(
        self,
        tool: str,
        args: Sequence[str],
        check: bool = True,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Run `tool args…` (in `env`, default this process's environment and SLURM_CONF); its stdout. A failure
        (exit code, timeout, missing tool) raises SlurmError when `check`, else returns the stdout it had ("" if
        none)."""
        exe = os.path.join(self.bin_dir, tool) if self.bin_dir else tool
        run_env = self.env() if env is None else {**env, **({"SLURM_CONF": self.slurm_conf} if self.slurm_conf else {})}
        try:
            out = subprocess.run(
                [exe, *args], env=run_env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=timeout_s or self.timeout_s,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            if check:
                raise SlurmError(f"{tool} {' '.join(args)}: {e}") from e
            return ""
        if out.returncode != 0 and check:
            words = (out.stderr or out.stdout).strip().splitlines()
            raise SlurmError(f"{tool} {' '.join(args)}: {words[-1] if words else f'exit code {out.returncode}'}")
        return out.stdout

    def hostnames(self, expr: str) -> list[str]:
        """A hostlist expression expanded by Slurm itself (`scontrol show hostnames`)."""
        return _hostnames(self, expr) if expr else []

    def job_records(self, job_id: str) -> list[dict[str, str]] | None:
        """`scontrol show job -o` of a job (one record per heterogeneous component); None when Slurm no longer knows
        it (purged after MinJobAge, or the controller lost its state). Raises SlurmError when Slurm cannot say."""
        try:
            text = self.run("scontrol", ["-o", "show", "job", job_id])
        except SlurmError as e:
            if "Invalid job id" in str(e):
                return None
            raise
        recs = [r for r in slurm_nodes.records(text) if "JobState" in r]
        return recs or None

    def submit(self, job: BatchJob) -> str:
        """One `sbatch --parsable`, components separated by `:` (a heterogeneous job); the job id it printed."""
        args = ["--parsable"]
        for i, comp in enumerate(job.components):
            if i:
                args.append(":")
            args += [f"--job-name={job.name}", "--no-requeue", "--export=ALL", f"--chdir={job.workdir}",
                     f"--output={job.output}", f"--error={job.error}", f"--nodes={len(comp.hosts)}",
                     "--ntasks-per-node=1", f"--nodelist={','.join(comp.hosts)}"]  # fmt: skip
            args += [f"--gres=gpu:{comp.gpus}"] if comp.gpus else []
            args += [f"--cpus-per-task={comp.cpus}"] if comp.cpus else []
            args += [f"--mem={comp.memory_mib}M"] if comp.memory_mib else []
            args += [f"--partition={job.partition}"] if job.partition else []
            args += job.site_args
        # sbatch runs in `environment` alone and exports it all: what slurmctld stores is that and no more (no SBATCH_*
        # of ours becomes an option either). --export=NIL would do the same but costs slurmd 0.1-1 s per launch.
        out = self.run("sbatch", [*args, str(job.script)], env=dict(job.environment))
        job_id = out.strip().split(";", 1)[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out.strip()!r}, not a job id")
        return job_id

    def cancel(self, job_id: str, *, pending_only: bool = False) -> None:
        """`scancel [--state=PENDING] JOB`; a failure is not raised (the caller repeats it)."""
        self.run("scancel", [*(["--state=PENDING"] if pending_only else []), job_id], check=False)

    def signal_batch(self, job_id: str, signal: str = "TERM") -> None:
        """`scancel --batch --signal=SIG JOB`: the batch shell alone hears it; a failure is not raised."""
        self.run("scancel", ["--batch", f"--signal={signal}", job_id], check=False)

    def node_records(self, names: Sequence[str]) -> list[dict[str, str]]:
        """`scontrol -o show node a,b,…`; what it printed, [] when it failed."""
        text = self.run("scontrol", ["-o", "show", "node", ",".join(names)], check=False) if names else ""
        return [r for r in slurm_nodes.records(text) if "NodeName" in r]

    def discover(self, partition: str | None = None) -> list[EngineNode]:
        """See the module function `discover`."""
        return discover(self, partition)


@lru_cache(maxsize=4096)
def _hostnames(cli: SlurmCLI, expr: str) -> list[str]:
    return cli.run("scontrol", ["show", "hostnames", expr]).split()


def discover(cli: SlurmCLI, partition: str | None = None) -> list[EngineNode]:
    """The cluster's nodes as suanli registers them: `scontrol -d -o show node` (GresUsed needs -d), the tree from
    `scontrol show topology` (what slurmctld loaded from topology.conf), and the GPUs suanli's own running jobs hold
    (`squeue`), so that `busy_gpus` counts only others' jobs. Raises SlurmError when Slurm does not answer."""
    nodes = cli.run("scontrol", ["-d", "-o", "show", "node"])
    topo = cli.run("scontrol", ["show", "topology"], check=False)
    user = pwd.getpwuid(os.getuid()).pw_name
    jobs = cli.run("squeue", ["-h", "-a", "-u", user, f"--states={ACTIVE_STATES}", "-o", "%u|%N|%b|%j"])
    own = slurm_nodes.own_gpus(jobs, user, JOB_PREFIX, cli.hostnames)
    return slurm_nodes.parse_nodes(nodes, slurm_nodes.parse_topology(topo, cli.hostnames), own, partition)
