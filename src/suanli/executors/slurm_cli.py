"""The one door to Slurm: its command-line tools (`sbatch`, `squeue`, `scontrol`, `scancel`) run with a timeout,
and inventory discovery over them (the parsing is `slurm_nodes`'s, pure).

The CLI rather than slurmrestd: every Slurm site has the tools on its submit hosts, with the site's own auth (munge)
and no token to manage; slurmrestd is optional, often not run, and its API version moves with the Slurm release.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Sequence
from functools import lru_cache

from suanli.executors import slurm_nodes
from suanli.executors.base import EngineNode

JOB_PREFIX = "suanli-"  # the job name of every attempt suanli submits: `suanli-<workload>-a<attempt>`
ACTIVE_STATES = "RUNNING,COMPLETING,CONFIGURING,SUSPENDED,STOPPED,RESIZING,SIGNALING,STAGE_OUT"


class SlurmError(RuntimeError):
    """A Slurm command failed or timed out; the message carries its own words (stderr)."""


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

    def run(self, tool: str, args: Sequence[str], check: bool = True, timeout_s: float | None = None) -> str:
        """Run `tool args…`; its stdout. A failure (exit code, timeout, missing tool) raises SlurmError when `check`,
        else returns the stdout it had ("" if none)."""
        exe = os.path.join(self.bin_dir, tool) if self.bin_dir else tool
        try:
            out = subprocess.run(
                [exe, *args], env=self.env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
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


@lru_cache(maxsize=4096)
def _hostnames(cli: SlurmCLI, expr: str) -> list[str]:
    return cli.run("scontrol", ["show", "hostnames", expr]).split()


def discover(cli: SlurmCLI, partition: str | None = None) -> list[EngineNode]:
    """The cluster's nodes as suanli registers them: `scontrol -d -o show node` (GresUsed needs -d), the tree from
    `scontrol show topology` (what slurmctld loaded from topology.conf), and the GPUs suanli's own running jobs hold
    (`squeue`), so that `busy_gpus` counts only others' jobs. Raises SlurmError when Slurm does not answer."""
    nodes = cli.run("scontrol", ["-d", "-o", "show", "node"])
    topo = cli.run("scontrol", ["show", "topology"], check=False)
    jobs = cli.run("squeue", ["-h", "-a", f"--states={ACTIVE_STATES}", "-o", "%u|%j|%N|%b"])
    user = pwd.getpwuid(os.getuid()).pw_name
    own = slurm_nodes.own_gpus(jobs, user, JOB_PREFIX, cli.hostnames)
    return slurm_nodes.parse_nodes(nodes, slurm_nodes.parse_topology(topo, cli.hostnames), own, partition)
