"""Analytic cost model of NCCL collectives on a set of GPUs.

For every (algorithm, protocol) pair NCCL could use, the model computes a latency floor and a
bottleneck bandwidth from the hardware (link rates from the catalog, NCCL's own latency constants from
its tuner, `src/graph/tuning.cc`), then picks the fastest pair, as NCCL's tuner does. Transfer time
follows two physical regimes:

* LL/LL128 protocols move data in flag-tagged lines with no chunk pipeline: `t = latency + bytes / bw`.
* The Simple protocol moves chunks through a pipeline of stages with total stage latency `L`; with the
  chunk size chosen optimally the classic pipelined-transfer optimum is
  `t = base + (sqrt(bytes/bw) + sqrt(L))^2 = base + L + bytes/bw + 2*sqrt(L*bytes/bw)`, so bandwidth ramps
  up with size instead of jumping to peak. The fill term stops growing once chunks reach NCCL's buffer
  size (`PIPELINE_SATURATION_BYTES`).

Reported numbers follow nccl-tests: algbw = S / t, busbw = algbw x the operation's bus factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from suanli.topology.model import CommGroup

Op = Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send_recv"]
OPS: tuple[Op, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "send_recv",
)

# NCCL tuner constants (NCCL 2.30, src/graph/tuning.cc), in microseconds. Order: LL, LL128, Simple.
PROTOCOLS = ("LL", "LL128", "Simple")
BASE_LAT = {
    "ring": (6.6, 14.0, 8.4),
    "tree": (6.8, 14.0, 8.4),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
}
HW_LAT = {
    "nvlink": {
        "ring": (0.6, 1.9, 3.4),
        "tree": (0.6, 1.25, 4.0),
        "nvls": (None, None, 25.0),
        "nvls_tree": (None, None, 25.0),
    },
    "pcie": {"ring": (1.0, 2.5, 5.7), "tree": (1.0, 1.9, 4.0)},
    "net": {
        "ring": (2.7, 4.0, 14.0),
        "tree": (5.0, 8.5, 14.0),
        "nvls": (None, None, 18.0),
        "nvls_tree": (None, None, 20.9),
    },
}
NET_OVERHEAD_US = 1.0  # per network step on x86 hosts; x3 with the Simple protocol (tuning.cc)
# NCCL's per-channel LL128 bandwidth caps (tuning.cc, ring LL128) and the channels it gets: assumed one
# channel per two NVLinks (A100: 12 links → 6 channels → LL128 saturates near 120 GB/s busbw).
LL128_PER_CHANNEL = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
LL_MAX_BUSBW = {
    "volta": 40.0,
    "turing": 40.0,
    "ampere": 87.7,
    "ada": 87.7,
    "hopper": 141.0,
    "blackwell": 282.0,
}

# Protocol efficiency on top of a link's effective bandwidth: LL carries 8 bytes of data per 16-byte
# line, LL128 120 of 128 bytes; NCCL applies 0.92 to LL128 on top (tuning.cc).
PROTO_BW = {"LL": 0.5, "LL128": 0.92 * 120 / 128, "Simple": 1.0}

# Achievable fraction of a link's unidirectional line rate as NCCL ring busbw. NVLink: NCCL maintainers
# quote ~370 GB/s effective of 450 GB/s line rate on NVLink 4 (nccl-tests#212); PCIe peer traffic pays
# TLP headers and flow control: ~80% of line rate (NCCL's PCI constant, 12 GB/s on a 16 GB/s Gen3 x16).
LINK_EFFICIENCY = {"nvlink": 0.82, "pcie": 0.75}
# NVLink SHARP: the switch reduces; every GPU moves S in and S out at the switch's multimem rate, a
# fraction of the NVLink line rate: ~480 GB/s busbw = 274 GB/s algbw of 450 on Hopper (nccl-tests#212,
# sjeaugey), 838 GB/s busbw = 479 algbw of 900 on an 8x B200 board (ml-engineering, SHARP section).
NVLS_EFFICIENCY = {"hopper": 0.61, "blackwell": 0.53}
SIMPLE_STAGE_US = 3.4  # per-stage overhead of a Simple-protocol pipeline on NVLink (hwLat NVLINK Ring Simple)
# Once NCCL's Simple chunks reach their full buffer size (4 MiB per channel, 8 steps in flight), larger
# messages just add chunks: the pipeline fill stops growing. Fill is modelled up to this much data.
PIPELINE_SATURATION_BYTES = 32 << 20
MIN_NVLS_RANKS = {"hopper": 5, "blackwell": 6}  # NVLS beats ring only from this many GPUs (mle NVLS ramp)


@dataclass(frozen=True)
class CollectiveEstimate:
    op: Op
    size_bytes: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    algorithm: str
    protocol: str

    def as_dict(self) -> dict[str, object]:
        return {
            "size_bytes": self.size_bytes,
            "time_us": round(self.time_us, 3),
            "algbw_GBps": round(self.algbw_GBps, 3),
            "busbw_GBps": round(self.busbw_GBps, 3),
            "algorithm": self.algorithm,
            "protocol": self.protocol,
        }


def bus_factor(op: Op, n: int) -> float:
    """nccl-tests' busbw / algbw for an operation on n ranks (doc/PERFORMANCE.md)."""
    if n <= 1:
        return 0.0 if op != "send_recv" else 1.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class _Candidate:
    algorithm: str
    protocol: str
    latency_us: float
    bw_GBps: float  # bytes of the user buffer per microsecond... expressed as algbw ceiling in GB/s
    pipeline_us: float  # Simple-protocol pipeline overhead (0 for LL/LL128)


def _split(algorithm: str, proto: str, base: float, total_lat: float, bw: float) -> _Candidate:
    """Simple-protocol step latencies become pipeline stages; LL/LL128 pay them once, up front."""
    if proto == "Simple":
        return _Candidate(algorithm, proto, base, bw, total_lat - base)
    return _Candidate(algorithm, proto, total_lat, bw, 0.0)


def _intra_hop(g: CommGroup, link: str, algorithm: str, proto: int) -> float:
    """Per-hop latency inside a domain. LL uses the link's measured hop latency from the catalog (NVLink 3
    systems measure ~1.9 us, three times NCCL's generic 0.6); LL128 and Simple keep NCCL's constants."""
    if proto == 0:
        return g.intra_latency_us
    hw = HW_LAT[link][algorithm][proto]
    assert hw is not None
    return hw


def _intra_bw(g: CommGroup) -> float:
    return g.intra_GBps * LINK_EFFICIENCY["nvlink" if g.intra_kind == "nvlink" else "pcie"]


def _inter_node_bw(g: CommGroup) -> float:
    """Achievable scale-out bandwidth of the weakest domain: a lone rank on a node has its NIC share only."""
    assert g.inter is not None and g.fabric is not None
    ranks = g.min_ranks_per_domain or g.ranks_per_domain
    return g.inter.uni_GBps_per_gpu * ranks * g.fabric.efficiency


def _rank_nic_bw(g: CommGroup) -> float:
    """One rank's share of its domain's NICs: what a single peer-to-peer stream can use."""
    assert g.inter is not None and g.fabric is not None
    return g.inter.uni_GBps_per_gpu * g.fabric.efficiency


def _net_lat(g: CommGroup, proto: int, algorithm: str) -> float:
    assert g.inter is not None
    table = HW_LAT["net"][algorithm]
    hw = table[proto]
    assert hw is not None
    overhead = NET_OVERHEAD_US * (3 if proto == 2 else 1)
    return max(hw, overhead) + g.inter.latency_us


def _protocols(g: CommGroup) -> list[tuple[int, str]]:
    """LL and LL128 rely on in-order delivery of flag-tagged lines; EFA's SRD transport reorders, so
    NCCL over EFA (aws-ofi-nccl) runs the Simple protocol only across nodes; over kernel TCP there is no
    GPUDirect path and NCCL leaves LL128 off. A fabric whose NCCL plugin supports only some protocols
    (GPUDirect-TCPX/TCPXO: Simple) is deployed with NCCL_PROTO set for the whole process, inside a node too."""
    allowed = g.fabric.nccl_protocols if g.fabric is not None else PROTOCOLS
    if g.domains > 1 and g.fabric is not None and g.fabric.kind == "efa":
        out = [(2, "Simple")]
    elif g.domains > 1 and g.fabric is not None and not g.fabric.rdma:
        out = [(0, "LL"), (2, "Simple")]  # NCCL enables LL128 across nodes only with GPUDirect RDMA
    else:
        out = list(enumerate(PROTOCOLS))
    return [(p, name) for p, name in out if name in allowed]


def _algorithm_ok(g: CommGroup, algorithm: str) -> bool:
    """NCCL_ALGO / NCCL_NVLS_ENABLE as the fabric's plugin requires them (TCPX: Ring only, no NVLS)."""
    if g.fabric is None:
        return True
    if algorithm in ("nvls", "nvls_tree"):
        return g.fabric.nvls
    return algorithm in g.fabric.nccl_algorithms


def _candidates(op: Op, g: CommGroup) -> list[_Candidate]:
    n, ppn, nd = g.ranks, g.ranks_per_domain, g.domains
    link = "nvlink" if g.intra_kind == "nvlink" else "pcie"
    arch = g.gpu.arch
    ll_max = LL_MAX_BUSBW.get(arch, 87.7)
    bf = bus_factor(op, n)
    out: list[_Candidate] = []
    intra = _intra_bw(g)
    inter = _inter_node_bw(g) if nd > 1 else math.inf

    # ---- ring: every rank sends bf*S over its outgoing edge; edges crossing domains share the NICs --
    if op != "send_recv" and (_algorithm_ok(g, "ring") or op == "all_to_all"):
        # busbw ceiling: the slowest edge; inter-domain edges carry one ring's boundary traffic per NIC
        ring_bus = min(intra, inter) if nd > 1 else intra
        steps = {"all_reduce": 2 * (n - 1), "broadcast": n - 1, "reduce": n - 1}.get(op, n - 1)
        net_steps = {"all_reduce": 2 * (nd - 1)}.get(op, nd - 1) if nd > 1 else 0
        if op == "all_to_all":
            # all-to-all is n-1 parallel point-to-point exchanges; NCCL cannot stripe one peer's
            # traffic over several NICs, so a rank gets its own NIC share only. Only the share bound for
            # other domains crosses the NIC ((n - ppn) of the n-1 peers); the rest moves over NVLink at
            # the same time, so the bus rate (n-1 peers' data per unit time) is the NIC rate scaled up.
            steps, net_steps = 1, 1 if nd > 1 else 0
            if nd > 1:
                remote = (n - g.ranks_per_domain) / max(n - 1, 1)
                ring_bus = min(intra, _rank_nic_bw(g) / max(remote, 1e-9))
            else:
                ring_bus = intra
        for p, proto in _protocols(g):
            intra_lat = _intra_hop(g, link, "ring", p)
            lat = BASE_LAT["ring"][p] + (steps - net_steps) * intra_lat
            if net_steps:
                lat += net_steps * _net_lat(g, p, "ring")
            if nd > 1 and p == 2:
                lat *= 1.4  # ring Simple multi-node latency factor on sm80+ (tuning.cc)
            bus = ring_bus * PROTO_BW[proto]
            if proto == "LL":
                bus = min(bus, ll_max)
            if proto == "LL128" and g.gpu.nvlink is not None and arch in LL128_PER_CHANNEL:
                bus = min(bus, LL128_PER_CHANNEL[arch] * max(1, g.gpu.nvlink.links // 2))
            alg = bus / bf if bf > 0 else bus
            out.append(_split("ring", proto, BASE_LAT["ring"][p], lat, alg))

    # ---- tree (hierarchical: chain inside the domain, double binary tree across domains) --------
    if op in ("all_reduce", "broadcast", "reduce") and nd > 1 and _algorithm_ok(g, "tree"):
        # across domains each domain sends and receives 2(N-1)/N x S for all-reduce (N = domains),
        # instead of 2(n-1)/n x S (n = ranks) for ring: on 2 nodes, tree busbw can exceed the NICs.
        tree_factor = 2.0 * (nd - 1) / nd if op == "all_reduce" else 1.0
        alg_inter = inter / tree_factor
        # one NVSwitch/PCIe port per GPU carries both the reduce going up and the broadcast coming down
        # (NCCL's tuner applies the same 0.5 tree ratio)
        alg_intra = intra / 2 if op == "all_reduce" else intra
        for p, proto in _protocols(g):
            intra_lat = _intra_hop(g, link, "tree", p)
            depth = 2 if op == "all_reduce" else 1
            lat = BASE_LAT["tree"][p] + depth * ((ppn - 1) * intra_lat + math.log2(nd) * _net_lat(g, p, "tree"))
            alg = min(alg_inter, alg_intra) * PROTO_BW[proto]
            if proto == "LL":
                alg = min(alg, ll_max / max(bf, 1e-9))
            out.append(_split("tree", proto, BASE_LAT["tree"][p], lat, alg))

    # ---- NVLS: NVSwitch multimem reduce/broadcast, Simple protocol only --------------------------
    nvls_ok = (
        g.nvls
        and _algorithm_ok(g, "nvls")
        and op in ("all_reduce", "all_gather", "reduce_scatter")
        and ppn >= MIN_NVLS_RANKS.get(arch, 99)
    )
    if nvls_ok:
        eff = NVLS_EFFICIENCY.get(arch, 0.8)
        # each GPU moves S (all_reduce) or (n-1)/n S in and out through its NVLink ports
        per_gpu = g.intra_GBps * eff
        vol = {"all_reduce": 1.0}.get(op, (ppn - 1) / ppn)
        alg_nvls = per_gpu / vol
        if nd == 1:
            lat = HW_LAT["nvlink"]["nvls"][2] or 0.0
            out.append(_Candidate("nvls", "Simple", lat, alg_nvls, 2 * SIMPLE_STAGE_US))
        elif op == "all_reduce":
            tree_factor = 2.0 * (nd - 1) / nd
            alg = min(alg_nvls * 5 / 6, inter / tree_factor)  # NVLS-tree ratio 5/6 (tuning.cc)
            lat = (HW_LAT["nvlink"]["nvls_tree"][2] or 0.0) + 2 * math.log2(nd) * _net_lat(g, 2, "nvls_tree")
            out.append(
                _Candidate("nvls_tree", "Simple", lat, alg, (2 + 2 * math.ceil(math.log2(nd))) * SIMPLE_STAGE_US)
            )

    # ---- point-to-point -------------------------------------------------------------------------
    if op == "send_recv":
        for p, proto in _protocols(g):
            if nd > 1:
                lat = BASE_LAT["ring"][p] + _net_lat(g, p, "ring")
                bw = min(intra, _rank_nic_bw(g))
            else:
                lat = BASE_LAT["ring"][p] + (HW_LAT[link]["ring"][p] or 0.0)
                bw = intra
            bw *= PROTO_BW[proto]
            if proto == "LL":
                bw = min(bw, ll_max)
            out.append(_split("p2p", proto, BASE_LAT["ring"][p], lat, bw))
    return out


def _time_us(c: _Candidate, size_bytes: int) -> float:
    if c.bw_GBps <= 0.0:
        return math.inf  # e.g. nodes without NICs: this path cannot carry data
    transfer = size_bytes / (c.bw_GBps * 1e3)  # GB/s == 1e3 bytes/us
    if c.pipeline_us <= 0.0:
        return c.latency_us + transfer
    saturated = min(size_bytes, PIPELINE_SATURATION_BYTES) / (c.bw_GBps * 1e3)
    fill = 2.0 * math.sqrt(c.pipeline_us * saturated)
    return c.latency_us + c.pipeline_us + transfer + fill


def estimate(op: Op, size_bytes: int, group: CommGroup) -> CollectiveEstimate:
    """Predicted time, algbw and busbw of one collective of `size_bytes` (nccl-tests' size) on `group`."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    if size_bytes < 0:
        raise ValueError("size_bytes must be >= 0")
    n = group.ranks
    if n == 1 or size_bytes == 0:
        return CollectiveEstimate(op, size_bytes, 0.0, 0.0, 0.0, "none", "none")
    best: tuple[float, _Candidate] | None = None
    for cand in _candidates(op, group):
        t = _time_us(cand, size_bytes)
        if best is None or t < best[0]:
            best = (t, cand)
    assert best is not None
    t, cand = best
    if math.isinf(t):
        raise ValueError("no path between these GPUs: a node in the set has no scale-out NIC")
    alg = size_bytes / (t * 1e3)
    return CollectiveEstimate(op, size_bytes, t, alg, alg * bus_factor(op, n), cand.algorithm, cand.protocol)


def sweep(op: Op, sizes: list[int], group: CommGroup) -> list[CollectiveEstimate]:
    return [estimate(op, s, group) for s in sizes]
