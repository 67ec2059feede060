"""CLI inputs that describe a training job and its parallel plan, and turning them into model objects."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from suanli.cli.common import System, check_choice, check_positive, fail
from suanli.perf import (
    MODEL_PRESETS,
    Plan,
    PlanError,
    TrainEstimate,
    TrainJob,
    TransformerArch,
    evaluate,
    model_preset,
    search,
)
from suanli.perf.plan import with_moe_options
from suanli.perf.train_plan import LOW_PRECISION, RECOMPUTE_MODULES, TRAIN_PRECISIONS, overlap_gap

# ---- training jobs and plans ----------------------------------------------------------------------------
PRECISIONS = TRAIN_PRECISIONS
RECOMPUTE = ("none", "selective", "full")
MODEL = "Model and job"
PLAN = "Parallel plan (all of --tp/--pp/--cp given: evaluate exactly; otherwise search with the given ones fixed)"

ModelOpt = Annotated[
    str,
    typer.Option(
        "--model", "-m", help=f"Model preset ({', '.join(MODEL_PRESETS)}) or 'custom'.", rich_help_panel=MODEL
    ),
]
PrecisionOpt = Annotated[
    str,
    typer.Option(
        "--precision",
        help="bf16|fp16|fp8 (per-tensor)|fp8-blockwise|mxfp8 (Blackwell)|nvfp4 (Blackwell)|fp32.",
        rich_help_panel=MODEL,
    ),
]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", help="Sequence length (tokens).", rich_help_panel=MODEL)]
BatchOpt = Annotated[int, typer.Option("--global-batch", help="Sequences per optimizer step.", rich_help_panel=MODEL)]
AutoBatchOpt = Annotated[
    int | None,
    typer.Option(
        "--global-batch",
        help="Sequences per optimizer step (default: 256, or a quarter of the GPU count rounded up to a power of two "
        "when larger).",
        rich_help_panel=MODEL,
    ),
]
_ARCH = "Custom model (--model custom)"
LayersOpt = Annotated[int | None, typer.Option("--layers", rich_help_panel=_ARCH)]
HiddenOpt = Annotated[int | None, typer.Option("--hidden", rich_help_panel=_ARCH)]
FfnOpt = Annotated[int | None, typer.Option("--ffn", help="FFN inner size.", rich_help_panel=_ARCH)]
HeadsOpt = Annotated[int | None, typer.Option("--heads", rich_help_panel=_ARCH)]
KvHeadsOpt = Annotated[
    int | None, typer.Option("--kv-heads", help="KV heads (default: --heads).", rich_help_panel=_ARCH)
]
VocabOpt = Annotated[
    int | None, typer.Option("--vocab", help="Vocabulary size (default: 32000).", rich_help_panel=_ARCH)
]
GatedOpt = Annotated[
    bool | None, typer.Option("--gated/--no-gated", help="SwiGLU MLP (default: gated).", rich_help_panel=_ARCH)
]
ExpertsOpt = Annotated[int | None, typer.Option("--experts", help="Routed experts (MoE).", rich_help_panel=_ARCH)]
TopKOpt = Annotated[int | None, typer.Option("--top-k", help="Experts per token.", rich_help_panel=_ARCH)]
MoeFfnOpt = Annotated[int | None, typer.Option("--moe-ffn", help="Expert FFN inner size.", rich_help_panel=_ARCH)]
SharedExpertsOpt = Annotated[
    int | None, typer.Option("--shared-experts", help="Always-on shared experts.", rich_help_panel=_ARCH)
]
DenseLayersOpt = Annotated[
    int | None, typer.Option("--dense-layers", help="Leading dense (non-MoE) layers.", rich_help_panel=_ARCH)
]
QLoraOpt = Annotated[int | None, typer.Option("--q-lora-rank", help="MLA query rank.", rich_help_panel=_ARCH)]
KvLoraOpt = Annotated[
    int | None, typer.Option("--kv-lora-rank", help="MLA KV rank (turns MLA on).", rich_help_panel=_ARCH)
]
QkNopeOpt = Annotated[int | None, typer.Option("--qk-nope-dim", help="MLA per-head QK dim.", rich_help_panel=_ARCH)]
QkRopeOpt = Annotated[int | None, typer.Option("--qk-rope-dim", help="MLA rotary dim.", rich_help_panel=_ARCH)]
VHeadOpt = Annotated[int | None, typer.Option("--v-head-dim", help="MLA per-head V dim.", rich_help_panel=_ARCH)]
MtpOpt = Annotated[
    int | None, typer.Option("--mtp-layers", help="Multi-token-prediction modules.", rich_help_panel=_ARCH)
]
HeadDimOpt = Annotated[
    int | None, typer.Option("--head-dim", help="Per-head dim (default hidden/heads).", rich_help_panel=_ARCH)
]
EpOpt = Annotated[int | None, typer.Option("--ep", help="Expert parallel size (MoE).", rich_help_panel=PLAN)]
EtpOpt = Annotated[int | None, typer.Option("--etp", help="Expert tensor parallel size (MoE).", rich_help_panel=PLAN)]
ImbalanceOpt = Annotated[
    float,
    typer.Option(
        "--moe-imbalance",
        help="Busiest expert-parallel rank's load / the mean (1.0: balanced, as NVIDIA's benchmarks force).",
        rich_help_panel=MODEL,
    ),
]
TpOpt = Annotated[int | None, typer.Option("--tp", help="Tensor parallel size.", rich_help_panel=PLAN)]
PpOpt = Annotated[int | None, typer.Option("--pp", help="Pipeline parallel size.", rich_help_panel=PLAN)]
CpOpt = Annotated[int | None, typer.Option("--cp", help="Context parallel size.", rich_help_panel=PLAN)]
VpOpt = Annotated[int | None, typer.Option("--vp", help="Virtual pipeline stages per rank.", rich_help_panel=PLAN)]
MbsOpt = Annotated[int | None, typer.Option("--mbs", help="Micro-batch size.", rich_help_panel=PLAN)]
ZeroOpt = Annotated[
    int | None, typer.Option("--zero", help="ZeRO stage 0..3 (FSDP: --tp 1 --pp 1 --zero 3).", rich_help_panel=PLAN)
]
RecomputeOpt = Annotated[str | None, typer.Option("--recompute", help="none|selective|full.", rich_help_panel=PLAN)]
A2aOverlapOpt = Annotated[
    bool | None,
    typer.Option(
        "--moe-a2a-overlap/--no-moe-a2a-overlap",
        help="EP all-to-all overlap (Megatron overlap_moe_expert_parallel_comm): one micro-batch's dispatch/combine "
        "beside another's compute. Default: on wherever Megatron allows it (--ep > 1, recompute not full, --vp > 1 "
        "when --pp > 1).",
        rich_help_panel=PLAN,
    ),
]
DISPATCHERS = ("flex", "alltoall")
DispatcherOpt = Annotated[
    str | None,
    typer.Option(
        "--moe-dispatcher",
        help="MoE token dispatcher: flex (DeepEP/HybridEP: a token crosses the network once per destination NVLink "
        "domain) | alltoall (Megatron's plain all-to-all: once per (token, expert) pair). Default: flex when the "
        "EP group spans NVLink domains, else alltoall (the same cost inside one).",
        rich_help_panel=PLAN,
    ),
]
Fp8AttentionOpt = Annotated[
    bool,
    typer.Option(
        "--fp8-attention",
        help="Flash attention in FP8 (Transformer Engine fp8_dot_product_attention); FP8 recipes only "
        "(--precision fp8|fp8-blockwise|mxfp8|nvfp4). Off unless given: it changes the numerics.",
        rich_help_panel=PLAN,
    ),
]
RecomputeModulesOpt = Annotated[
    str | None,
    typer.Option(
        "--recompute-modules",
        help=f"Selective recompute of these modules, comma-separated ({', '.join(RECOMPUTE_MODULES)}; Megatron "
        "recompute_modules); implies --recompute selective.",
        rich_help_panel=PLAN,
    ),
]
PriceOpt = Annotated[float | None, typer.Option("--price-per-gpu-hour", help="Price of one GPU-hour, for cost.")]
TokensOpt = Annotated[
    str | None, typer.Option("--tokens", help="Tokens to train on (1e9, 300B, 15T), for time and cost.")
]


MOE_FIELDS = {
    "experts": "experts", "top_k": "top_k", "moe_ffn": "moe_ffn", "shared_experts": "shared_experts",
    "dense_layers": "dense_layers", "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
    "qk_nope_dim": "qk_nope_dim", "qk_rope_dim": "qk_rope_dim", "v_head_dim": "v_head_dim",
    "mtp_layers": "mtp_layers", "head_dim": "attn_head_dim",
}  # fmt: skip
ZERO_OK = {"shared_experts", "dense_layers", "q_lora_rank", "mtp_layers"}


def build_arch(model: str, **dims: Any) -> TransformerArch:
    given = {k: v for k, v in dims.items() if v is not None}
    if model.strip().lower() != "custom":
        if given:
            fail(f"{', '.join('--' + k.replace('_', '-') for k in given)} only apply to --model custom")
        return model_preset(model)
    missing = [f"--{k}" for k in ("layers", "hidden", "ffn", "heads") if k not in given]
    if missing:
        fail(f"--model custom needs {', '.join(missing)}")
    for k, v in given.items():
        if k != "gated" and (v < 0 if k in ZERO_OK else v <= 0):
            fail(f"--{k.replace('_', '-')} must be {'>= 0' if k in ZERO_OK else 'positive'}")
        if k != "gated" and v > 10_000_000:
            fail(f"--{k.replace('_', '-')} must be at most 10,000,000")
    extra = {MOE_FIELDS[k]: v for k, v in given.items() if k in MOE_FIELDS}
    if "experts" in extra:
        extra.setdefault("top_k", 1)
        extra.setdefault("moe_ffn", given["ffn"])
    try:
        return TransformerArch(
            name="custom",
            layers=given["layers"],
            hidden=given["hidden"],
            ffn=given["ffn"],
            heads=given["heads"],
            kv_heads=given.get("kv_heads", given["heads"]),
            vocab=given.get("vocab", 32000),
            gated_mlp=given.get("gated", True),
            **extra,
        )
    except ValueError as e:
        fail(f"custom model: {e}")


def build_job(
    model: str, precision: str, seq_len: int, global_batch: int, moe_imbalance: float = 1.0, **dims: Any
) -> TrainJob:
    check_positive(seq_len, "--seq-len")
    check_positive(global_batch, "--global-batch")
    prec = check_choice(precision, PRECISIONS, "--precision")
    if not 1.0 <= moe_imbalance <= 64.0:
        fail("--moe-imbalance must be between 1.0 (balanced) and 64")
    return TrainJob(build_arch(model, **dims), prec, seq_len, global_batch, moe_imbalance)  # type: ignore[arg-type]


def fixed_plan(precision: str = "bf16", **plan: Any) -> dict[str, Any]:
    """The plan fields the user fixed, checked at the edge (each refusal names its flag)."""
    for k in ("tp", "pp", "cp", "vp", "mbs", "ep", "etp"):
        if k in plan:
            check_positive(plan[k], f"--{k}")
    if plan["zero"] is not None and plan["zero"] not in (0, 1, 2, 3):
        fail(f"--zero must be 0, 1, 2 or 3 (got {plan['zero']})")
    if plan["recompute"] is not None:
        plan["recompute"] = check_choice(plan["recompute"], RECOMPUTE, "--recompute")
    if plan.get("moe_dispatcher") is not None:
        plan["moe_dispatcher"] = check_choice(plan["moe_dispatcher"], DISPATCHERS, "--moe-dispatcher")
    if plan.get("fp8_attention"):
        if precision not in LOW_PRECISION:
            fail(f"--fp8-attention needs an FP8 recipe (--precision {'|'.join(LOW_PRECISION)}), not {precision}")
    else:
        plan.pop("fp8_attention", None)
    if plan.get("recompute_modules") is not None:
        plan["recompute_modules"] = _recompute_modules(plan["recompute_modules"], plan["recompute"])
        plan["recompute"] = "selective"
    return {k: v for k, v in plan.items() if v is not None}


def check_moe_options(job: TrainJob, fixed: dict[str, Any]) -> None:
    """Refuse MoE options a dense model has no use for, and a forced EP all-to-all overlap no plan of this job can
    run, naming the flags (not 'no plan')."""
    if not job.arch.is_moe:
        for flag, key in (("--moe-a2a-overlap", "moe_a2a_overlap"), ("--moe-dispatcher", "moe_dispatcher")):
            if fixed.get(key):
                fail(f"{flag} needs a Mixture-of-Experts model ({job.arch.name} has no experts)")
    if not fixed.get("moe_a2a_overlap"):
        return
    pp = fixed.get("pp", 1)  # what the user did not fix, the search may still choose so that it runs
    probe = Plan(
        ep=fixed.get("ep", 2), recompute=fixed.get("recompute", "none"), pp=pp, vp=fixed.get("vp", 2 if pp > 1 else 1)
    )
    if gap := overlap_gap(probe):  # the core's rule, named by the flags that set it
        fail(f"--moe-a2a-overlap {gap}: Megatron refuses it (see --ep, --recompute, --pp and --vp)")


def _recompute_modules(text: str, recompute: str | None) -> tuple[str, ...]:
    if len(text) > 200:
        fail("--recompute-modules is too long (at most 200 characters)")
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        fail(f"--recompute-modules names no module; known: {', '.join(RECOMPUTE_MODULES)}")
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown:
        fail(f"--recompute-modules: unknown module {unknown[0]!r}; known: {', '.join(RECOMPUTE_MODULES)}")
    if recompute not in (None, "selective"):
        fail(f"--recompute-modules needs --recompute selective (got --recompute {recompute})")
    return tuple(dict.fromkeys(names))


def best_plans(job: TrainJob, system: System, fixed: dict[str, Any], top: int = 1) -> tuple[list[TrainEstimate], bool]:
    """The exact plan when tp, pp and cp are all fixed, else the `top` fastest searched ones (and whether searched)."""
    if all(k in fixed for k in ("tp", "pp", "cp")):
        prod = fixed["tp"] * fixed["pp"] * fixed["cp"]
        if system.n_gpus % prod:
            raise PlanError(f"tp*pp*cp = {prod} does not divide {system.n_gpus} GPUs")
        defaults = {"vp": 1, "mbs": 1, "zero": 1, "recompute": "none", "ep": 1, "etp": 1}
        sizes = {k: v for k, v in {**defaults, **fixed}.items() if k in defaults or k in ("tp", "pp", "cp")}
        base = Plan(**sizes, dp=system.n_gpus // prod)
        if fixed.get("moe_a2a_overlap") and (gap := overlap_gap(base)):
            raise PlanError(f"--moe-a2a-overlap {gap}")
        plan = with_moe_options(base, system.placement.domain_size, fixed)
        assert plan is not None  # only a fixed overlap the plan cannot run makes it None: refused above
        return [evaluate(job, plan, system.placement)], False
    return search(job, system.placement, fixed, top=top), True


def job_header(job: TrainJob, system: System) -> dict[str, Any]:
    return {
        "model": job.arch.name,
        "params": job.arch.params,
        "precision": job.precision,
        "seq_len": job.seq_len,
        "global_batch": job.global_batch,
        "gpus": system.n_gpus,
        "nodes": system.n_nodes,
        "nvlink_domains": system.n_domains,
        "gpu": system.gpu.name,
        "cluster": system.cluster.name,
        "system": system.describe(),
    }


def plan_label(p: dict[str, Any]) -> str:
    label = f"TP{p['tp']} PP{p['pp']} CP{p['cp']} DP{p['dp']}"
    if p.get("ep", 1) > 1 or p.get("etp", 1) > 1:
        label += f" EP{p['ep']} ETP{p['etp']}"
    extra = [f"VP{p['vp']}" if p["vp"] > 1 else "", f"MBS{p['mbs']}", f"ZeRO-{p['zero']}"]
    modules = f"({','.join(p['recompute_modules'])})" if p.get("recompute_modules") else ""
    extra.append("" if p["recompute"] == "none" else f"recompute={p['recompute']}{modules}")
    if p.get("ep", 1) > 1:
        extra.append("A2A-overlap" if p.get("moe_a2a_overlap") else "")
        extra.append(f"{p.get('moe_dispatcher', 'flex')}-dispatch")
    extra.append("FP8-attention" if p.get("fp8_attention") else "")
    return " ".join([label, *[e for e in extra if e]])
