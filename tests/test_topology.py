"""Cluster topology: presets, the NxG shorthand, span / tier_links / comm_group queries and spec errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.topology import PRESETS, TIERS, Cluster, SpecError, load_preset, parse, preset_names
from tests.clusters import homogeneous_cluster

# --- helpers -----------------------------------------------------------------------------------------


_cluster = homogeneous_cluster


def _node_gpus(cluster: Cluster, nodes: list[int] | range) -> np.ndarray:
    return np.concatenate([np.asarray(cluster.gpus_of_node(n)) for n in nodes])


@pytest.fixture(scope="module")
def big() -> Cluster:
    return load_preset("synthetic-100k")


# --- presets -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_loads(name: str) -> None:
    c = load_preset(name)
    assert c.name == name
    assert c.n_gpus > 0
    assert c.n_nodes == sum(g.count for g in c.groups)
    assert name in preset_names()


# (preset, GPUs, nodes)
PRESET_SIZES = [
    ("rtx4090-box", 8, 1),
    ("h20-roce800-128", 128, 16),
    ("h20-eth25g-128", 128, 16),
    ("dgx-h100-superpod-su", 256, 32),
    ("gb300-nvl72", 72, 18),
]


@pytest.mark.parametrize(("name", "gpus", "nodes"), PRESET_SIZES)
def test_preset_sizes(name: str, gpus: int, nodes: int) -> None:
    c = load_preset(name)
    assert c.n_gpus == gpus
    assert c.n_nodes == nodes


def test_rtx4090_box_is_one_pcie_node_without_nvlink_domain() -> None:
    c = load_preset("rtx4090-box")
    (g,) = c.groups
    assert g.intra.kind == "pcie"
    assert not g.has_nvlink_domain
    span = c.span(range(c.n_gpus))
    assert span == {"nvlink": 1, "node": 1, "leaf": 1, "spine": 1, "core": 1}
    group = c.comm_group(range(c.n_gpus))
    assert group.intra_kind == "pcie"
    assert not group.nvls
    assert group.single_domain
    assert group.inter is None


@pytest.mark.parametrize("name", ["h20-roce800-128", "h20-eth25g-128", "dgx-h100-superpod-su"])
def test_hgx_presets_have_one_nvlink_domain_per_node(name: str) -> None:
    c = load_preset(name)
    span = c.span(range(c.n_gpus))
    assert span["nvlink"] == span["node"] == c.n_nodes
    assert np.array_equal(c.node_domain, np.arange(c.n_nodes))


def test_gb300_nvl72_is_one_nvlink_domain_of_18_trays() -> None:
    c = load_preset("gb300-nvl72")
    span = c.span(range(c.n_gpus))
    assert span["nvlink"] == 1
    assert span["node"] == 18
    group = c.comm_group(range(c.n_gpus))
    assert group.single_domain
    assert group.ranks_per_domain == 72
    assert group.inter is None
    assert group.intra_kind == "nvlink"
    # GPUs on different trays still talk over NVLink, not the scale-out fabric
    far = c.comm_group([0, c.n_gpus - 1])
    assert far.nodes == 2
    assert far.single_domain
    assert far.inter is None


def test_synthetic_100k_preset_size(big: Cluster) -> None:
    assert big.n_gpus >= 100_000
    assert big.n_nodes >= 12_500
    assert big.n_leaves >= 12_500 // 32
    assert big.n_spines > 1


def test_shorthand_nodes_by_gpus_with_model() -> None:
    c = load_preset("312x8:V100")
    assert c.n_gpus == 2496
    assert c.n_nodes == 312
    assert c.nodes_per_leaf == 32
    assert {g.gpu.name for g in c.groups} == {"V100"}
    assert c.n_leaves == 10  # ceil(312 / 32)


def test_shorthand_defaults_to_h100() -> None:
    c = load_preset("4x8")
    assert c.n_gpus == 32
    assert c.groups[0].gpu.name == "H100-SXM"
    assert c.fabric is not None


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(SpecError) as err:
        load_preset("no-such-cluster")
    assert "dgx-h100-superpod-su" in str(err.value)


# --- span / tier_links / comm_group --------------------------------------------------------------------


def test_span_inside_one_node(big: Cluster) -> None:
    span = big.span([0, 1, 5, 7])
    assert span == {"nvlink": 1, "node": 1, "leaf": 1, "spine": 1, "core": 1}


def test_span_of_empty_set_is_zero(big: Cluster) -> None:
    assert big.span([]) == dict.fromkeys(TIERS, 0)


def test_span_out_of_range_raises(big: Cluster) -> None:
    with pytest.raises(ValueError):
        big.span([big.n_gpus])
    with pytest.raises(ValueError):
        big.span([-1])


def test_span_across_two_leaves(big: Cluster) -> None:
    a = big.gpus_of_node(0)[0]
    b = big.gpus_of_node(big.nodes_per_leaf)[0]  # first node of the second leaf
    span = big.span([a, b])
    assert span["leaf"] == 2
    assert span["node"] == 2
    assert span["spine"] == 1


def test_span_across_two_spines(big: Cluster) -> None:
    per_spine = big.nodes_per_leaf * big.leaves_per_spine
    span = big.span([0, big.gpus_of_node(per_spine)[0]])
    assert span["spine"] == 2
    assert span["leaf"] == 2


def test_compact_vs_scattered_comm_group(big: Cluster) -> None:
    n_nodes = 16
    compact = big.compact_gpus(n_nodes * 8)
    stride = big.nodes_per_leaf * big.leaves_per_spine  # one node per spine
    scattered = _node_gpus(big, range(0, stride * n_nodes, stride))
    assert scattered.size == compact.size
    cg, sg = big.comm_group(compact), big.comm_group(scattered)
    assert cg.inter is not None and sg.inter is not None
    assert cg.inter.tier == "leaf"
    assert sg.inter.tier in ("spine", "core")
    assert sg.inter.uni_GBps_per_gpu <= cg.inter.uni_GBps_per_gpu
    assert sg.inter.latency_us > cg.inter.latency_us
    assert cg.ranks == sg.ranks == 128
    assert cg.domains == sg.domains == n_nodes


def test_compact_gpus_are_whole_nodes_in_order(big: Cluster) -> None:
    gpus = big.compact_gpus(20)
    assert np.array_equal(gpus, np.arange(20))
    assert big.span(gpus)["node"] == 3
    with pytest.raises(ValueError):
        load_preset("rtx4090-box").compact_gpus(9)


def test_single_domain_comm_group_has_no_inter_tier() -> None:
    c = load_preset("dgx-h100-superpod-su")
    g = c.comm_group(range(8))
    assert g.single_domain
    assert g.inter is None
    assert g.intra_kind == "nvlink"
    assert g.nvls
    assert g.intra_GBps == 450.0
    with pytest.raises(ValueError):
        c.comm_group([])


OVERSUBSCRIBED = [
    ("synthetic-100k", {}),
    (
        "custom-2:1-leaf-4:1-spine",
        {"nodes_per_leaf": 4, "leaves_per_spine": 4, "leaf_oversubscription": 2.0, "spine_oversubscription": 4.0},
    ),
    ("custom-3:1-leaf", {"nodes_per_leaf": 2, "leaves_per_spine": 2, "leaf_oversubscription": 3.0}),
]


@pytest.mark.parametrize(("name", "kw"), OVERSUBSCRIBED, ids=[o[0] for o in OVERSUBSCRIBED])
def test_tier_bandwidth_never_increases_going_up(name: str, kw: dict) -> None:
    c = load_preset(name) if name in PRESETS else _cluster(nodes=64, **kw)
    assert c.leaf_oversubscription * c.spine_oversubscription > 1
    per_spine = c.nodes_per_leaf * c.leaves_per_spine
    nodes = [0, 1, c.nodes_per_leaf, per_spine, per_spine + c.nodes_per_leaf]
    links = c.tier_links(_node_gpus(c, nodes))
    assert set(links) == {"nvlink", "leaf", "spine", "core"}
    order = [t for t in ("leaf", "spine", "core") if t in links]
    bws = [links[t].uni_GBps_per_gpu for t in order]
    assert all(a >= b for a, b in itertools.pairwise(bws)), dict(zip(order, bws, strict=True))
    lats = [links[t].latency_us for t in order]
    assert all(a <= b for a, b in itertools.pairwise(lats))
    assert bws[0] / bws[-1] == pytest.approx(c.leaf_oversubscription * c.spine_oversubscription)


# --- spec errors ---------------------------------------------------------------------------------------


def test_unknown_gpu_lists_known_gpus() -> None:
    with pytest.raises(SpecError) as err:
        _cluster(gpu="H9000")
    msg = str(err.value)
    assert "H9000" in msg
    assert "H100-SXM" in msg
    assert "RTX-4090" in msg


def test_multi_node_without_fabric() -> None:
    with pytest.raises(SpecError, match="fabric"):
        _cluster(nodes=2, fabric=None)


def test_single_node_needs_no_fabric() -> None:
    c = _cluster(nodes=1, fabric=None)
    assert c.fabric is None
    assert c.n_gpus == 8


def test_unknown_field_is_named() -> None:
    spec = {
        "name": "t",
        "node_groups": [{"name": "n", "count": 2, "gpu": "H100", "gpus_per_node": 8, "gpu_colour": "green"}],
        "fabric": "ib-ndr",
    }
    with pytest.raises(SpecError, match="gpu_colour"):
        parse(spec)
    with pytest.raises(SpecError, match="topology_hint"):
        parse({**spec, "node_groups": spec["node_groups"][:1], "topology_hint": 3})


def test_negative_count_names_count() -> None:
    with pytest.raises(SpecError, match="count"):
        _cluster(nodes=-4)


def test_unknown_fabric_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="fabric"):
        _cluster(fabric="carrier-pigeon")
    with pytest.raises(SpecError, match="fabric kind"):
        _cluster(fabric={"kind": "semaphore", "nic_gbps": 100})


@pytest.mark.parametrize(
    "text",
    [
        "name: t\nnode_groups: [ {name: n, count: 2\n",  # unbalanced flow mapping
        "name: t\n  bad: indent\n: :\n",
        "\tname: t",  # tab indentation
    ],
)
def test_invalid_yaml_is_a_spec_error(text: str) -> None:
    with pytest.raises(SpecError, match="not valid YAML"):
        parse(text)


@pytest.mark.parametrize("text", ["- a\n- b\n", "42", ""])
def test_yaml_that_is_not_a_mapping_is_a_spec_error(text: str) -> None:
    with pytest.raises(SpecError, match="mapping"):
        parse(text)


def test_yaml_text_parses_like_a_mapping() -> None:
    text = """
name: yaml-cluster
node_groups:
  - {name: a, count: 4, gpu: H100, gpus_per_node: 8, nics: 8}
fabric: ib-ndr
nodes_per_leaf: 2
"""
    c = parse(text)
    assert c.n_gpus == 32
    assert c.n_leaves == 2


def test_duplicate_group_names_rejected() -> None:
    g = {"name": "n", "count": 1, "gpu": "H100", "gpus_per_node": 8}
    with pytest.raises(SpecError, match="unique"):
        parse({"name": "t", "node_groups": [g, g], "fabric": "ib-ndr"})


# --- properties on a small cluster: 4 leaves x 2 nodes x 8 GPUs, 2 leaves per spine ---------------------

SMALL = _cluster(nodes=8, nodes_per_leaf=2, leaves_per_spine=2)
# the same shape with NVLink domains of two nodes (an NVL16-style rack) to make nvlink < node possible
SMALL_NVL = parse(
    {
        "name": "nvl16",
        "node_groups": [
            {"name": "t", "count": 8, "gpu": "GB300", "gpus_per_node": 8, "nics": 8, "nvlink_domain_nodes": 2}
        ],
        "fabric": "ib-xdr",
        "nodes_per_leaf": 2,
        "leaves_per_spine": 2,
    }
)

gpu_sets = st.sets(st.integers(0, SMALL.n_gpus - 1), min_size=1, max_size=SMALL.n_gpus)


def _check_span_order(span: dict[str, int], size: int) -> None:
    assert 1 <= span["nvlink"] <= span["node"] <= size
    assert 1 <= span["spine"] <= span["leaf"] <= span["node"]
    assert span["core"] == 1


@settings(max_examples=80, deadline=None)
@given(gpus=gpu_sets, extra=gpu_sets, nvl=st.booleans())
def test_span_order_and_monotone(gpus: set[int], extra: set[int], nvl: bool) -> None:
    c = SMALL_NVL if nvl else SMALL
    a = sorted(gpus)
    b = sorted(gpus | extra)
    sa, sb = c.span(a), c.span(b)
    _check_span_order(sa, len(a))
    _check_span_order(sb, len(b))
    if not nvl:
        assert sa["nvlink"] == sa["node"]  # HGX: one domain per node
    for tier in TIERS:
        assert sb[tier] >= sa[tier], tier
    # span does not depend on order or duplicates
    assert c.span(a[::-1] + a) == sa


@settings(max_examples=60, deadline=None)
@given(gpus=gpu_sets)
def test_comm_group_agrees_with_span(gpus: set[int]) -> None:
    ids = sorted(gpus)
    span = SMALL.span(ids)
    g = SMALL.comm_group(ids)
    assert g.ranks == len(ids)
    assert g.domains == span["nvlink"]
    assert g.nodes == span["node"]
    assert 1 <= g.ranks_per_domain <= 8
    assert (g.inter is None) == (span["nvlink"] == 1)
    if g.inter is not None:
        expected = "core" if span["spine"] > 1 else "spine" if span["leaf"] > 1 else "leaf"
        assert g.inter.tier == expected
