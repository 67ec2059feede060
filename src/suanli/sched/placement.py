"""Placement plugins: which GPUs a gang gets.

* `first-fit` — the baseline every operator knows: nodes in index order, free GPUs until the gang is
  full, topology ignored (except a hard `nvlink`/`leaf` constraint, which it checks afterwards).
* `topology` — best-fit cells in the spirit of HiveD's buddy cells: the smallest single node that fits,
  else the fullest NVLink domain, leaf, spine group that still fits, filling whole nodes first; so the gang
  stays compact (short collectives, see `perf/`) and whole domains and leaves stay free for big jobs.
  GPU slices are packed best-fit onto already-shared GPUs first (fragmentation-aware, FGD-style).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from suanli.sched.state import ClusterState
from suanli.sched.types import FULL, Request


class PlacementResult(NamedTuple):
    gpus: NDArray[np.int64] | None
    reason: str = ""


Placer = Callable[[ClusterState, Request, int], PlacementResult]


def _what(req: Request, k: int) -> str:
    kind = req.gpu_type if isinstance(req.gpu_type, str) else "|".join(req.gpu_type or ())
    return f"{k} {kind}" if kind else f"{k} GPU{'s' if k != 1 else ''}"


def _node_free(state: ClusterState, req: Request) -> NDArray[np.int32]:
    """Whole free GPUs per node this request may use (0 elsewhere), as many as the node's free CPU and memory carry
    when the state tracks them."""
    nw = np.where(state.usable_nodes(req.gpu_type), state.node_whole, 0)
    if req.exclusive:
        nw = np.where(nw == state.gpn, nw, 0)
    room = state.host_room(req)
    if room is not None:
        nw = np.minimum(nw, room).astype(nw.dtype)
    return nw


def _too_few(state: ClusterState, req: Request, k: int, free: int) -> str:
    """Why k GPUs cannot be had when only `free` of them are usable: the GPUs, or the CPU and memory beside them."""
    empty = state.host_room(req, empty=True)
    if empty is not None:
        most = int(empty[state.nodes_of_type(req.gpu_type)].sum())  # drained or held exclusively: may come back
        if most < k:
            return (f"needs {_what(req, k)} with {req.cpu_milli / 1000:g} CPUs and {req.memory_mib} MiB; the nodes "
                    f"with these GPUs have the CPU and memory for at most {most} of them, even when idle")  # fmt: skip
        req_gpus_only = np.where(state.usable_nodes(req.gpu_type), state.node_whole, 0)
        if int(req_gpus_only.sum()) >= k:
            return (f"needs {_what(req, k)} with {req.cpu_milli / 1000:g} CPUs and {req.memory_mib} MiB; "
                    f"only {free} free GPUs are on nodes with that CPU and memory free")  # fmt: skip
    return f"needs {_what(req, k)}; {free} free"


def _take(
    state: ClusterState, nodes: NDArray[np.int64], k: int, nw: NDArray[np.int32] | None = None
) -> NDArray[np.int64]:
    """The first k whole free GPUs of `nodes`, in the given node order; at most `nw[n]` from node n when the
    state tracks host CPU and memory (which may carry fewer GPUs than a node has free)."""
    first = state.cluster.node_first_gpu[nodes]
    counts = state.gpn[nodes]
    offsets = np.repeat(first - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    gpus = np.arange(int(counts.sum()), dtype=np.int64) + offsets
    gpus = gpus[(state.free[gpus] == FULL) & state.gpu_ok[gpus]]
    if nw is not None and state.tracks_host and gpus.size:
        owner = state.gpu_node[gpus]  # grouped by node, in order
        starts = np.flatnonzero(np.concatenate(([True], owner[1:] != owner[:-1])))
        rank = np.arange(owner.size) - np.repeat(starts, np.diff(np.append(starts, owner.size)))
        gpus = gpus[rank < nw[owner]]
    return gpus[:k]


def _fill(state: ClusterState, nodes: NDArray[np.int64], nw: NDArray[np.int32], k: int) -> NDArray[np.int64]:
    """Take k GPUs from `nodes`, fullest nodes first (fewest nodes touched)."""
    order = nodes[np.argsort(-nw[nodes], kind="stable")]
    cum = np.cumsum(nw[order])
    cut = int(np.searchsorted(cum, k)) + 1
    return _take(state, order[:cut], k, nw)


def _best_cell(cell_of_node: NDArray[np.int64], nw: NDArray[np.int32], k: int, n_cells: int) -> tuple[int, int]:
    """(best-fit cell with >= k free, largest free in any cell); cell -1 when none fits."""
    free = np.bincount(cell_of_node, weights=nw, minlength=n_cells)
    fits = np.flatnonzero(free >= k)
    largest = int(free.max()) if free.size else 0
    if fits.size == 0:
        return -1, largest
    return int(fits[np.argmin(free[fits])]), largest


def _eligible(req: Request, k: int, nw: NDArray[np.int32]) -> tuple[int, NDArray[np.int64], str]:
    """For `req.nodes`: the share of k GPUs on each node, and the nodes with that many free (or a reason why
    the placement cannot be had)."""
    assert req.nodes is not None
    if k % req.nodes:
        return 0, np.empty(0, np.int64), f"{k} GPUs do not split evenly over {req.nodes} nodes"
    per = k // req.nodes
    eligible = np.flatnonzero(nw >= per)
    if eligible.size < req.nodes:
        return per, eligible, f"needs {req.nodes} nodes with {_what(req, per)} free each; {eligible.size} have"
    return per, eligible, ""


def _take_each(state: ClusterState, nodes: NDArray[np.int64], per: int) -> NDArray[np.int64]:
    return np.concatenate([_take(state, np.array([n]), per) for n in nodes])


def _on_nodes(state: ClusterState, req: Request, k: int, nw: NDArray[np.int32]) -> PlacementResult:
    """Exactly `req.nodes` nodes with k/nodes GPUs each, in the tightest cell that has enough such nodes
    (NVLink domain, leaf, spine group, then anywhere), fullest nodes first so emptier ones stay whole."""
    assert req.nodes is not None
    per, eligible, why = _eligible(req, k, nw)
    if why:
        return PlacementResult(None, why)
    c = state.cluster
    tiers = (("nvlink", state.node_domain, int(state.node_domain[-1]) + 1), ("leaf", state.node_leaf, c.n_leaves),
             ("spine", state.node_spine, c.n_spines))  # fmt: skip
    for tier, cell_of, n_cells in tiers:
        counts = np.bincount(cell_of[eligible], minlength=n_cells)
        fits = np.flatnonzero(counts >= req.nodes)
        if fits.size:
            cell = fits[int(np.argmin(counts[fits]))]
            mine = eligible[cell_of[eligible] == cell]
            return PlacementResult(_take_each(state, mine[np.argsort(nw[mine], kind="stable")][: req.nodes], per))
        if req.topology == tier:
            most = int(counts.max()) if counts.size else 0
            return PlacementResult(None, f"needs {req.nodes} nodes with {per} free GPUs each in one {tier} cell; "
                                         f"the most any has is {most}")  # fmt: skip
    return PlacementResult(_take_each(state, eligible[np.argsort(nw[eligible], kind="stable")][: req.nodes], per))


def topology_aware(state: ClusterState, req: Request, k: int) -> PlacementResult:
    if k == 0:
        return PlacementResult(np.empty(0, np.int64))
    if req.milli < FULL:
        return place_slice(state, req)
    nw = _node_free(state, req)
    if req.nodes is not None:
        return _on_nodes(state, req, k, nw)
    total = int(nw.sum())
    if total < k:
        return PlacementResult(None, _too_few(state, req, k, total))
    c = state.cluster
    leaf_of = state.node_leaf
    # 1. one node: best fit, in the busiest leaf
    fits = np.flatnonzero(nw >= k)
    if fits.size:
        leaf_free = np.bincount(leaf_of, weights=nw, minlength=c.n_leaves)
        key = nw[fits].astype(np.int64) * (1 << 32) + leaf_free[leaf_of[fits]].astype(np.int64)
        node = fits[int(np.argmin(key))]
        return PlacementResult(_take(state, np.array([node]), k))
    # 2. one NVLink domain spanning several nodes (NVL72 racks)
    domain_of = state.node_domain
    n_domains = int(domain_of[-1]) + 1
    if n_domains < c.n_nodes:
        cell, largest = _best_cell(domain_of, nw, k, n_domains)
        if cell >= 0:
            return PlacementResult(_fill(state, np.flatnonzero(domain_of == cell), nw, k))
    else:
        largest = int(nw.max())
    if req.topology == "nvlink":
        return PlacementResult(None, f"needs {_what(req, k)} in one NVLink domain; largest free block is {largest}")
    # 3. one leaf
    cell, largest = _best_cell(leaf_of, nw, k, c.n_leaves)
    if cell >= 0:
        return PlacementResult(_fill(state, np.flatnonzero(leaf_of == cell), nw, k))
    if req.topology == "leaf":
        return PlacementResult(None, f"needs {_what(req, k)} under one leaf; largest free block is {largest}")
    # 4. one spine group, fullest leaves first
    spine_of = state.node_spine
    leaf_free = np.bincount(leaf_of, weights=nw, minlength=c.n_leaves)
    cell, _ = _best_cell(spine_of, nw, k, c.n_spines)
    candidates = np.flatnonzero(spine_of == cell) if cell >= 0 else np.flatnonzero(nw > 0)
    candidates = candidates[nw[candidates] > 0]
    key = -leaf_free[leaf_of[candidates]] * 1024 - nw[candidates]
    order = candidates[np.argsort(key, kind="stable")]
    cum = np.cumsum(nw[order])
    cut = int(np.searchsorted(cum, k)) + 1
    return PlacementResult(_take(state, order[:cut], k, nw))


def first_fit(state: ClusterState, req: Request, k: int) -> PlacementResult:
    if k == 0:
        return PlacementResult(np.empty(0, np.int64))
    if req.milli < FULL:
        return place_slice(state, req, best_fit=False)
    nw = _node_free(state, req)
    if req.nodes is not None:
        per, eligible, why = _eligible(req, k, nw)
        if why:
            return PlacementResult(None, why)
        return _within(state, req, k, _take_each(state, eligible[: req.nodes], per), "first fit")
    nodes = np.flatnonzero(nw > 0)
    cum = np.cumsum(nw[nodes])
    if cum.size == 0 or cum[-1] < k:
        return PlacementResult(None, _too_few(state, req, k, int(cum[-1]) if cum.size else 0))
    cut = int(np.searchsorted(cum, k)) + 1
    return _within(state, req, k, _take(state, nodes[:cut], k, nw), "first fit")


def _within(state: ClusterState, req: Request, k: int, gpus: NDArray[np.int64], how: str) -> PlacementResult:
    """The placement, if it keeps the request's hard topology constraint."""
    if req.topology in ("nvlink", "leaf"):
        span = state.cluster.span(gpus)
        tier = "nvlink" if req.topology == "nvlink" else "leaf"
        if span[tier] > 1:
            return PlacementResult(None, f"needs {_what(req, k)} in one {tier} cell; {how} spans {span[tier]}")
    return PlacementResult(gpus)


def place_slice(state: ClusterState, req: Request, best_fit: bool = True) -> PlacementResult:
    """One GPU slice of `req.milli`: best fit on shared GPUs (keeps whole GPUs whole), or first fit."""
    usable_nodes = state.usable_nodes(req.gpu_type)
    room = state.host_room(req)
    if room is not None:
        usable_nodes = usable_nodes & (room >= 1)
    usable = usable_nodes[state.gpu_node]
    cand = np.flatnonzero(usable & state.gpu_ok & (state.free >= req.milli))
    if cand.size == 0:
        why = "no GPU has that much free"
        if room is not None:
            why += " on a node with its CPU and memory free"
        return PlacementResult(None, f"needs a {req.milli / FULL:g}-GPU slice; {why}")
    if not best_fit:
        return PlacementResult(cand[:1])
    left = (state.free[cand] - req.milli).astype(np.int64)
    key = left * (1 << 20) + state.node_whole[state.gpu_node[cand]]
    return PlacementResult(cand[[int(np.argmin(key))]])


PLACEMENTS: dict[str, Placer] = {"topology": topology_aware, "first-fit": first_fit}
