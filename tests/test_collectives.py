"""NCCL collective cost model: bus factors, latency floors and physical invariants (size, bandwidth,
latency and placement monotonicity; bus bandwidth never above what the links can carry)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.perf import OPS, bus_factor, estimate, sweep
from suanli.topology import Cluster, load_preset
from tests.clusters import homogeneous_cluster

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


_cluster = homogeneous_cluster


def _node_gpus(cluster: Cluster, nodes: list[int] | range, per_node: int | None = None) -> np.ndarray:
    return np.concatenate([np.asarray(cluster.gpus_of_node(n))[:per_node] for n in nodes])


def _domain_nic_GBps(cluster: Cluster, gpus: np.ndarray) -> dict[int, float]:
    """Line-rate scale-out bandwidth (GB/s, one direction) each touched NVLink domain can use for these ranks.

    A rank drives the NICs of its own node: on rail-optimised boards (one NIC or more per GPU) its own share,
    on boards with fewer NICs than GPUs any NIC of the node, but never more NICs than the node has.
    """
    nodes, per_node = np.unique(cluster.gpu_node[gpus], return_counts=True)
    out: dict[int, float] = {}
    for node, ranks in zip(nodes.tolist(), per_node.tolist(), strict=True):
        g = cluster.group_of(node)
        per_gpu = max(1, math.ceil(g.nics / g.gpus_per_node))
        usable = min(g.nics, ranks * per_gpu)
        dom = int(cluster.node_domain[node])
        out[dom] = out.get(dom, 0.0) + usable * g.nic_Gbps / 8.0
    return out


# --- bus factors (nccl-tests doc/PERFORMANCE.md) -------------------------------------------------------

BUS_FACTORS = [
    ("all_reduce", 2, 1.0),
    ("all_reduce", 8, 1.75),
    ("all_reduce", 16, 1.875),
    ("all_reduce", 1024, 2 * 1023 / 1024),
    ("all_gather", 2, 0.5),
    ("all_gather", 8, 0.875),
    ("reduce_scatter", 8, 0.875),
    ("reduce_scatter", 64, 63 / 64),
    ("all_to_all", 8, 0.875),
    ("all_to_all", 16, 15 / 16),
    ("broadcast", 8, 1.0),
    ("broadcast", 128, 1.0),
    ("reduce", 8, 1.0),
    ("reduce", 3, 1.0),
    ("send_recv", 2, 1.0),
    ("send_recv", 16, 1.0),
    ("send_recv", 1, 1.0),
    ("all_reduce", 1, 0.0),
    ("all_gather", 1, 0.0),
]


@pytest.mark.parametrize(("op", "n", "factor"), BUS_FACTORS)
def test_bus_factor_table(op: str, n: int, factor: float) -> None:
    assert bus_factor(op, n) == pytest.approx(factor)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(OPS), n=st.integers(2, 100_000))
def test_bus_factor_formula(op: str, n: int) -> None:
    expected = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_to_all": (n - 1) / n,
    }.get(op, 1.0)
    assert bus_factor(op, n) == pytest.approx(expected)  # type: ignore[arg-type]


def test_busbw_is_algbw_times_bus_factor() -> None:
    g = _cluster(nodes=2).comm_group(range(16))
    for op in OPS:
        e = estimate(op, 64 * MiB, g)
        assert e.algbw_GBps == pytest.approx(64 * MiB / (e.time_us * 1e3))
        assert e.busbw_GBps == pytest.approx(e.algbw_GBps * bus_factor(op, 16))


# --- edge cases ----------------------------------------------------------------------------------------


def test_estimate_rejects_unknown_op_and_negative_size() -> None:
    g = _cluster(nodes=1, fabric=None).comm_group(range(8))
    with pytest.raises(ValueError, match="unknown collective"):
        estimate("all_shuffle", 1024, g)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size_bytes"):
        estimate("all_reduce", -1, g)


def test_zero_bytes_and_one_rank_cost_nothing() -> None:
    c = _cluster(nodes=1, fabric=None)
    assert estimate("all_reduce", 0, c.comm_group(range(8))).time_us == 0.0
    assert estimate("all_reduce", GiB, c.comm_group([3])).time_us == 0.0


def test_sweep_matches_estimate() -> None:
    g = _cluster(nodes=2).comm_group(range(16))
    sizes = [8, KiB, MiB, GiB]
    assert [e.time_us for e in sweep("all_gather", sizes, g)] == [estimate("all_gather", s, g).time_us for s in sizes]
    assert estimate("all_reduce", MiB, g).as_dict()["size_bytes"] == MiB


# --- small-message latency floors ------------------------------------------------------------------------


MULTI_NODE_SMALL = [
    ("2x8 H100 IB NDR", lambda: _cluster("H100-SXM", 2, fabric="ib-ndr")),
    ("16x8 H20 RoCE 400", lambda: _cluster("H20", 16, fabric="roce-400")),
    ("h20-roce800-128", lambda: load_preset("h20-roce800-128")),
    ("h20-eth25g-128", lambda: load_preset("h20-eth25g-128")),
    ("dgx-h100-superpod-su", lambda: load_preset("dgx-h100-superpod-su")),
]


@pytest.mark.parametrize(("label", "make"), MULTI_NODE_SMALL, ids=[m[0] for m in MULTI_NODE_SMALL])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_multi_node_small_message_floor(label: str, make, op: str) -> None:
    c = make()
    g = c.comm_group(range(c.n_gpus))
    assert g.domains > 1
    t = estimate(op, 8, g).time_us  # type: ignore[arg-type]
    assert t >= 10.0, f"{label}: 8 B {op} predicted {t:.2f} us; a multi-node collective cannot be this fast"
    assert t < 1000.0


@pytest.mark.parametrize(
    ("gpu", "gpn"),
    [("H100-SXM", 8), ("H20", 8), ("A100-SXM-80G", 8), ("B200", 8), ("H100-SXM", 4)],
)
def test_single_node_nvlink_small_all_reduce(gpu: str, gpn: int) -> None:
    g = _cluster(gpu, 1, gpn=gpn, fabric=None).comm_group(range(gpn))
    t = estimate("all_reduce", 8, g).time_us
    assert 5.0 <= t <= 40.0, t


# --- systems for the properties ----------------------------------------------------------------------

SYSTEMS: dict[str, Cluster] = {
    "1x8-h100": _cluster("H100-SXM", 1, fabric=None),
    "2x8-h100-ndr": _cluster("H100-SXM", 2),
    "4x8-a100-hdr": _cluster("A100-SXM-80G", 4, fabric="ib-hdr"),
    "h20-roce800-128": load_preset("h20-roce800-128"),
    "h20-eth25g-128": load_preset("h20-eth25g-128"),
    "rtx4090-box": load_preset("rtx4090-box"),
    "2x8-4090-eth25": _cluster("RTX-4090", 2, fabric="eth-25", nics=1),
    "gb300-nvl72": load_preset("gb300-nvl72"),
}

sizes = st.integers(0, 34).flatmap(lambda e: st.integers(max(1, (1 << e) - (1 << e) // 2), 1 << e))
ops = st.sampled_from(OPS)


@st.composite
def even_groups(draw: st.DrawFn) -> tuple[str, Cluster, np.ndarray]:
    """The same number of ranks on every node touched (how a job is normally laid out)."""
    name = draw(st.sampled_from(sorted(SYSTEMS)))
    c = SYSTEMS[name]
    gpn = c.groups[0].gpus_per_node
    k = draw(st.integers(1, c.n_nodes))
    nodes = sorted(draw(st.sets(st.integers(0, c.n_nodes - 1), min_size=k, max_size=k)))
    per_node = draw(st.integers(1, gpn))
    gpus = _node_gpus(c, nodes, per_node)
    if gpus.size < 2:
        gpus = _node_gpus(c, [0], 2)
    return name, c, gpus


@st.composite
def any_groups(draw: st.DrawFn) -> tuple[str, Cluster, np.ndarray]:
    """Any set of at least two GPUs, including uneven splits over nodes."""
    name = draw(st.sampled_from(["2x8-h100-ndr", "4x8-a100-hdr", "h20-roce800-128", "h20-eth25g-128"]))
    c = SYSTEMS[name]
    ids = draw(st.sets(st.integers(0, c.n_gpus - 1), min_size=2, max_size=c.n_gpus))
    return name, c, np.array(sorted(ids), dtype=np.int64)


@settings(max_examples=100, deadline=None)
@given(group=even_groups(), op=ops, a=sizes, b=sizes)
def test_time_is_monotone_in_size(group, op: str, a: int, b: int) -> None:
    _, c, gpus = group
    g = c.comm_group(gpus)
    lo, hi = sorted((a, b))
    t_lo = estimate(op, lo, g).time_us  # type: ignore[arg-type]
    t_hi = estimate(op, hi, g).time_us  # type: ignore[arg-type]
    assert t_lo <= t_hi * (1 + 1e-12), (lo, t_lo, hi, t_hi)
    if lo > 0:
        assert t_lo > 0


@settings(max_examples=100, deadline=None)
@given(group=even_groups(), op=ops, size=sizes)
def test_busbw_within_physical_ceiling(group, op: str, size: int) -> None:
    name, c, gpus = group
    g = c.comm_group(gpus)
    e = estimate(op, max(size, 1), g)  # type: ignore[arg-type]
    uni = g.intra_GBps
    if g.single_domain:
        if e.algorithm == "nvls":
            assert e.busbw_GBps <= 2 * uni, (name, e)
        else:
            assert e.busbw_GBps <= uni, (name, e)
        if op == "all_reduce":
            assert e.algbw_GBps <= uni, (name, e)  # every GPU must take in at least S bytes
    else:
        nic = min(_domain_nic_GBps(c, gpus).values())
        if e.algorithm in ("ring", "p2p"):
            assert e.busbw_GBps <= min(uni, nic) * (1 + 1e-9), (name, gpus.size, e, nic)
        if op == "all_reduce":
            # whatever the algorithm, each domain must receive the others' reduced data: S bytes
            assert e.algbw_GBps <= nic * (1 + 1e-9), (name, e, nic)


@settings(max_examples=100, deadline=None)
@given(group=any_groups(), size=st.integers(MiB, 16 * GiB))
def test_all_reduce_algbw_within_smallest_domain_nics(group, size: int) -> None:
    """Uneven placements: the domain with the fewest ranks (fewest usable NICs) bounds every algorithm."""
    name, c, gpus = group
    g = c.comm_group(gpus)
    e = estimate("all_reduce", size, g)
    if g.single_domain:
        return
    caps = _domain_nic_GBps(c, gpus)
    assert e.algbw_GBps <= min(caps.values()) * (1 + 1e-9), (
        f"{name}: ranks per domain {sorted(np.unique(c.node_domain[c.gpu_node[gpus]], return_counts=True)[1].tolist())}, "
        f"{e.algorithm}/{e.protocol} algbw {e.algbw_GBps:.1f} GB/s > smallest domain's NICs "
        f"{min(caps.values()):.1f} GB/s"
    )


def test_lone_rank_on_a_node_bounds_bandwidth() -> None:
    """8 ranks on node 0 and 1 on node 1: the lone rank has one 400G NIC (50 GB/s), so nothing crossing
    to it can run faster than the bytes it must receive allow: S for all-reduce and broadcast,
    (n-1)/n x S for all-gather (it already holds its own shard)."""
    c = _cluster("H100-SXM", 2)
    gpus = np.arange(9)
    g = c.comm_group(gpus)
    nic = min(_domain_nic_GBps(c, gpus).values())
    assert nic == pytest.approx(50.0)
    n = gpus.size
    for op, must_receive in (("all_reduce", 1.0), ("all_gather", (n - 1) / n), ("broadcast", 1.0)):
        e = estimate(op, GiB, g)  # type: ignore[arg-type]
        bound = nic / must_receive
        assert e.algbw_GBps <= bound, (
            f"{op}: {e.algorithm}/{e.protocol} algbw {e.algbw_GBps:.1f} GB/s > {bound:.1f} GB/s"
        )


# --- more bandwidth never slower, more latency never faster ------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("size", [8, 64 * KiB, 16 * MiB, GiB])
@pytest.mark.parametrize("nodes", [2, 16])
def test_ndr_never_slower_than_25g(op: str, size: int, nodes: int) -> None:
    fast = _cluster("H100-SXM", nodes, fabric="ib-ndr")
    slow = _cluster("H100-SXM", nodes, fabric="eth-25")
    gpus = np.arange(nodes * 8)
    t_fast = estimate(op, size, fast.comm_group(gpus)).time_us  # type: ignore[arg-type]
    t_slow = estimate(op, size, slow.comm_group(gpus)).time_us  # type: ignore[arg-type]
    assert t_fast <= t_slow
    if size >= 16 * MiB:
        assert t_fast < t_slow


RATES = [25, 50, 100, 200, 400, 800]


@settings(max_examples=80, deadline=None)
@given(
    kind=st.sampled_from(["roce", "infiniband", "ethernet", "efa"]),
    rates=st.lists(st.sampled_from(RATES), min_size=2, max_size=2, unique=True).map(sorted),
    nodes=st.integers(2, 8),
    per_node=st.sampled_from([1, 4, 8]),
    op=ops,
    size=sizes,
)
def test_faster_nic_never_slower(kind: str, rates: list[int], nodes: int, per_node: int, op: str, size: int) -> None:
    slow = _cluster("H100-SXM", nodes, fabric={"kind": kind, "nic_gbps": rates[0]})
    fast = _cluster("H100-SXM", nodes, fabric={"kind": kind, "nic_gbps": rates[1]})
    gpus = _node_gpus(slow, range(nodes), per_node)
    t_slow = estimate(op, size, slow.comm_group(gpus)).time_us  # type: ignore[arg-type]
    t_fast = estimate(op, size, fast.comm_group(gpus)).time_us  # type: ignore[arg-type]
    assert t_fast <= t_slow * (1 + 1e-12), (kind, rates, t_fast, t_slow)


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(["2x8-h100-ndr", "4x8-a100-hdr", "h20-roce800-128", "h20-eth25g-128", "2x8-4090-eth25"]),
    extra_nic=st.floats(0, 50),
    extra_hop=st.floats(0, 5),
    op=ops,
    size=sizes,
)
def test_more_latency_never_faster(name: str, extra_nic: float, extra_hop: float, op: str, size: int) -> None:
    c = SYSTEMS[name]
    assert c.fabric is not None
    fab = c.fabric.model_copy(
        update={
            "nic_latency_us": c.fabric.nic_latency_us + extra_nic,
            "switch_hop_latency_us": c.fabric.switch_hop_latency_us + extra_hop,
        }
    )
    slow = dataclasses.replace(c, fabric=fab)
    gpus = np.arange(c.n_gpus)
    t = estimate(op, size, c.comm_group(gpus)).time_us  # type: ignore[arg-type]
    t_slow = estimate(op, size, slow.comm_group(gpus)).time_us  # type: ignore[arg-type]
    assert t_slow >= t * (1 - 1e-12)
    if extra_nic > 0.1 and size > 0:
        assert t_slow > t


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "send_recv"])
def test_more_latency_on_an_otherwise_identical_fabric(op: str) -> None:
    """IB NDR and 400G RoCE have the same line rate and efficiency; RoCE's switch hops are slower."""
    ib = _cluster("H100-SXM", 4, fabric="ib-ndr")
    roce = _cluster("H100-SXM", 4, fabric="roce-400")
    gpus = np.arange(32)
    for size in (8, 4 * KiB, MiB, GiB):
        assert estimate(op, size, ib.comm_group(gpus)).time_us <= estimate(op, size, roce.comm_group(gpus)).time_us  # type: ignore[arg-type]


# --- placement sensitivity -------------------------------------------------------------------------------


def _leafy(fabric: str = "ib-ndr", **kw: object) -> Cluster:
    return _cluster("H100-SXM", 512, fabric=fabric, nodes_per_leaf=8, leaves_per_spine=8, **kw)


def test_compact_all_reduce_beats_scattered_over_oversubscribed_leaves() -> None:
    c = _leafy(leaf_oversubscription=2.0)
    compact = _node_gpus(c, range(8))  # 8 nodes under leaf 0
    nodes_8_leaves = _node_gpus(c, range(0, 64, 8))  # 8 whole nodes, one per leaf (one spine)
    one_per_node = _node_gpus(c, range(0, 512, 8), 1)  # 64 nodes, one GPU each, over 8 spines
    assert compact.size == nodes_8_leaves.size == one_per_node.size == 64
    t_compact = estimate("all_reduce", GiB, c.comm_group(compact)).time_us
    t_leaves = estimate("all_reduce", GiB, c.comm_group(nodes_8_leaves)).time_us
    t_spread = estimate("all_reduce", GiB, c.comm_group(one_per_node)).time_us
    assert t_compact < t_leaves < t_spread, (t_compact, t_leaves, t_spread)
    # and on 25GbE the compact set is slower still than on NDR
    eth = _leafy(fabric="eth-25", leaf_oversubscription=2.0)
    assert estimate("all_reduce", GiB, eth.comm_group(compact)).time_us > t_compact


def test_synthetic_100k_compact_beats_spread_over_spines() -> None:
    big = load_preset("synthetic-100k")
    per_spine = big.nodes_per_leaf * big.leaves_per_spine
    compact = big.compact_gpus(64)
    spread = _node_gpus(big, range(0, per_spine * 8, per_spine))  # 8 nodes, one per spine: 2:1 core
    assert big.comm_group(spread).inter.tier == "core"  # type: ignore[union-attr]
    assert (
        estimate("all_reduce", GiB, big.comm_group(compact)).time_us
        < estimate("all_reduce", GiB, big.comm_group(spread)).time_us
    )


def test_scattered_on_non_oversubscribed_fabric_only_pays_latency() -> None:
    c = _leafy()
    compact = _node_gpus(c, range(8))
    spread = _node_gpus(c, range(0, 64, 8))
    for size in (8, MiB):
        assert (
            estimate("all_reduce", size, c.comm_group(compact)).time_us
            < estimate("all_reduce", size, c.comm_group(spread)).time_us
        )


# --- a degenerate spec must not crash the model -------------------------------------------------------


def test_node_group_without_nics_is_rejected_or_costed() -> None:
    """`nics: 0` passes validation; then a multi-node collective must be either refused up front (SpecError
    naming nics) or costed (possibly as infinitely slow), never a ZeroDivisionError."""
    from suanli.topology import SpecError

    try:
        c = _cluster("H100-SXM", 2, nics=0)
    except SpecError as e:
        assert "nics" in str(e)
        return
    e = estimate("all_reduce", MiB, c.comm_group(range(16)))
    assert e.time_us > 0


def test_all_to_all_on_an_uneven_placement_is_bounded_by_one_nic_per_rank() -> None:
    """8 ranks on one node and 1 on another: each rank still has its own NIC, so it is not ~8x slower."""
    c = _cluster("H100-SXM", 2)
    even = estimate("all_to_all", GiB, c.comm_group(np.arange(16))).time_us
    uneven = estimate("all_to_all", GiB, c.comm_group(np.arange(9))).time_us
    assert uneven <= 2 * even


@pytest.mark.parametrize(
    ("fabric", "nics", "algorithms"),
    [("tcpx-200", 4, {"ring"}), ("tcpxo-200", 8, {"ring", "tree"})],
)
@pytest.mark.parametrize("size", [8, 1 << 20, 8 << 20, 32 << 20, 1 << 30])
def test_gpudirect_tcpx_runs_only_what_its_plugin_supports(fabric: str, nics: int, algorithms: set, size: int) -> None:
    """GCP's TCPX/TCPXO plugins are deployed with NCCL_PROTO=Simple, NCCL_NVLS_ENABLE=0 and NCCL_ALGO=Ring (A3
    High) or Ring,Tree (A3 Mega), process-wide: no LL, LL128 or NVLS, across nodes or inside one."""
    c = homogeneous_cluster("H100-SXM", 2, 8, fabric, nics=nics)
    for gpus in (c.compact_gpus(16), c.compact_gpus(8)):
        e = estimate("all_reduce", size, c.comm_group(gpus))
        assert e.protocol == "Simple"
        assert e.algorithm in algorithms
    assert fabric in ("tcpx-200", "tcpxo-200")


def test_a3_mega_mid_size_all_reduce_is_not_the_ib_answer() -> None:
    """The cause of the old +100-160% error at 1-32 MiB on 2x A3 Mega: the model ran LL and NVLS-tree, which the
    TCPXO plugin does not allow. 8 MiB is now within 2x of the published 27.5 GB/s; the same nodes on IB NDR
    (LL/LL128/NVLS allowed) are faster at every mid size."""
    mega = homogeneous_cluster("H100-SXM", 2, 8, "tcpxo-200")
    ib = homogeneous_cluster("H100-SXM", 2, 8, {"kind": "infiniband", "nic_gbps": 200})
    bus = estimate("all_reduce", 8 << 20, mega.comm_group(mega.compact_gpus(16))).busbw_GBps
    assert bus < 2 * 27.5
    for size in (1 << 20, 8 << 20, 32 << 20):
        a = estimate("all_reduce", size, mega.comm_group(mega.compact_gpus(16)))
        b = estimate("all_reduce", size, ib.comm_group(ib.compact_gpus(16)))
        assert b.time_us < a.time_us
