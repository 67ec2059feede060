"""The packaged hardware catalog: every name resolves, every figure is sourced, the figures are sane."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from suanli.catalog import (
    PRECISIONS,
    CatalogError,
    FabricSpec,
    GPUSpec,
    IntraNodeLinkSpec,
    all_fabrics,
    all_gpus,
    all_links,
    fabric,
    fabric_for,
    gpu,
    link,
    sources,
)

GPU_NAMES = [
    "H20",
    "H100-SXM",
    "H100-PCIe",
    "H200",
    "H800",
    "A100-SXM-80G",
    "A100-PCIe-40G",
    "A800",
    "RTX-4090",
    "L40S",
    "B200",
    "GB200",
    "B300",
    "GB300",
    "V100",
    "T4",
]

GPU_ALIASES = [
    ("h100", "H100-SXM"),
    ("H100-80G", "H100-SXM"),
    ("h100_80g", "H100-SXM"),
    ("  H100 80G ", "H100-SXM"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("4090", "RTX-4090"),
    ("rtx4090", "RTX-4090"),
    ("RTX 4090", "RTX-4090"),
    ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ("a100", "A100-SXM-80G"),
    ("A100", "A100-SXM-80G"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM-80G"),
    ("NVIDIA A100-PCIE-40GB", "A100-PCIe-40G"),
    ("h20", "H20"),
    ("NVIDIA H20", "H20"),
    ("h200", "H200"),
    ("NVIDIA H200", "H200"),
    ("h800", "H800"),
    ("NVIDIA H800", "H800"),
    ("a800", "A800"),
    ("l40s", "L40S"),
    ("NVIDIA L40S", "L40S"),
    ("b200", "B200"),
    ("b300", "B300"),
    ("NVIDIA B300 SXM6 AC", "B300"),
    ("gb200", "GB200"),
    ("gb300", "GB300"),
    ("v100", "V100"),
    ("Tesla V100-SXM2-32GB", "V100"),
    ("t4", "T4"),
    ("Tesla T4", "T4"),
    ("h100-pcie", "H100-PCIe"),
]

# (name, arch, sm_version, form_factor, nvlink gen or None, nvlink_domain_size)
GPU_TABLE = [
    ("H100-SXM", "hopper", 90, "sxm", 4, 8),
    ("H100-PCIe", "hopper", 90, "pcie", None, 1),
    ("H200", "hopper", 90, "sxm", 4, 8),
    ("H20", "hopper", 90, "sxm", 4, 8),
    ("H800", "hopper", 90, "sxm", 4, 8),
    ("A100-SXM-80G", "ampere", 80, "sxm", 3, 8),
    ("A100-PCIe-40G", "ampere", 80, "pcie", None, 1),
    ("A800", "ampere", 80, "sxm", 3, 8),
    ("RTX-4090", "ada", 89, "pcie", None, 1),
    ("L40S", "ada", 89, "pcie", None, 1),
    ("B200", "blackwell", 100, "sxm", 5, 8),
    ("GB200", "blackwell", 100, "superchip", 5, 72),
    ("B300", "blackwell", 103, "sxm", 5, 8),
    ("GB300", "blackwell", 103, "superchip", 5, 72),
    ("V100", "volta", 70, "sxm", 2, 8),
    ("T4", "turing", 75, "pcie", None, 1),
]

# (name, nvlink uni GB/s or None, links or None)
NVLINK_TABLE = [
    ("H100-SXM", 450, 18),
    ("H20", 450, 18),
    ("H800", 200, 8),
    ("A100-SXM-80G", 300, 12),
    ("A800", 200, None),
    ("B200", 900, 18),
    ("GB300", 900, 18),
    ("V100", 150, 6),
    ("RTX-4090", None, None),
    ("A100-PCIe-40G", None, None),
]

# Precisions that have no tensor-core rate on the part.
NO_RATE = [
    ("A100-SXM-80G", "fp8"),
    ("A100-PCIe-40G", "fp8"),
    ("A800", "fp8"),
    ("V100", "fp8"),
    ("V100", "bf16"),
    ("V100", "tf32"),
    ("T4", "fp8"),
    ("T4", "bf16"),
    ("T4", "tf32"),
]


def _all_records() -> list[GPUSpec | FabricSpec | IntraNodeLinkSpec]:
    return [*all_gpus(), *all_fabrics(), *all_links()]


# --- name resolution -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GPU_NAMES)
def test_every_listed_gpu_resolves_by_its_name(name: str) -> None:
    assert gpu(name).name == name


def test_catalog_holds_exactly_the_listed_gpus() -> None:
    assert sorted(g.name for g in all_gpus()) == sorted(GPU_NAMES)


@pytest.mark.parametrize(("alias", "expected"), GPU_ALIASES)
def test_gpu_alias_resolves(alias: str, expected: str) -> None:
    assert gpu(alias).name == expected


@pytest.mark.parametrize("name", ["h100-sxm", "H100_SXM", "h100 sxm", "b200", "Rtx-4090"])
def test_lookup_is_case_and_separator_insensitive(name: str) -> None:
    assert gpu(name) is gpu(name.upper())


def test_unknown_gpu_raises_catalog_error_listing_known_names() -> None:
    with pytest.raises(CatalogError) as err:
        gpu("H9000")
    message = str(err.value)
    assert "H9000" in message
    assert "H100-SXM" in message
    assert "RTX-4090" in message


def test_catalog_error_is_a_lookup_error() -> None:
    with pytest.raises(LookupError):
        fabric("carrier-pigeon")
    with pytest.raises(CatalogError, match="nvlink4"):
        link("nvlink9")


def test_names_and_aliases_are_unique_across_each_table() -> None:
    def norm(s: str) -> str:
        return re.sub(r"[\s_]+", "-", s.strip().lower())

    for records in (all_gpus(), all_fabrics(), all_links()):
        owner: dict[str, str] = {}
        for item in records:
            for key in {norm(k) for k in (item.name, *item.aliases)}:
                assert key not in owner, f"{key!r} names both {owner[key]} and {item.name}"
                owner[key] = item.name


# --- provenance --------------------------------------------------------------------------------------


@pytest.mark.parametrize("record", _all_records(), ids=lambda r: r.name)
def test_every_source_ref_exists(record: GPUSpec | FabricSpec | IntraNodeLinkSpec) -> None:
    known = sources()
    assert record.sources, f"{record.name} has no sources"
    for group, src in record.sources.items():
        assert src.ref in known, f"{record.name}.{group} cites unknown source {src.ref!r}"


@pytest.mark.parametrize("record", _all_records(), ids=lambda r: r.name)
def test_derived_figures_say_how(record: GPUSpec | FabricSpec | IntraNodeLinkSpec) -> None:
    for group, src in record.sources.items():
        if src.quality == "derived":
            assert src.note, f"{record.name}.{group} is derived but gives no formula"


@pytest.mark.parametrize("g", all_gpus(), ids=lambda g: g.name)
def test_gpu_figure_groups_are_sourced(g: GPUSpec) -> None:
    for group in ("tflops", "memory", "mig_profiles", "tdp", "thermal"):
        assert group in g.sources, f"{g.name} has no {group} source"
    if g.matmul_efficiency:
        assert "matmul_efficiency" in g.sources


def test_sources_are_non_empty_citations() -> None:
    for key, citation in sources().items():
        assert isinstance(citation, str) and citation.strip(), key


# --- invariants on GPU figures ------------------------------------------------------------------------


@pytest.mark.parametrize("g", all_gpus(), ids=lambda g: g.name)
def test_gpu_figures_are_sane(g: GPUSpec) -> None:
    assert set(g.tflops) == set(PRECISIONS), f"{g.name} must list every precision (null where absent)"
    assert g.memory_GB > 0 and g.mem_bw_GBps > 0 and g.tdp_W > 0
    assert g.tflops["fp32"], f"{g.name} has no fp32 rate"
    assert g.tflops["fp16"], f"{g.name} has no fp16 tensor rate"
    for p, v in g.tflops.items():
        assert v is None or v > 0, f"{g.name} {p}"
    if g.tflops["bf16"] is not None:
        assert g.tflops["bf16"] >= g.tflops["fp32"]
        assert g.tflops["fp16"] == g.tflops["bf16"]
    if g.tflops["fp8"] is not None and g.tflops["bf16"] is not None:
        assert g.tflops["fp8"] >= g.tflops["bf16"]
    if g.tflops["fp4"] is not None:
        assert g.arch == "blackwell" and g.tflops["fp8"] is not None and g.tflops["fp4"] >= 2 * g.tflops["fp8"]
    if g.tflops["tf32"] is not None and g.tflops["bf16"] is not None:
        assert g.tflops["tf32"] <= g.tflops["bf16"]
    assert g.pcie_gen in (3, 4, 5, 6)
    assert g.sm_version // 10 in (7, 8, 9, 10)


@pytest.mark.parametrize("g", all_gpus(), ids=lambda g: g.name)
def test_matmul_efficiency_is_a_fraction(g: GPUSpec) -> None:
    for p, eff in g.matmul_efficiency.items():
        assert 0 < eff <= 1, f"{g.name} {p} efficiency {eff}"
        assert g.tflops[p], f"{g.name} has efficiency for {p} but no peak"
    if "bf16" in g.matmul_efficiency:
        assert g.matmul_efficiency.get("fp16") == g.matmul_efficiency["bf16"]


@pytest.mark.parametrize("g", [g for g in all_gpus() if g.thermal], ids=lambda g: g.name)
def test_thermal_limits_are_ordered(g: GPUSpec) -> None:
    t = g.thermal
    assert t is not None
    assert 60 < t.max_operating_C <= t.slowdown_C < t.shutdown_C < 110


@pytest.mark.parametrize(("name", "arch", "sm", "form", "nvlink_gen", "domain"), GPU_TABLE)
def test_gpu_table(name: str, arch: str, sm: int, form: str, nvlink_gen: int | None, domain: int) -> None:
    g = gpu(name)
    assert (g.arch, g.sm_version, g.form_factor, g.nvlink_domain_size) == (arch, sm, form, domain)
    assert (g.nvlink.gen if g.nvlink else None) == nvlink_gen
    if g.nvlink is None:
        assert g.nvlink_domain_size == 1


@pytest.mark.parametrize(("name", "uni", "links"), NVLINK_TABLE)
def test_nvlink_figures(name: str, uni: float | None, links: int | None) -> None:
    nv = gpu(name).nvlink
    if uni is None:
        assert nv is None
        return
    assert nv is not None and nv.uni_GBps == uni
    if links is not None:
        assert nv.links == links


@pytest.mark.parametrize(("name", "precision"), NO_RATE)
def test_missing_tensor_rate_raises(name: str, precision: str) -> None:
    g = gpu(name)
    assert g.tflops[precision] is None
    with pytest.raises(ValueError, match=precision):
        g.peak_tflops(precision)  # type: ignore[arg-type]


def test_known_peaks() -> None:
    assert gpu("h100").peak_tflops("bf16") == 989.0
    assert gpu("a100").peak_tflops("int8") == 624.0
    assert gpu("h20").peak_tflops("fp8") == 296.0
    assert gpu("t4").peak_tflops("int8") == 130.0
    assert gpu("v100").peak_tflops("fp16") == 125.0
    for name in ("H100-SXM", "H100-PCIe", "H200", "H20", "H800", "L40S"):
        g = gpu(name)
        assert g.tflops["int8"] == g.tflops["fp8"], name


def test_mig_profiles() -> None:
    assert gpu("A100-PCIe-40G").mig_profiles[-1] == "7g.40gb"
    assert gpu("a100").mig_profiles[-1] == "7g.80gb"
    assert gpu("h200").mig_profiles[-1] == "7g.141gb"
    for name in ("RTX-4090", "L40S", "V100", "T4"):
        assert gpu(name).mig_profiles == (), name


def test_nvls_capability_follows_nvswitch_generation() -> None:
    assert gpu("h100").nvls_capable
    assert gpu("gb200").nvls_capable
    assert not gpu("a100").nvls_capable
    assert not gpu("v100").nvls_capable
    assert not gpu("4090").nvls_capable


def test_records_are_frozen() -> None:
    with pytest.raises(ValidationError):
        gpu("h100").memory_GB = 1  # type: ignore[misc]


# --- fabrics ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "gbps", "expected"),
    [
        ("infiniband", 400, "ib-ndr"),
        ("ib", 200, "ib-hdr"),
        ("IB", 800, "ib-xdr"),
        ("roce", 800, "roce-800"),
        ("rocev2", 400, "roce-400"),
        ("ethernet", 25, "eth-25"),
        ("tcp", 100, "eth-100"),
        ("efa", 100, "efa-100"),
        ("efa", 400, "efa-400"),
        ("tcpx", 200, "tcpx-200"),
        ("tcpxo", 200, "tcpxo-200"),
    ],
)
def test_fabric_for_exact_rate(kind: str, gbps: float, expected: str) -> None:
    f = fabric_for(kind, gbps)
    assert f.name == expected
    assert f is fabric(expected)


def test_fabric_for_falls_back_to_a_scaled_copy() -> None:
    f = fabric_for("efa", 3200)
    nearest = fabric("efa-400")
    assert f.port_Gbps == 3200
    assert f.port_GBps == 400
    assert f.kind == "efa"
    assert f.name != nearest.name and f.aliases == ()
    assert f.nic_latency_us == nearest.nic_latency_us
    assert f.efficiency == nearest.efficiency
    assert nearest.port_Gbps == 400  # the catalog entry itself is untouched


def test_fabric_for_unknown_kind() -> None:
    with pytest.raises(CatalogError, match="infiniband"):
        fabric_for("token-ring", 16)


@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ("25gbe", "eth-25"),
        ("eth25", "eth-25"),
        ("ethernet-25", "eth-25"),
        ("roce800", "roce-800"),
        ("roce-v2-800", "roce-800"),
        ("800g-roce", "roce-800"),
        ("ndr", "ib-ndr"),
        ("InfiniBand NDR", "ib-ndr"),
        ("ib400", "ib-ndr"),
        ("hdr", "ib-hdr"),
        ("xdr", "ib-xdr"),
        ("efa", "efa-100"),
        ("tcpx", "tcpx-200"),
        ("tcpxo", "tcpxo-200"),
        ("a3-mega", "tcpxo-200"),
    ],
)
def test_fabric_alias_resolves(alias: str, expected: str) -> None:
    assert fabric(alias).name == expected


@pytest.mark.parametrize("f", all_fabrics(), ids=lambda f: f.name)
def test_fabric_figures_are_sane(f: FabricSpec) -> None:
    assert 0 < f.efficiency <= 1
    assert f.port_GBps == f.port_Gbps / 8
    assert f.rdma == (f.kind in ("roce", "infiniband", "efa"))
    if f.rdma and f.kind != "efa":
        assert f.nic_latency_us < 1, "an RDMA NIC traversal is sub-microsecond"
    else:
        assert f.nic_latency_us >= 1


def test_in_network_reduction_on_ndr_and_xdr() -> None:
    assert fabric("ib-ndr").in_network_reduction
    assert fabric("ib-xdr").in_network_reduction
    assert not fabric("roce-400").in_network_reduction


# --- intra-node links ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected", "kind", "uni"),
    [
        ("nvlink4", "nvlink4", "nvlink", 450),
        ("nvlink-4", "nvlink4", "nvlink", 450),
        ("NVL4", "nvlink4", "nvlink", 450),
        ("nvl72", "nvl72", "nvlink", 900),
        ("nvlink5-nvl72", "nvl72", "nvlink", 900),
        ("nvlink5", "nvlink5", "nvlink", 900),
        ("nvlink3", "nvlink3", "nvlink", 300),
        ("nvlink2", "nvlink2", "nvlink", 150),
        ("h800-nvlink", "nvlink4-h800", "nvlink", 200),
        ("nvlink3-a800", "nvlink3-a800", "nvlink", 200),
        ("pcie4", "pcie4", "pcie", 31),
        ("pcie-gen4", "pcie4", "pcie", 31),
        ("PCIe Gen5", "pcie5", "pcie", 63),
        ("pcie6", "pcie6", "pcie", 121),
        ("pcie3", "pcie3", "pcie", 16),
    ],
)
def test_link_resolves(name: str, expected: str, kind: str, uni: float) -> None:
    x = link(name)
    assert (x.name, x.kind, x.uni_GBps) == (expected, kind, uni)


@pytest.mark.parametrize("x", all_links(), ids=lambda x: x.name)
def test_link_latency_is_nccl_constant_or_measured(x: IntraNodeLinkSpec) -> None:
    """NCCL's tuner constants (0.6 us NVLink, 1.0 us PCIe), unless a measurement says otherwise."""
    nccl = 0.6 if x.kind == "nvlink" else 1.0
    assert x.latency_us == nccl or (x.sources["latency"].quality in ("read", "derived") and 0 < x.latency_us < 5)


def test_older_nvlink_is_not_faster_per_hop() -> None:
    assert link("nvlink3").latency_us >= link("nvlink4").latency_us >= link("nvlink5").latency_us


def test_gpu_nvlink_matches_a_catalog_link() -> None:
    nvlink_rates = {x.uni_GBps for x in all_links() if x.kind == "nvlink"}
    for g in all_gpus():
        if g.nvlink is not None:
            assert g.nvlink.uni_GBps in nvlink_rates, g.name
