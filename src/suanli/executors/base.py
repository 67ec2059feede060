"""The executor contract: what the control plane hands an executor, and what it gets back.

A handle is plain JSON stored in the database, so a restarted server can poll or stop work that an earlier
server process launched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class NodeRank:
    """One process group of a workload: node-rank `node_rank` runs on `node` with `gpus` visible.

    `host` is the engine's own name for that node (a Ray node id, a Slurm NodeName; "" on the local and virtual
    executors) and `address` the IP the other ranks reach it at ("" when unknown)."""

    node: str
    node_rank: int
    gpus: tuple[int, ...]
    host: str = ""
    address: str = ""


@dataclass(frozen=True)
class EngineNode:
    """A node as a cluster engine (Ray, Slurm) reports it: what the control plane registers and schedules on.

    `name` is stable across engine restarts (a hostname, a Slurm NodeName) and becomes the suanli node name under
    its cluster; `host` is what the executor needs to pin a rank there (`NodeRank.host`). `labels` carry the
    topology the operator stated (`suanli.io/gpu`, `suanli.io/nvlink-domain`, `suanli.io/leaf`, `suanli.io/spine`).
    `busy_gpus` are held by work the engine runs for others (Slurm jobs submitted outside suanli)."""

    name: str
    host: str
    address: str
    gpu_count: int
    gpu_model: str | None
    cpu_count: int
    memory_mib: int
    alive: bool
    labels: dict[str, str] = field(default_factory=dict)
    busy_gpus: int = 0
    reason: str = ""  # why it is not alive, in the engine's words


@dataclass(frozen=True)
class SandboxRequest:
    """How each node-rank is confined (`suanli.sandbox`): limits, network, the environment prefix, extra mounts
    (source, dest, writable), and the uid/gid to run as when the server is root (None: the server's own).

    `cpu_milli`/`memory_mib` are the workload's asks (0: none), which the scheduler counted and Ray and Slurm are
    asked for; `share_cpu_milli`/`share_memory_mib` the limits of GPU work that asked none (its GPUs' share of its
    nodes: a limit only, not reserved or billed). A rank holding some of `gpus_asked` GPUs gets its share per GPU
    (`sched.host_share`) of the ask, else of the share."""

    cpu_milli: int = 0
    memory_mib: int = 0
    gpus_asked: int = 0
    share_cpu_milli: int = 0
    share_memory_mib: int = 0
    network: str = "host"  # host | private | none
    environment: str | None = None
    mounts: tuple[tuple[str, str, bool], ...] = ()
    uid: int | None = None
    gid: int | None = None
    dev_root: str = "/dev"
    cgroup_parent: str | None = None


class NotRunning(ValueError):
    """There is no live sandbox to enter (the rank is not running, or ran unsandboxed on another node)."""


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one attempt of a workload."""

    workload_id: str
    attempt: int
    command: str
    workdir: Path
    env: dict[str, str]
    ranks: tuple[NodeRank, ...]
    log_dir: Path
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    grace_s: float = 10.0
    duration_s: float | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    sandbox: SandboxRequest | None = None  # None: unsandboxed (the operator's own work, when they opted in)


@dataclass(frozen=True)
class Status:
    """What `poll` saw. `exit_code` is set for "exited"; negative means killed by that signal."""

    state: Literal["running", "exited", "lost"]
    exit_code: int | None = None
    reason: str = ""
    # When it ended, if known (it may have ended while nobody polled): billing stops there. Not part of equality.
    ended_at: float | None = field(default=None, compare=False)


class Executor(Protocol):
    """Starts, watches and stops the processes of a workload attempt."""

    name: str

    def launch(self, launch: Launch, now: float) -> dict[str, Any]:
        """Start the attempt; return a JSON-serialisable handle that is enough to re-attach later."""
        ...

    def poll(self, handle: dict[str, Any], now: float) -> Status:
        """Current state; never raises because a process vanished."""
        ...

    def stop(self, handle: dict[str, Any], now: float) -> None:
        """Ask the attempt to stop (non-blocking): SIGTERM now, SIGKILL after the grace period."""
        ...

    def log_path(self, handle: dict[str, Any], node_rank: int = 0) -> Path | None:
        """The log file of one node-rank, or None when there is none."""
        ...


def rank_env(launch: Launch, rank: NodeRank) -> dict[str, str]:
    """Variables the executor sets for one node-rank, on top of the spec env and `extra_env`."""
    n = str(len(launch.ranks))
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in rank.gpus),
        "MASTER_ADDR": launch.master_addr,
        "MASTER_PORT": str(launch.master_port),
        "WORLD_SIZE": n,
        "RANK": str(rank.node_rank),
        "LOCAL_RANK": "0",
        "NODE_RANK": str(rank.node_rank),
        "SUANLI_WORKLOAD_ID": launch.workload_id,
        "SUANLI_ATTEMPT": str(launch.attempt),
        "SUANLI_NODES": n,
        "SUANLI_NODE_RANK": str(rank.node_rank),
        "SUANLI_GPUS_PER_NODE": str(len(rank.gpus)),
        "SUANLI_NODE": rank.node,
        "SUANLI_LOG_DIR": str(launch.log_dir),
    }
