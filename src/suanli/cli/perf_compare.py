"""`suanli perf compare`: the same job on several clusters or GPU types, each with its best plan, side by side."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Annotated, Any

import typer
from rich.table import Table

from suanli import catalog
from suanli.billing import default_price_book
from suanli.cli import common, jobs
from suanli.cli.common import FabricOpt, GpnOpt, JsonOpt, NicGbpsOpt, System, console, fail, user_errors
from suanli.cli.jobs import (
    BatchOpt,
    FfnOpt,
    GatedOpt,
    HeadsOpt,
    HiddenOpt,
    KvHeadsOpt,
    LayersOpt,
    ModelOpt,
    PrecisionOpt,
    SeqLenOpt,
    VocabOpt,
)

CENTS = Decimal("0.01")
MAX_PRICE = Decimal(1_000_000)


def _price(text: str) -> Decimal:
    """A GPU-hour price as given, exact: a finite decimal in [0, 1,000,000]."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        fail(f"--price-per-gpu-hour: {text!r} is not a number")
    if not value.is_finite() or not 0 <= value <= MAX_PRICE:
        fail(f"--price-per-gpu-hour must be between 0 and {MAX_PRICE:,}, not {text}")
    return value


def compare_cmd(
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
        list[str] | None,
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
    prices: list[Decimal | None] = [_price(p) for p in price_per_gpu_hour or []] or [None]
    if len(prices) == 1:
        prices = prices * len(systems)
    if len(prices) != len(systems):
        fail(f"give one --price-per-gpu-hour for all systems or one per system ({len(systems)}), not {len(prices)}")
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
            price, source = book.gpu_rate(system.gpu.name), f"default price book ({book.currency})"
        if price is not None:  # money stays exact: Decimal, shown as a string of cents
            row["price_per_gpu_hour"] = str(price)
            row["price_source"] = source
            cost = Decimal(gpus) * Decimal(str(row["time_to_train_s"])) / 3600 * price
            row["cost"] = str(cost.quantize(CENTS, rounding=ROUND_HALF_EVEN))
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
        ("cost", lambda r: f"{Decimal(r['cost']):,.2f}" if "cost" in r else "-"),
        ("relative", lambda r: f"{r['relative_throughput']:.2f}x"),
    ]
    for i, (label, value) in enumerate(fields):
        table.add_row(label, *(("[red]error[/red]" if i == 0 else "") if "error" in r else value(r) for r in rows))
    console.print(table)
    for r in rows:
        if "error" in r:
            console.print(f"[red]{r['system']}: {r['error']}[/red]")
