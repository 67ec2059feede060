"""GPUs held back for plans: a count per GPU model, never particular GPUs.

A plan reserves N GPUs of a model for a tenant. While its work leaves some of them idle, the scheduler keeps that
many of the model's GPUs to be had (`ClusterState.hold`: of each model, GPUs per tenant). For a request, the GPUs
held back from it are every tenant's hold but its own (only reserved-class work is a plan's); the GPUs *to be had*
of a model are the whole free ones on nodes that take work, and, when spot work gives way to reserved work (a policy
that preempts by class) and the request is not spot work itself, those spot work holds. A decision for the request
(a placement, a preemption's victims given back, an elastic grow) keeps, of each model, at least the held count to
be had, or as many as there were before it where that was less. So a plan holder's work finds its GPUs free or held
by spot work that gives way to it; spot work is never placed on GPUs held back; on-demand work may preempt spot work
only where enough stays to be had. With nothing held, placement is unchanged.

A request that may use several models is placed as the placement plugin chooses when that keeps every model's
count; otherwise on one model alone, in its order of preference, where that model's count allows it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from suanli.sched.placement import PlacementResult
from suanli.sched.state import ClusterState
from suanli.sched.types import FULL, Allocation, Request

Placer = Callable[[ClusterState, Request, int], PlacementResult]


def held_from(state: ClusterState, req: Request) -> dict[str, int]:
    """Of each model, the GPUs held back from `req`: every tenant's hold, less its own when it is reserved work."""
    out = {}
    for model, by in state.held.items():
        n = sum(by.values()) - (by.get(req.tenant, 0) if req.priority == "reserved" else 0)
        if n > 0:
            out[model] = n
    return out


def to_be_had(state: ClusterState, req: Request, model: str, spot_yields: bool) -> int:
    """GPUs of `model` a plan's work could have now, as `req` sees it (see the module docstring)."""
    n = state.free_whole_of(model)
    return n + state.spot_whole.get(model, 0) if spot_yields and req.priority != "spot" else n


def floor(state: ClusterState, req: Request, spot_yields: bool) -> dict[str, int]:
    """Of each model held back from `req`: what a decision for it must leave to be had."""
    return {m: min(n, to_be_had(state, req, m, spot_yields)) for m, n in held_from(state, req).items()}


def keeps(state: ClusterState, floor: dict[str, int], req: Request, alloc: Allocation, spot_yields: bool) -> bool:
    """Whether giving `alloc` back the GPUs it held (free now) leaves every model at least its floor to be had."""
    spot = alloc.request.priority == "spot" and alloc.milli == FULL
    if not floor or (spot and spot_yields and req.priority != "spot"):
        return True  # whole GPUs of spot work count as to be had, held or not
    gpus = np.asarray(alloc.gpus, dtype=np.int64)
    nodes = state.gpu_node[gpus]
    gpus = gpus[(state.free[gpus] == FULL) & state.gpu_ok[gpus] & state.node_ok[nodes] & ~state.node_exclusive[nodes]]
    counts = _counts(state, gpus)
    return all(to_be_had(state, req, m, spot_yields) - counts.get(m, 0) >= f for m, f in floor.items())


def models_of(state: ClusterState, req: Request) -> list[str]:
    """The GPU models `req` may run on, in its order of preference (by name otherwise)."""
    names = (req.gpu_type,) if isinstance(req.gpu_type, str) else req.gpu_type
    out: list[str] = []
    for name in names or state.models:
        for g in state.cluster.groups:
            if name in (g.gpu.name, g.name) and g.gpu.name not in out:
                out.append(g.gpu.name)
    return out


def taken(state: ClusterState, req: Request, gpus: NDArray[np.int64]) -> dict[str, int]:
    """Whole free GPUs of each model a placement takes (a slice takes one only when it lands on a whole GPU; exclusive
    work takes its nodes' all)."""
    gpus = np.asarray(gpus, dtype=np.int64)
    if req.exclusive and gpus.size:
        gpus = np.concatenate([np.arange(r.start, r.stop) for r in
                               (state.cluster.gpus_of_node(int(n)) for n in np.unique(state.gpu_node[gpus]))])  # fmt: skip
        gpus = gpus[(state.free[gpus] == FULL) & state.gpu_ok[gpus]]
    elif req.milli < FULL:
        gpus = gpus[state.free[gpus] == FULL]
    return _counts(state, gpus)


def room(state: ClusterState, req: Request, spot_yields: bool) -> int:
    """Whole free GPUs `req` may take, all its models together (the elastic grow's bound)."""
    held = held_from(state, req) if state.held else {}
    return sum(max(0, min(state.free_whole_of(m), to_be_had(state, req, m, spot_yields) - held[m]))
               if m in held else state.free_whole_of(m) for m in models_of(state, req))  # fmt: skip


def place(placer: Placer, state: ClusterState, req: Request, k: int, spot_yields: bool) -> PlacementResult:
    """The placement plugin's choice of k GPUs for `req`, keeping what is held back from it (see the module)."""
    held = held_from(state, req) if state.held else {}
    models = models_of(state, req) if held else []
    held = {m: n for m, n in held.items() if m in models}
    if not held:
        return placer(state, req, k)
    budget = {m: to_be_had(state, req, m, spot_yields) - n for m, n in held.items()}
    need = k if req.milli == FULL else 1
    if len(models) == 1 and req.milli == FULL and k > budget[models[0]]:
        return PlacementResult(None, _why(state, req, k, held, spot_yields))
    got = placer(state, req, k)
    if got.gpus is None or _within(state, req, got.gpus, budget):
        return got
    for m in models:  # a placement over some model's count: one model alone, where its count allows
        if budget.get(m, need) < need:
            continue
        alone = placer(state, replace(req, gpu_type=_groups(state, req, m)), k)
        if alone.gpus is not None and _within(state, req, alone.gpus, budget):
            return alone
    return PlacementResult(None, _why(state, req, k, held, spot_yields))


def _counts(state: ClusterState, gpus: NDArray[np.int64]) -> dict[str, int]:
    idx, counts = np.unique(state.node_model[state.gpu_node[gpus]], return_counts=True)
    return {state.models[i]: n for i, n in zip(idx.tolist(), counts.tolist(), strict=True)}


def _groups(state: ClusterState, req: Request, model: str) -> tuple[str, ...]:
    """The node groups of `model` that `req` may use, by name."""
    names = None if req.gpu_type is None else {req.gpu_type} if isinstance(req.gpu_type, str) else set(req.gpu_type)
    return tuple(g.name for g in state.cluster.groups
                 if g.gpu.name == model and (names is None or g.gpu.name in names or g.name in names))  # fmt: skip


def _within(state: ClusterState, req: Request, gpus: NDArray[np.int64], budget: dict[str, int]) -> bool:
    return all(n <= budget.get(m, n) for m, n in taken(state, req, gpus).items())


def _why(state: ClusterState, req: Request, k: int, held: dict[str, int], spot_yields: bool) -> str:
    what = next(iter(held)) if len(held) == 1 else "GPUs"
    free = sum(state.free_whole_of(m) for m in held)
    spot = sum(state.spot_whole.get(m, 0) for m in held) if spot_yields and req.priority != "spot" else 0
    more = f" and {spot} held by spot work" if spot else ""
    return f"needs {k} {what}; {free} free{more}, of which plans hold back {sum(held.values())}"
