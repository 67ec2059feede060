"""The training job, its parallel plan and the estimate: the types, the precisions, and which plans Megatron can
run (`validate`), apart from the step-time model that uses them (`training.py`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

from suanli.catalog import GPUSpec, Precision
from suanli.perf.models import TransformerArch
from suanli.topology.model import CommGroup

Recompute = Literal["none", "selective", "full"]
TrainPrecision = Literal["bf16", "fp16", "fp8", "fp8-blockwise", "mxfp8", "nvfp4", "fp32"]
TRAIN_PRECISIONS: tuple[TrainPrecision, ...] = ("bf16", "fp16", "fp8", "fp8-blockwise", "mxfp8", "nvfp4", "fp32")
# the tensor-core rate each training recipe's GEMMs run at: FP8 per-tensor (delayed/current scaling) and
# blockwise (DeepSeek-V3 style 1x128/128x128) and MXFP8 (32-element blocks, Blackwell) all run FP8 GEMMs;
# NVFP4 (16-element blocks) runs FP4 GEMMs on Blackwell
TENSOR_PRECISION: dict[str, Precision] = {"fp32": "tf32", "fp8-blockwise": "fp8", "mxfp8": "fp8", "nvfp4": "fp4"}
LOW_PRECISION = ("fp8", "fp8-blockwise", "mxfp8", "nvfp4")


def tensor_precision(precision: TrainPrecision) -> Precision:
    return TENSOR_PRECISION.get(precision, precision)  # type: ignore[return-value]


def precision_gap(gpu: GPUSpec, precision: TrainPrecision) -> str | None:
    """Why `gpu` cannot train at `precision` (its tensor cores have no such rate: NVFP4 before Blackwell; no MX
    block scaling: MXFP8 before Blackwell), or None."""
    prec = tensor_precision(precision)
    if precision == "mxfp8" and not gpu.mx_block_scaling:
        return (
            f"{gpu.name} has no mxfp8: MX block-scaled tensor cores need Blackwell ({gpu.name} is {gpu.arch}); "
            "use fp8 or fp8-blockwise"
        )
    if gpu.tflops.get(prec):
        return None
    known = ", ".join(p for p, v in gpu.tflops.items() if v)
    return f"{gpu.name} has no {prec} tensor-core rate (for {precision}); supported: {known}"


RECOMPUTE_MODULES = ("mla_up_proj", "layernorm", "mlp", "moe_act")  # the selective modules with a cost term
# Expert load imbalance: the busiest EP rank's (token, expert) rows / the mean. NVIDIA's published MoE
# benchmarks force-balance routing (Megatron-Bridge performance summary footnote), hence 1.0 by default;
# real runs with auxiliary-loss-free balancing sit above it and can say so (--moe-imbalance).
DEFAULT_MOE_IMBALANCE = 1.0


@dataclass(frozen=True)
class Plan:
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vp: int = 1
    mbs: int = 1
    zero: int = 1
    recompute: Recompute = "none"
    dp: int = 1
    ep: int = 1  # expert parallel: experts split over ep ranks (inside the tp*cp*dp ranks of a stage)
    etp: int = 1  # expert tensor parallel: each expert's FFN split over etp ranks
    # EP all-to-all overlap (Megatron `overlap_moe_expert_parallel_comm`, Bridge `moe_a2a_overlap`): one
    # micro-batch's dispatch/combine run beside another's compute (see `unpaired_fraction`)
    moe_a2a_overlap: bool = False
    # token dispatcher: "flex" (DeepEP / HybridEP: a token crosses the network once per destination NVLink domain)
    # or "alltoall" (Megatron's plain all-to-all dispatcher: once per (token, expert) pair)
    moe_dispatcher: Literal["flex", "alltoall"] = "flex"
    fp8_attention: bool = False  # flash attention in FP8 (TE `fp8_dot_product_attention`; FP8 recipes only)
    # selective recompute of named modules (Megatron `recompute_modules`; recompute must be "selective")
    recompute_modules: tuple[str, ...] = ()

    def label(self) -> str:
        moe = f" EP{self.ep} ETP{self.etp}" if self.ep > 1 or self.etp > 1 else ""
        moe += " A2A-overlap" if self.moe_a2a_overlap else ""
        moe += " alltoall-dispatch" if self.moe_dispatcher == "alltoall" and self.ep > 1 else ""
        moe += " FP8-attention" if self.fp8_attention else ""
        moe += f" recompute[{','.join(self.recompute_modules)}]" if self.recompute_modules else ""
        return (
            f"TP{self.tp} PP{self.pp} CP{self.cp} DP{self.dp}{moe} VP{self.vp} MBS{self.mbs} "
            f"ZeRO-{self.zero} recompute={self.recompute}"
        )


@dataclass(frozen=True)
class TrainJob:
    arch: TransformerArch
    precision: TrainPrecision = "bf16"
    seq_len: int = 4096
    global_batch: int = 256  # sequences per optimizer step
    moe_imbalance: float = DEFAULT_MOE_IMBALANCE  # busiest expert-parallel rank's load / the mean


@dataclass(frozen=True)
class TrainEstimate:
    plan: Plan
    fits: bool
    memory_bytes_per_gpu: float
    step_time_s: float
    tokens_per_s: float
    mfu: float
    tflops_per_gpu: float
    breakdown: dict[str, float] = field(default_factory=dict)
    memory_breakdown: dict[str, float] = field(default_factory=dict)
    notes: dict[str, object] = field(default_factory=dict)  # pipeline split option, expert imbalance

    def as_dict(self) -> dict[str, object]:
        plan = {k: v for k, v in asdict(self.plan).items()}
        return {
            **self.notes,
            "step_time_s": round(self.step_time_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "mfu": round(self.mfu, 4),
            "tflops_per_gpu": round(self.tflops_per_gpu, 1),
            "memory_gib_per_gpu": round(self.memory_bytes_per_gpu / 2**30, 2),
            "fits": self.fits,
            "plan": plan,
            "breakdown": {k: round(v, 4) for k, v in self.breakdown.items()},
            "memory_gib": {k: round(v / 2**30, 2) for k, v in self.memory_breakdown.items()},
        }


GroupFn = Callable[[int, int], CommGroup]
"""group(stride, size) → the CommGroup of `size` ranks spaced `stride` apart in placement order."""


class PlanError(ValueError):
    """A parallel plan that cannot be laid out on the GPUs (with the reason)."""


def validate(job: TrainJob, p: Plan, n_gpus: int) -> None:
    a = job.arch
    if min(p.tp, p.pp, p.cp, p.dp, p.vp, p.mbs, p.ep, p.etp) < 1:
        raise PlanError("tp, pp, cp, dp, vp, ep, etp and mbs must all be at least 1")
    if job.global_batch < 1 or job.seq_len < 1:
        raise PlanError("global batch and sequence length must be at least 1")
    if not 1.0 <= job.moe_imbalance <= 64.0:
        raise PlanError("moe imbalance must be between 1 (balanced) and 64")
    if p.tp * p.pp * p.cp * p.dp != n_gpus:
        raise PlanError(f"tp*pp*cp*dp = {p.tp * p.pp * p.cp * p.dp} != {n_gpus} GPUs")
    if job.global_batch % (p.dp * p.mbs):
        raise PlanError(f"global batch {job.global_batch} is not a multiple of dp*mbs = {p.dp * p.mbs}")
    if a.heads % p.tp or (a.kv_heads % p.tp and p.tp % a.kv_heads):
        raise PlanError(f"{a.heads} heads / {a.kv_heads} KV heads do not split over tp={p.tp}")
    if job.seq_len % (2 * p.cp) and p.cp > 1:
        raise PlanError(f"sequence length {job.seq_len} does not split into 2*cp = {2 * p.cp} chunks")
    if (p.ep > 1 or p.etp > 1) and not a.is_moe:
        raise PlanError(f"{a.name} has no experts: ep and etp must be 1")
    if a.is_moe:
        if a.experts % p.ep:
            raise PlanError(f"{a.experts} experts do not split over ep={p.ep}")
        if (p.tp * p.cp * p.dp) % (p.ep * p.etp):
            raise PlanError(
                f"ep*etp = {p.ep * p.etp} must divide tp*cp*dp = {p.tp * p.cp * p.dp} (the ranks of a stage)"
            )
        if a.moe_ffn % p.etp:
            raise PlanError(f"expert FFN {a.moe_ffn} does not split over etp={p.etp}")
    if p.moe_dispatcher not in ("flex", "alltoall"):
        raise PlanError(f"moe dispatcher must be flex or alltoall, not {p.moe_dispatcher!r}")
    if p.recompute_modules and p.recompute != "selective":
        raise PlanError("recompute modules need recompute=selective")
    unknown = set(p.recompute_modules) - set(RECOMPUTE_MODULES)
    if unknown:
        raise PlanError(f"unknown recompute modules {sorted(unknown)}; known: {', '.join(RECOMPUTE_MODULES)}")
    if p.fp8_attention and job.precision not in LOW_PRECISION:
        raise PlanError(f"fp8 attention needs a low-precision recipe (fp8, mxfp8, …), not {job.precision}")
    if p.moe_a2a_overlap and p.recompute == "full":
        raise PlanError("EP all-to-all overlap (moe_a2a_overlap) does not run with full recompute: use selective")
    if p.moe_a2a_overlap and p.pp > 1 and p.vp == 1:
        raise PlanError("EP all-to-all overlap (moe_a2a_overlap) needs virtual pipeline stages (vp > 1) when pp > 1")
    m = job.global_batch // (p.dp * p.mbs)
    if p.pp > 1 and p.vp > 1 and m % p.pp:
        raise PlanError(f"interleaved schedule needs micro-batches ({m}) to be a multiple of pp ({p.pp})")


def overlap_gap(p: Plan) -> str | None:
    """Why Megatron refuses EP all-to-all overlap on plan `p` (TransformerConfig: expert parallelism, no full
    recompute, virtual pipeline stages when pipelined), or None."""
    if p.ep <= 1:
        return "needs expert parallelism (ep > 1)"
    if p.recompute == "full":
        return "does not run with full recompute"
    if p.pp > 1 and p.vp == 1:
        return "needs virtual pipeline stages (vp > 1) when pp > 1"
    return None


def unpaired_fraction(pp: int, vp: int, m: int) -> float:
    """Share of a stage's forward and backward passes that have no other micro-batch's pass to run beside under
    EP all-to-all overlap: the warm-up forwards and cool-down backwards of the (interleaved) 1F1B schedule. The
    first stage has the most: `2(pp-1) + (vp-1)pp` model chunks with vp > 1 (Megatron's interleaved schedule),
    `pp-1` without, of `m * vp` chunks; with no pipeline, the first forward and the last backward."""
    if pp == 1:
        return min(1.0, 1.0 / m)
    warmup = 2 * (pp - 1) + (vp - 1) * pp if vp > 1 else pp - 1
    return min(1.0, warmup / (m * vp))
