"""Typed records of hardware facts. Every figure in the data files carries a source."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8")
Quality = Literal["read", "read-third-party", "recalled", "derived"]
Arch = Literal["volta", "turing", "ampere", "ada", "hopper", "blackwell"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Source(_Frozen):
    """Where a figure comes from: a key into `sources.yaml` and how it was obtained."""

    ref: str
    quality: Quality
    note: str | None = None


class NVLinkSpec(_Frozen):
    gen: int
    links: int
    uni_GBps: float = Field(gt=0, description="per-GPU unidirectional NVLink bandwidth, 1e9 B/s")


class ThermalLimits(_Frozen):
    max_operating_C: float
    slowdown_C: float
    shutdown_C: float


class GPUSpec(_Frozen):
    """One GPU model. TFLOPS are dense (no 2:4 sparsity) tensor-core peaks."""

    name: str
    vendor_name: str
    aliases: tuple[str, ...] = ()
    arch: Arch
    sms: int = Field(ge=1, description="streaming multiprocessors: GEMM tiles run one wave per SM")
    sm_version: int
    form_factor: Literal["sxm", "pcie", "superchip"]
    tflops: dict[Precision, float | None]
    memory_GB: float = Field(gt=0)
    mem_bw_GBps: float = Field(gt=0)
    nvlink: NVLinkSpec | None
    nvlink_domain_size: int = Field(ge=1, description="GPUs sharing one NVSwitch domain (8 on HGX, 72 on NVL72)")
    pcie_gen: int
    mig_profiles: tuple[str, ...] = ()
    tdp_W: float
    thermal: ThermalLimits | None
    matmul_efficiency: dict[Precision, float] = Field(
        default_factory=dict, description="measured achievable matmul (MAMF) / dense peak, where known"
    )
    sources: dict[str, Source]

    def peak_tflops(self, precision: Precision) -> float:
        value = self.tflops.get(precision)
        if value is None:
            known = ", ".join(p for p, v in self.tflops.items() if v)
            raise ValueError(f"{self.name} has no {precision} tensor-core rate; supported: {known}")
        return value

    @property
    def mx_block_scaling(self) -> bool:
        """Tensor cores that apply OCP microscaling (MX) block scales inside the MMA: Blackwell (sm_100 and later).
        Hopper and Ada run FP8 GEMMs with per-tensor scales, or with block scales applied in software between
        MMAs (DeepSeek-V3's 1x128/128x128 recipe), never MXFP8."""
        return self.arch == "blackwell"

    @property
    def nvls_capable(self) -> bool:
        """NVLink SHARP (multimem) exists on NVSwitch-3 systems and later (Hopper SXM, Blackwell)."""
        return self.nvlink is not None and self.nvlink.gen >= 4 and self.nvlink_domain_size >= 4


class FabricSpec(_Frozen):
    """A scale-out network technology at one port rate."""

    name: str
    aliases: tuple[str, ...] = ()
    kind: Literal["ethernet", "roce", "infiniband", "efa", "tcpx", "tcpxo"]
    port_Gbps: float = Field(gt=0, description="line rate of one NIC port, Gb/s")
    rdma: bool
    nic_latency_us: float = Field(ge=0, description="one NIC traversal (send or receive side)")
    switch_hop_latency_us: float = Field(ge=0)
    efficiency: float = Field(gt=0, le=1, description="achievable NCCL bus bandwidth / line rate per NIC")
    in_network_reduction: bool = False
    # What NCCL may run on a cluster of this fabric: a vendor net plugin that supports only some algorithms
    # or protocols is deployed with NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE set process-wide (GCP's
    # GPUDirect-TCPX: Ring + Simple, no NVLS), so the restriction holds inside a node too.
    nccl_algorithms: tuple[Literal["ring", "tree"], ...] = ("ring", "tree")
    nccl_protocols: tuple[Literal["LL", "LL128", "Simple"], ...] = ("LL", "LL128", "Simple")
    nvls: bool = True
    sources: dict[str, Source]

    @property
    def port_GBps(self) -> float:
        return self.port_Gbps / 8.0


class IntraNodeLinkSpec(_Frozen):
    """GPU-to-GPU path inside a node or scale-up domain."""

    name: str
    aliases: tuple[str, ...] = ()
    kind: Literal["nvlink", "pcie"]
    uni_GBps: float = Field(gt=0)
    latency_us: float = Field(ge=0)
    sources: dict[str, Source]
