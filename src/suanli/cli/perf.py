"""`suanli perf …`: collective costs, training step time, plan search and system comparison."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from suanli.cli import common, jobs, perf_compare, perf_serve
from suanli.cli.common import (
    ClusterOpt,
    FabricOpt,
    GpnOpt,
    GpuOpt,
    GpusOpt,
    IntraOpt,
    JsonOpt,
    NicGbpsOpt,
    NicsOpt,
    NodesOpt,
    console,
    fail,
    user_errors,
)
from suanli.cli.jobs import (
    A2aOverlapOpt,
    AutoBatchOpt,
    CpOpt,
    DenseLayersOpt,
    DispatcherOpt,
    EpOpt,
    EtpOpt,
    ExpertsOpt,
    FfnOpt,
    Fp8AttentionOpt,
    GatedOpt,
    HeadDimOpt,
    HeadsOpt,
    HiddenOpt,
    ImbalanceOpt,
    KvHeadsOpt,
    KvLoraOpt,
    LayersOpt,
    MbsOpt,
    ModelOpt,
    MoeFfnOpt,
    MtpOpt,
    PpOpt,
    PrecisionOpt,
    PriceOpt,
    QkNopeOpt,
    QkRopeOpt,
    QLoraOpt,
    RecomputeModulesOpt,
    RecomputeOpt,
    SeqLenOpt,
    SharedExpertsOpt,
    TokensOpt,
    TopKOpt,
    TpOpt,
    VHeadOpt,
    VocabOpt,
    VpOpt,
    ZeroOpt,
)
from suanli.perf import MODEL_PRESETS, OPS, TrainEstimate, default_global_batch, estimate, search

app = typer.Typer(
    no_args_is_help=True, help="Performance model: collectives, training step time, parallel plans, LLM serving."
)


@app.command()
def collective(
    op: Annotated[str, typer.Option("--op", help=f"Collective: {'|'.join(OPS)}.")] = "all_reduce",
    size: Annotated[
        list[str] | None,
        typer.Option(
            "--size",
            "-s",
            metavar="SIZE",
            help="Message size (repeatable): 8, 1MiB, 8GiB, 1KB … (default: 8 B..8 GiB, x8).",
        ),
    ] = None,
    cluster: ClusterOpt = None,
    gpu: GpuOpt = None,
    nodes: NodesOpt = None,
    gpus: GpusOpt = None,
    gpus_per_node: GpnOpt = None,
    intra: IntraOpt = None,
    nics: NicsOpt = None,
    nic_gbps: NicGbpsOpt = None,
    fabric: FabricOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Predicted time, algbw and busbw of one NCCL collective (nccl-tests conventions)."""
    with user_errors():
        op = common.check_choice(op, OPS, "--op")
        sizes = [common.parse_size(s) for item in size or [] for s in item.split(",") if s.strip()]
        sizes = sizes or common.default_sizes()
        system = common.resolve_system(
            cluster=cluster, gpu=gpu, nodes=nodes, gpus=gpus, gpus_per_node=gpus_per_node,
            intra=intra, nics=nics, nic_gbps=nic_gbps, fabric=fabric,
        )  # fmt: skip
        group = system.cluster.comm_group(system.gpus)
        results = [estimate(op, s, group) for s in sizes]  # type: ignore[arg-type]
    if json_out:
        common.emit_json(
            {
                "op": op,
                "gpus": system.n_gpus,
                "nodes": system.n_nodes,
                "nvlink_domains": system.n_domains,
                "cluster": system.cluster.name,
                "system": system.describe(),
                "results": [r.as_dict() for r in results],
            }
        )
        return
    table = Table(title=f"{op} on {system.describe()}")
    for col in ("size", "time", "algbw GB/s", "busbw GB/s"):
        table.add_column(col, justify="right")
    table.add_column("algorithm")
    for r in results:
        table.add_row(
            common.human_size(r.size_bytes),
            common.human_time_us(r.time_us),
            f"{r.algbw_GBps:.2f}",
            f"{r.busbw_GBps:.2f}",
            f"{r.algorithm}/{r.protocol}",
        )
    console.print(table)


@app.command()
def train(
    model: ModelOpt,
    precision: PrecisionOpt = "bf16",
    seq_len: SeqLenOpt = 4096,
    global_batch: AutoBatchOpt = None,
    layers: LayersOpt = None,
    hidden: HiddenOpt = None,
    ffn: FfnOpt = None,
    heads: HeadsOpt = None,
    kv_heads: KvHeadsOpt = None,
    vocab: VocabOpt = None,
    gated: GatedOpt = None,
    experts: ExpertsOpt = None,
    top_k: TopKOpt = None,
    moe_ffn: MoeFfnOpt = None,
    shared_experts: SharedExpertsOpt = None,
    dense_layers: DenseLayersOpt = None,
    q_lora_rank: QLoraOpt = None,
    kv_lora_rank: KvLoraOpt = None,
    qk_nope_dim: QkNopeOpt = None,
    qk_rope_dim: QkRopeOpt = None,
    v_head_dim: VHeadOpt = None,
    mtp_layers: MtpOpt = None,
    head_dim: HeadDimOpt = None,
    moe_imbalance: ImbalanceOpt = 1.0,
    cluster: ClusterOpt = None,
    gpu: GpuOpt = None,
    nodes: NodesOpt = None,
    gpus: GpusOpt = None,
    gpus_per_node: GpnOpt = None,
    intra: IntraOpt = None,
    nics: NicsOpt = None,
    nic_gbps: NicGbpsOpt = None,
    fabric: FabricOpt = None,
    tp: TpOpt = None,
    pp: PpOpt = None,
    cp: CpOpt = None,
    vp: VpOpt = None,
    mbs: MbsOpt = None,
    zero: ZeroOpt = None,
    recompute: RecomputeOpt = None,
    ep: EpOpt = None,
    etp: EtpOpt = None,
    moe_a2a_overlap: A2aOverlapOpt = None,
    moe_dispatcher: DispatcherOpt = None,
    fp8_attention: Fp8AttentionOpt = False,
    recompute_modules: RecomputeModulesOpt = None,
    price_per_gpu_hour: PriceOpt = None,
    tokens: TokensOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Step time, throughput, MFU and memory of one training job (exact plan, or the best one found)."""
    with user_errors():
        system = common.resolve_system(
            cluster=cluster, gpu=gpu, nodes=nodes, gpus=gpus, gpus_per_node=gpus_per_node,
            intra=intra, nics=nics, nic_gbps=nic_gbps, fabric=fabric,
        )  # fmt: skip
        gbs = global_batch if global_batch is not None else default_global_batch(system.n_gpus)
        job = jobs.build_job(model, precision, seq_len, gbs, moe_imbalance, layers=layers, hidden=hidden, ffn=ffn,
                   heads=heads, kv_heads=kv_heads, vocab=vocab, gated=gated, experts=experts, top_k=top_k,
                   moe_ffn=moe_ffn, shared_experts=shared_experts, dense_layers=dense_layers,
                   q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank, qk_nope_dim=qk_nope_dim,
                   qk_rope_dim=qk_rope_dim, v_head_dim=v_head_dim, mtp_layers=mtp_layers,
                   head_dim=head_dim)  # fmt: skip
        fixed = jobs.fixed_plan(job.precision, tp=tp, pp=pp, cp=cp, vp=vp, mbs=mbs, zero=zero, recompute=recompute,
                                ep=ep, etp=etp, moe_a2a_overlap=moe_a2a_overlap, moe_dispatcher=moe_dispatcher,
                                fp8_attention=fp8_attention, recompute_modules=recompute_modules)  # fmt: skip
        jobs.check_moe_options(job, fixed)
        n_tokens = common.parse_count(tokens) if tokens is not None else None
        if price_per_gpu_hour is not None and price_per_gpu_hour < 0:
            fail("--price-per-gpu-hour must be >= 0")
        (est,), searched = jobs.best_plans(job, system, fixed)
    doc = {**jobs.job_header(job, system), "searched": searched, **est.as_dict()}
    doc["memory_capacity_gib"] = round(system.gpu.memory_GB * 1e9 / 2**30, 2)
    if n_tokens is not None:
        doc["tokens"] = n_tokens
        doc["time_to_train_s"] = round(n_tokens / est.tokens_per_s, 1)
    if price_per_gpu_hour is not None:
        doc["price_per_gpu_hour"] = price_per_gpu_hour
        doc["cost_per_hour"] = round(system.n_gpus * price_per_gpu_hour, 2)
        if n_tokens is not None:
            doc["cost"] = round(system.n_gpus * doc["time_to_train_s"] / 3600 * price_per_gpu_hour, 2)
    if json_out:
        common.emit_json(doc)
        return
    _render_train(doc, est)


def _render_train(doc: dict[str, Any], est: TrainEstimate) -> None:
    summary = Table(title=f"{doc['model']} ({common.human_count(doc['params'])} params) on {doc['system']}",
                    show_header=False)  # fmt: skip
    summary.add_column(style="bold")
    summary.add_column()
    fits = "[green]yes[/green]" if doc["fits"] else "[red]NO: does not fit in GPU memory[/red]"
    rows = [
        ("plan", jobs.plan_label(doc["plan"]) + (" (searched)" if doc["searched"] else "")),
        ("job", f"{doc['precision']}, seq {doc['seq_len']}, global batch {doc['global_batch']}"),
        ("step time", f"{doc['step_time_s']:.3f} s"),
        ("tokens/s", f"{doc['tokens_per_s']:,.0f}"),
        ("MFU", f"{common.pct(doc['mfu'])} ({doc['tflops_per_gpu']:.0f} TFLOP/s per GPU)"),
        ("memory/GPU", f"{doc['memory_gib_per_gpu']:.1f} of {doc['memory_capacity_gib']:.1f} GiB"),
        ("fits", fits),
    ]
    if "time_to_train_s" in doc:
        rows.append((f"{common.human_count(doc['tokens'])} tokens", common.human_duration(doc["time_to_train_s"])))
    if "cost" in doc:
        rows.append(("cost", f"{doc['cost']:,.2f}"))
    elif "cost_per_hour" in doc:
        rows.append(("cost/hour", f"{doc['cost_per_hour']:,.2f}"))
    for row in rows:
        summary.add_row(*row)
    console.print(summary)
    breakdown = Table(title="step time breakdown")
    breakdown.add_column("component")
    breakdown.add_column("seconds", justify="right")
    breakdown.add_column("share", justify="right")
    for k, v in est.breakdown.items():
        breakdown.add_row(k, f"{v:.3f}", common.pct(v / est.step_time_s) if est.step_time_s else "-")
    memory = Table(title="memory per GPU")
    memory.add_column("part")
    memory.add_column("GiB", justify="right")
    for k, v in est.memory_breakdown.items():
        memory.add_row(k, f"{v / 2**30:.2f}")
    console.print(breakdown)
    console.print(memory)


@app.command()
def plan(
    model: ModelOpt,
    precision: PrecisionOpt = "bf16",
    seq_len: SeqLenOpt = 4096,
    global_batch: AutoBatchOpt = None,
    layers: LayersOpt = None,
    hidden: HiddenOpt = None,
    ffn: FfnOpt = None,
    heads: HeadsOpt = None,
    kv_heads: KvHeadsOpt = None,
    vocab: VocabOpt = None,
    gated: GatedOpt = None,
    experts: ExpertsOpt = None,
    top_k: TopKOpt = None,
    moe_ffn: MoeFfnOpt = None,
    shared_experts: SharedExpertsOpt = None,
    dense_layers: DenseLayersOpt = None,
    q_lora_rank: QLoraOpt = None,
    kv_lora_rank: KvLoraOpt = None,
    qk_nope_dim: QkNopeOpt = None,
    qk_rope_dim: QkRopeOpt = None,
    v_head_dim: VHeadOpt = None,
    mtp_layers: MtpOpt = None,
    head_dim: HeadDimOpt = None,
    moe_imbalance: ImbalanceOpt = 1.0,
    cluster: ClusterOpt = None,
    gpu: GpuOpt = None,
    nodes: NodesOpt = None,
    gpus: GpusOpt = None,
    gpus_per_node: GpnOpt = None,
    intra: IntraOpt = None,
    nics: NicsOpt = None,
    nic_gbps: NicGbpsOpt = None,
    fabric: FabricOpt = None,
    tp: TpOpt = None,
    pp: PpOpt = None,
    cp: CpOpt = None,
    vp: VpOpt = None,
    mbs: MbsOpt = None,
    zero: ZeroOpt = None,
    recompute: RecomputeOpt = None,
    ep: EpOpt = None,
    etp: EtpOpt = None,
    moe_a2a_overlap: A2aOverlapOpt = None,
    moe_dispatcher: DispatcherOpt = None,
    fp8_attention: Fp8AttentionOpt = False,
    recompute_modules: RecomputeModulesOpt = None,
    top: Annotated[int, typer.Option("--top", help="How many plans to list.")] = 5,
    json_out: JsonOpt = False,
) -> None:
    """The fastest parallel plans that fit in memory, best first (none fit: the smallest, flagged)."""
    with user_errors():
        system = common.resolve_system(
            cluster=cluster, gpu=gpu, nodes=nodes, gpus=gpus, gpus_per_node=gpus_per_node,
            intra=intra, nics=nics, nic_gbps=nic_gbps, fabric=fabric,
        )  # fmt: skip
        gbs = global_batch if global_batch is not None else default_global_batch(system.n_gpus)
        job = jobs.build_job(model, precision, seq_len, gbs, moe_imbalance, layers=layers, hidden=hidden, ffn=ffn,
                   heads=heads, kv_heads=kv_heads, vocab=vocab, gated=gated, experts=experts, top_k=top_k,
                   moe_ffn=moe_ffn, shared_experts=shared_experts, dense_layers=dense_layers,
                   q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank, qk_nope_dim=qk_nope_dim,
                   qk_rope_dim=qk_rope_dim, v_head_dim=v_head_dim, mtp_layers=mtp_layers,
                   head_dim=head_dim)  # fmt: skip
        fixed = jobs.fixed_plan(job.precision, tp=tp, pp=pp, cp=cp, vp=vp, mbs=mbs, zero=zero, recompute=recompute,
                                ep=ep, etp=etp, moe_a2a_overlap=moe_a2a_overlap, moe_dispatcher=moe_dispatcher,
                                fp8_attention=fp8_attention, recompute_modules=recompute_modules)  # fmt: skip
        jobs.check_moe_options(job, fixed)
        common.check_positive(top, "--top")
        results = search(job, system.placement, fixed, top=top)
    plans = [{"rank": i + 1, **r.as_dict()} for i, r in enumerate(results)]
    if json_out:
        common.emit_json({**jobs.job_header(job, system), "any_fits": any(r.fits for r in results), "plans": plans})
        return
    table = Table(title=f"best plans for {job.arch.name} on {system.describe()}")
    table.add_column("#", justify="right")
    table.add_column("plan")
    for col in ("step s", "tokens/s", "MFU", "mem GiB"):
        table.add_column(col, justify="right")
    table.add_column("fits")
    for p in plans:
        table.add_row(
            str(p["rank"]), jobs.plan_label(p["plan"]), f"{p['step_time_s']:.3f}", f"{p['tokens_per_s']:,.0f}",
            common.pct(p["mfu"]), f"{p['memory_gib_per_gpu']:.1f}", "yes" if p["fits"] else "[red]no[/red]",
        )  # fmt: skip
    console.print(table)
    if not any(r.fits for r in results):
        console.print("[red]no plan fits in GPU memory; these use the least memory[/red]")


@app.command()
def models(json_out: JsonOpt = False) -> None:
    """The model presets --model accepts."""
    rows = [
        {"name": a.name, "params": a.params, "active_params": a.active_params, "layers": a.layers, "hidden": a.hidden,
         "ffn": a.ffn, "heads": a.heads, "kv_heads": a.kv_heads, "vocab": a.vocab, "gated_mlp": a.gated_mlp,
         "experts": a.experts, "top_k": a.top_k, "moe_ffn": a.moe_ffn, "shared_experts": a.shared_experts,
         "dense_layers": a.dense_layers, "mla": a.is_mla, "mtp_layers": a.mtp_layers, "mamba_layers": a.mamba_layers,
         "sources": dict(a.sources)}
        for a in MODEL_PRESETS.values()
    ]  # fmt: skip
    if json_out:
        common.emit_json(rows)
        return
    table = Table(title="model presets (or --model custom --layers … --hidden … --ffn … --heads …)")
    for col in ("name", "params", "active", "layers", "hidden", "heads", "kv heads", "vocab", "experts", "attention"):
        table.add_column(col, justify="left" if col in ("name", "experts", "attention") else "right")
    for r in rows:
        experts = f"{r['experts']} top-{r['top_k']}" + (
            f" +{r['shared_experts']} shared" if r["shared_experts"] else ""
        )
        attn = "MLA" if r["mla"] else ("hybrid Mamba" if r["mamba_layers"] else "GQA")
        vals = [r["name"], common.human_count(r["params"]), common.human_count(r["active_params"]),
                *(str(r[k]) for k in ("layers", "hidden", "heads", "kv_heads", "vocab")),
                experts if r["experts"] else "dense", attn + (f" +{r['mtp_layers']} MTP" if r["mtp_layers"] else "")]  # fmt: skip
        table.add_row(*vals)
    console.print(table)


app.command("compare")(perf_compare.compare_cmd)
app.command("serve")(perf_serve.serve_cmd)
app.command("serve-plan")(perf_serve.serve_plan_cmd)
