"""Executors: the adapters that start, watch and stop a workload's processes (see `base` for the contract).

`local` runs node-ranks as supervised processes on this host; `virtual` runs nothing and follows the clock;
`ray` and `slurm` run them on the nodes of a Ray or Slurm cluster, through the same rank supervisor.
Names are imported on first use: `python -m suanli.executors.rankrun` starts once per rank and must
stay light.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing would slow every rank's start
if TYPE_CHECKING:
    from typing import Any

    from suanli.executors.base import Executor, Launch, NodeRank, Status
    from suanli.executors.local import LocalExecutor
    from suanli.executors.virtual import VirtualExecutor

__all__ = ["NAMES", "Executor", "Launch", "LocalExecutor", "NodeRank", "Status", "VirtualExecutor", "executor"]

NAMES = ("local", "virtual", "ray", "slurm")

_LAZY = {
    "Executor": "base",
    "Launch": "base",
    "NodeRank": "base",
    "Status": "base",
    "LocalExecutor": "local",
    "VirtualExecutor": "virtual",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"suanli.executors.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'suanli.executors' has no attribute {name!r}")


def executor(name: str, **kw: Any) -> Executor:
    """The executor called `name` (one of `NAMES`), built with `kw` (Ray: `address`; Slurm: `slurm_conf`, `rest`)."""
    if name == "local":
        from suanli.executors.local import LocalExecutor

        return LocalExecutor(**kw)
    if name == "virtual":
        from suanli.executors.virtual import VirtualExecutor

        return VirtualExecutor(**kw)
    if name == "ray":
        from suanli.executors.ray_executor import RayExecutor

        return RayExecutor(**kw)
    if name == "slurm":
        from suanli.executors.slurm_executor import SlurmExecutor

        return SlurmExecutor(**kw)
    raise ValueError(f"unknown executor {name!r}; known: {', '.join(NAMES)}")
