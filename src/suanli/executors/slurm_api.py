"""What suanli asks of Slurm, as one small interface with two transports behind it.

`slurm_cli.SlurmCLI` runs Slurm's tools (`sbatch`, `squeue`, `scontrol`, `scancel`); `slurm_rest.SlurmREST` talks
to slurmrestd. The executor and discovery call only `SlurmAPI`, so which transport carries a call is a setting
(`slurm: {rest: …}`), not a code path of their own.

Records come back in `scontrol -o`'s shape (`{"JobState": "RUNNING", "Reason": "None", "NodeList": "node[1-2]"}`,
`{"NodeName": "gpu01", "State": "IDLE+DRAIN", "Gres": "gpu:h100:8", …}`) whichever transport read them: the REST
transport maps slurmrestd's JSON into it, so `slurm_nodes` stays the one place that interprets Slurm's states.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from suanli.executors.base import EngineNode

JOB_PREFIX = "suanli-"  # the job name of every attempt suanli submits: `suanli-<workload>-a<attempt>`
# The states in which a job holds its nodes' GPUs (squeue's --states names): suanli's own such jobs are not "busy".
ACTIVE_STATES = "RUNNING,COMPLETING,CONFIGURING,SUSPENDED,STOPPED,RESIZING,SIGNALING,STAGE_OUT"


class SlurmError(RuntimeError):
    """Slurm could not do or say what was asked (a tool failed or timed out, slurmrestd refused or did not answer);
    the message carries Slurm's own words."""


@dataclass(frozen=True)
class Component:
    """One component of a batch job: `hosts` (Slurm NodeNames, in rank order), one task on each, and what each of
    those nodes gives it (0: Slurm's default). A job has several when its ranks need different amounts."""

    hosts: tuple[str, ...]
    gpus: int = 0
    cpus: int = 0
    memory_mib: int = 0


@dataclass(frozen=True)
class BatchJob:
    """A batch job as suanli submits it: always `--no-requeue` (a requeue is suanli's decision) and nothing of the
    submitter's environment: only `environment`, with no login shell run on the node to fetch a user's.

    `script` is the batch script's file; it sets the environment its tasks need itself. `environment` is what the
    batch shell starts with besides Slurm's own SLURM_* variables (sbatch runs in it alone with `--export=ALL`;
    slurmrestd is given it). `output`/`error` may hold `%j`.
    `site_args` are the site's own sbatch options (`--account=…`, `--qos=…`, `--time=…`), given to every component."""

    name: str
    script: Path
    workdir: Path
    output: str
    error: str
    components: tuple[Component, ...]
    partition: str | None = None
    site_args: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)


class SlurmAPI(Protocol):
    """The operations the Slurm executor and node discovery need, and nothing else."""

    def submit(self, job: BatchJob) -> str:
        """Submit `job` (one component, or a heterogeneous job of several); its job id. Raises SlurmError."""
        ...

    def job_records(self, job_id: str) -> list[dict[str, str]] | None:
        """The job's records in `scontrol -o show job`'s shape, one per heterogeneous component; None when Slurm no
        longer knows it (purged after MinJobAge, or the controller lost its state). Raises SlurmError when Slurm
        cannot say."""
        ...

    def cancel(self, job_id: str, *, pending_only: bool = False) -> None:
        """Cancel the job as `scancel` does (SIGTERM, KillWait, SIGKILL to every step), or only if it is still
        pending. Never raises: every caller repeats it on a later poll, and a stop must not fail on a slow Slurm."""
        ...

    def signal_batch(self, job_id: str, signal: str = "TERM") -> None:
        """Send `signal` to the batch shell alone (`scancel --batch`), not to the job's steps. Never raises."""
        ...

    def node_records(self, names: Sequence[str]) -> list[dict[str, str]]:
        """The records of those of `names` Slurm knows, in `scontrol -o show node`'s shape; [] when it cannot say."""
        ...

    def discover(self, partition: str | None = None) -> list[EngineNode]:
        """The cluster's nodes (of `partition`, when given) with GPUs, topology labels and the GPUs that jobs other
        than suanli's hold. Raises SlurmError when Slurm does not answer."""
        ...
