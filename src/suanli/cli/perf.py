"""`suanli perf …`: collective costs, training step time, plan search and system comparison."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from suanli import catalog
from suanli.billing import default_price_book
from suanli.cli import common, jobs, perf_serve
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
    System,
    console,
    fail,
    user_errors,
)
from suanli.cli.jobs import (
    AutoBatchOpt,
    BatchOpt,
    CpOpt,
    DenseLayersOpt,
    EpOpt,
    EtpOpt,
    ExpertsOpt,
    FfnOpt,
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
        fixed = jobs.fixed_plan(tp=tp, pp=pp, cp=cp, vp=vp, mbs=mbs, zero=zero, recompute=recompute, ep=ep, etp=etp)
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
        fixed = jobs.fixed_plan(tp=tp, pp=pp, cp=cp, vp=vp, mbs=mbs, zero=zero, recompute=recompute, ep=ep, etp=etp)
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
def compare(
    model: ModelOpt,
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs the job runs on, on every system.")],
    cluster: Annotated[
        list[str] | None,
        typer.Option("--cluster", "-c", help="Cluster to compare (repeatable): preset, NxG[:MODEL] or YAML file."),
    ] = None,
    gpu: Annotated[
        list[str] | None,
        typer.Option("--gpu", help="GPU model to compare (repeatable): homogeneous nodes under an InfiniBand fabric."),
    ] = None,
    gpus_per_node: GpnOpt = None,
    nic_gbps: NicGbpsOpt = None,
    fabric: FabricOpt = None,
    price_per_gpu_hour: Annotated[
        list[float] | None,
        typer.Option(
            "--price-per-gpu-hour",
            help="GPU-hour price: one for all systems, or one per system (clusters, then GPUs). Default: the "
            "shipped price book's on-demand rate for each GPU model.",
        ),
    ] = None,
    tokens: Annotated[str, typer.Option("--tokens", help="Tokens to train on, for time and cost.")] = "1e9",
    precision: PrecisionOpt = "bf16",
    seq_len: SeqLenOpt = 4096,
    global_batch: BatchOpt = 256,
    layers: LayersOpt = None,
    hidden: HiddenOpt = None,
    ffn: FfnOpt = None,
    heads: HeadsOpt = None,
    kv_heads: KvHeadsOpt = None,
    vocab: VocabOpt = None,
    gated: GatedOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The same job on several clusters or GPU types, each with its best plan, side by side."""
    with user_errors():
        job = jobs.build_job(model, precision, seq_len, global_batch, layers=layers, hidden=hidden, ffn=ffn, heads=heads,
                   kv_heads=kv_heads, vocab=vocab, gated=gated)  # fmt: skip
        n_tokens = common.parse_count(tokens)
        common.check_positive(gpus, "--gpus")
        systems = [(ref, "cluster", common.load_cluster(ref)) for ref in cluster or []]
        for name in gpu or []:
            spec = catalog.gpu(name)
            gpn = gpus_per_node or common.default_gpus_per_node(spec)
            c = common.homogeneous_cluster(spec.name, -(-gpus // gpn), gpn, nic_gbps=nic_gbps, fabric=fabric)
            systems.append((name, "gpu", c))
    if not systems:
        fail("give at least one --cluster or --gpu to compare")
    prices: list[float | None] = list(price_per_gpu_hour or [None])
    if len(prices) == 1:
        prices = prices * len(systems)
    if len(prices) != len(systems):
        fail(f"give one --price-per-gpu-hour for all systems or one per system ({len(systems)}), not {len(prices)}")
    if any(p is not None and p < 0 for p in prices):
        fail("--price-per-gpu-hour must be >= 0")
    rows: list[dict[str, Any]] = []
    book = default_price_book()
    for (ref, kind, c), price in zip(systems, prices, strict=True):
        row: dict[str, Any] = {"system": ref, "kind": kind, "cluster": c.name}
        try:
            system = System(c, c.compact_gpus(gpus))
            (est,), _ = jobs.best_plans(job, system, {})
        except ValueError as e:  # too few GPUs, no plan, unsupported precision: reported per system
            rows.append({**row, "error": " ".join(str(e).split())})
            continue
        row.update(gpu=system.gpu.name, description=system.describe(), **est.as_dict())
        row["time_to_train_s"] = round(n_tokens / est.tokens_per_s, 1)
        source = "given"
        if price is None and system.gpu.name in book.gpu_hour:
            price, source = float(book.gpu_rate(system.gpu.name)), f"default price book ({book.currency})"
        if price is not None:
            row["price_per_gpu_hour"] = price
            row["price_source"] = source
            row["cost"] = round(gpus * row["time_to_train_s"] / 3600 * price, 2)
        rows.append(row)
    ok = [r for r in rows if "error" not in r]
    if not ok:
        fail("; ".join(f"{r['system']}: {r['error']}" for r in rows))
    fastest = max(r["tokens_per_s"] for r in ok)
    for r in ok:
        r["relative_throughput"] = round(r["tokens_per_s"] / fastest, 4)
    header = {"model": job.arch.name, "params": job.arch.params, "precision": job.precision, "seq_len": job.seq_len,
              "global_batch": job.global_batch, "gpus": gpus, "tokens": n_tokens}  # fmt: skip
    if json_out:
        common.emit_json({**header, "systems": rows})
        return
    table = Table(title=f"{job.arch.name} on {gpus} GPUs, {common.human_count(n_tokens)} tokens, best plan on each")
    table.add_column("")
    for r in rows:
        table.add_column(r["system"], justify="right")
    fields: list[tuple[str, Any]] = [
        ("GPU", lambda r: r["gpu"]),
        ("plan", lambda r: jobs.plan_label(r["plan"])),
        ("step time", lambda r: f"{r['step_time_s']:.3f} s"),
        ("tokens/s", lambda r: f"{r['tokens_per_s']:,.0f}"),
        ("MFU", lambda r: common.pct(r["mfu"])),
        ("memory/GPU", lambda r: f"{r['memory_gib_per_gpu']:.1f} GiB" + ("" if r["fits"] else " [red](too big)[/red]")),
        (f"{common.human_count(n_tokens)} tokens", lambda r: common.human_duration(r["time_to_train_s"])),
        ("cost", lambda r: f"{r['cost']:,.2f}" if "cost" in r else "-"),
        ("relative", lambda r: f"{r['relative_throughput']:.2f}x"),
    ]
    for i, (label, value) in enumerate(fields):
        table.add_row(label, *(("[red]error[/red]" if i == 0 else "") if "error" in r else value(r) for r in rows))
    console.print(table)
    for r in rows:
        if "error" in r:
            console.print(f"[red]{r['system']}: {r['error']}[/red]")


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


app.command("serve")(perf_serve.serve_cmd)
app.command("serve-plan")(perf_serve.serve_plan_cmd)
