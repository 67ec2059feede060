"""`suanli perf serve` and `suanli perf serve-plan`: LLM serving throughput, latency and the cheapest SLO-meeting
configuration per GPU offer. Every flag is checked with bounds here (exit 2 naming it); the model is in perf/."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Annotated, Any

import typer
from rich.table import Table

from suanli import catalog
from suanli.billing import default_price_book
from suanli.cli import common
from suanli.cli.common import (
    ClusterOpt,
    FabricOpt,
    GpnOpt,
    GpuOpt,
    IntraOpt,
    JsonOpt,
    NicGbpsOpt,
    NicsOpt,
    console,
    fail,
    user_errors,
)
from suanli.perf import SERVE_PRECISIONS, Layout, ServeWorkload, model_preset, serve
from suanli.perf.serve_plan import SLO, ServeOffer, cheapest_per_offer
from suanli.perf.serve_sched import DEFAULT_MAX_NUM_TOKENS

MAX_GPUS = 100_000
MAX_LEN = 1 << 20  # tokens of prompt or output
MAX_CONCURRENCY = 1_000_000
MAX_RATE = 1e6  # requests/s
MIN_RATE = 1e-6  # requests/s: one in about 12 days (below it the estimate is of nothing: an idle engine)
MAX_REQUESTS = 10_000_000
MAX_NUM_TOKENS = 1 << 20  # the engine's token budget per iteration
MAX_SLO_MS = 3_600_000.0
_W = "Workload"
_L = "Layout"

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Model preset (`suanli perf models`).")]
PrecisionOpt = Annotated[
    str, typer.Option("--precision", help="bf16|fp16|fp8|fp4 (weights; the KV cache is FP8 with fp8/fp4).")
]
InputOpt = Annotated[int, typer.Option("--input-len", help="Prompt tokens per request.", rich_help_panel=_W)]
OutputOpt = Annotated[int, typer.Option("--output-len", help="Output tokens per request.", rich_help_panel=_W)]


def _check_int(value: int | None, option: str, lo: int, hi: int) -> None:
    if value is not None and not lo <= value <= hi:
        fail(f"{option} must be between {lo:,} and {hi:,} (got {value:,})")


def _check_float(value: float | None, option: str, hi: float, lo: float = 0.0) -> None:
    if value is not None and not (math.isfinite(value) and (value > 0 if lo == 0 else value >= lo) and value <= hi):
        what = "above 0" if lo == 0 else f"at least {lo:g}"
        fail(f"{option} must be a number {what} and at most {hi:g} (got {value})")


def _model(name: str):
    try:
        return model_preset(name)
    except ValueError as e:
        fail(f"--model: {e}")


def serve_cmd(
    model: ModelOpt,
    input_len: InputOpt,
    output_len: OutputOpt,
    precision: PrecisionOpt = "fp8",
    gpu: GpuOpt = None,
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs serving (all replicas).", rich_help_panel=_L)] = 1,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size of attention.", rich_help_panel=_L)] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.", rich_help_panel=_L)] = 1,
    ep: Annotated[
        int, typer.Option("--ep", help="Expert-parallel size (MoE; divides the GPUs of a stage).", rich_help_panel=_L)
    ] = 1,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", help="Clients, each with one request in flight.", rich_help_panel=_W)
    ] = None,
    rate: Annotated[
        float | None, typer.Option("--rate", help="Arriving requests per second.", rich_help_panel=_W)
    ] = None,
    requests: Annotated[
        int | None,
        typer.Option(
            "--requests", help="A finite run of this many requests (default: steady state).", rich_help_panel=_W
        ),
    ] = None,
    max_num_tokens: Annotated[
        int,
        typer.Option(
            "--max-num-tokens",
            help="The engine's token budget per iteration: decode tokens first, prompt chunks in what is left "
            "(TensorRT-LLM max_num_tokens, vLLM max_num_batched_tokens).",
            rich_help_panel=_W,
        ),
    ] = DEFAULT_MAX_NUM_TOKENS,
    cluster: ClusterOpt = None,
    gpus_per_node: GpnOpt = None,
    intra: IntraOpt = None,
    nics: NicsOpt = None,
    nic_gbps: NicGbpsOpt = None,
    fabric: FabricOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Serving throughput (total and per GPU), time to first token, inter-token latency, the largest batch the KV
    cache holds and what bounds it. Without --concurrency or --rate: maximum throughput (requests always waiting)."""
    arch = _model(model)
    prec = common.check_choice(precision, SERVE_PRECISIONS, "--precision")
    _check_int(input_len, "--input-len", 1, MAX_LEN)
    _check_int(output_len, "--output-len", 1, MAX_LEN)
    _check_int(gpus, "--gpus", 1, MAX_GPUS)
    for value, option in ((tp, "--tp"), (pp, "--pp"), (ep, "--ep")):
        _check_int(value, option, 1, gpus)
    if concurrency is not None and rate is not None:
        fail("give --concurrency or --rate, not both")
    _check_int(concurrency, "--concurrency", 1, MAX_CONCURRENCY)
    _check_float(rate, "--rate", MAX_RATE, MIN_RATE)
    _check_int(requests, "--requests", 1, MAX_REQUESTS)
    _check_int(max_num_tokens, "--max-num-tokens", 1, MAX_NUM_TOKENS)
    if requests is not None and concurrency is not None:
        fail("--requests applies to --rate or maximum throughput, not --concurrency")
    with user_errors():
        system = common.resolve_system(
            cluster=cluster, gpu=gpu, gpus=gpus, gpus_per_node=gpus_per_node,
            intra=intra, nics=nics, nic_gbps=nic_gbps, fabric=fabric,
        )  # fmt: skip
        if system.n_gpus != gpus:
            fail(f"--gpus {gpus}: the cluster has only {system.n_gpus} GPUs")
        placement = system.placement
        work = ServeWorkload(
            input_len, output_len, concurrency=concurrency, rate=rate, num_requests=requests,
            max_num_tokens=max_num_tokens,
        )  # fmt: skip
        est = serve(arch, placement.gpu, Layout(gpus, tp, pp, ep), prec, work, placement.group_fn())  # type: ignore[arg-type]
    doc: dict[str, Any] = {
        "model": arch.name,
        "gpu": placement.gpu.name,
        "system": system.describe(),
        "gpus": gpus,
        "tp": tp,
        "pp": pp,
        "ep": ep,
        "precision": prec,
        "input_len": input_len,
        "output_len": output_len,
        "concurrency": concurrency,
        "rate": rate,
        "requests": requests,
        "max_num_tokens": max_num_tokens,
        **est.as_dict(),
    }
    if json_out:
        common.emit_json(doc)
        return
    table = Table(title=f"{arch.name} serving on {system.describe()}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    load = f"{concurrency} clients" if concurrency else f"{rate:g} req/s" if rate else "max throughput"
    ttft = "unbounded (queue grows)" if doc["ttft_ms"] is None else f"{doc['ttft_ms']:,.1f} ms"
    for row in (
        ("layout", f"TP{tp} PP{pp} EP{ep}, {prec}, {load}, {input_len}+{output_len} tokens"),
        ("output tokens/s", f"{doc['output_tokens_per_s']:,.0f} ({doc['output_tokens_per_s_per_gpu']:,.0f} per GPU)"),
        ("requests/s", f"{doc['requests_per_s']:,.2f}" + (" (saturated)" if doc["saturated"] else "")),
        ("time to first token", ttft),
        ("inter-token latency", f"{doc['itl_ms']:,.2f} ms"),
        ("batch", f"{doc['batch']:,.1f} of at most {doc['max_batch']:,} per attention replica"),
        ("bound", doc["bound"]),
        ("KV cache", f"{doc['kv_cache_tokens_per_gpu']:,} tokens per GPU"),
    ):
        table.add_row(*row)
    console.print(table)


def serve_plan_cmd(
    model: ModelOpt,
    slo_ttft_ms: Annotated[float, typer.Option("--slo-ttft-ms", help="Mean time to first token, at most (ms).")],
    slo_itl_ms: Annotated[float, typer.Option("--slo-itl-ms", help="Mean inter-token latency, at most (ms).")],
    rps: Annotated[float, typer.Option("--rps", help="Requests per second to serve.")],
    input_len: InputOpt = 1024,
    output_len: OutputOpt = 256,
    gpu: Annotated[
        list[str] | None,
        typer.Option("--gpu", help="GPU model to consider (repeatable; default: every model the price book prices)."),
    ] = None,
    precision: Annotated[
        list[str] | None, typer.Option("--precision", help="Precision to consider (repeatable; default: all).")
    ] = None,
    max_gpus: Annotated[int, typer.Option("--max-gpus-per-replica", help="Largest replica, in GPUs.")] = 8,
    json_out: JsonOpt = False,
) -> None:
    """The cheapest configuration on each GPU offer that serves --rps within the SLO, with its price per million
    output tokens (the shipped price book's on-demand rates)."""
    arch = _model(model)
    _check_float(slo_ttft_ms, "--slo-ttft-ms", MAX_SLO_MS)
    _check_float(slo_itl_ms, "--slo-itl-ms", MAX_SLO_MS)
    _check_float(rps, "--rps", MAX_RATE, MIN_RATE)
    _check_int(input_len, "--input-len", 1, MAX_LEN)
    _check_int(output_len, "--output-len", 1, MAX_LEN)
    _check_int(max_gpus, "--max-gpus-per-replica", 1, 512)
    precs = [common.check_choice(p, SERVE_PRECISIONS, "--precision") for p in precision or SERVE_PRECISIONS]
    book = default_price_book()
    names = gpu or list(book.gpu_hour)
    offers: list[ServeOffer] = []
    with user_errors():
        for name in names:
            spec = catalog.gpu(name)
            if spec.name not in book.gpu_hour:
                fail(f"--gpu {name}: the price book has no price for {spec.name}")
            gpn = common.default_gpus_per_node(spec)
            c = common.homogeneous_cluster(spec.name, max(1, -(-max_gpus // gpn)), gpn)
            placement = common.System(c, c.compact_gpus(min(max_gpus, c.n_gpus))).placement
            offers.append(ServeOffer(spec, book.gpu_rate(spec.name), max_gpus, placement.domain_size,
                                     placement.group_fn()))  # fmt: skip
        slo = SLO(slo_ttft_ms / 1e3, slo_itl_ms / 1e3)
        found, missed = cheapest_per_offer(arch, offers, slo, rps, input_len, output_len, precs)  # type: ignore[arg-type]
    rows = [c.as_dict() for c in found]
    doc = {"model": arch.name, "slo_ttft_ms": slo_ttft_ms, "slo_itl_ms": slo_itl_ms, "rps": rps,
           "input_len": input_len, "output_len": output_len, "currency": book.currency, "offers": rows,
           "cannot_meet_slo": missed}  # fmt: skip
    if json_out:
        common.emit_json(doc)
        return
    table = Table(title=f"cheapest SLO-meeting configuration per GPU for {arch.name} at {rps:g} req/s")
    for col in ("GPU", "replica", "replicas", "TTFT ms", "ITL ms", f"{book.currency}/h", f"{book.currency}/1M out"):
        table.add_column(col, justify="left" if col in ("GPU", "replica") else "right")
    for r in rows:
        ttft = "-" if r["ttft_ms"] is None else f"{r['ttft_ms']:,.0f}"
        table.add_row(
            str(r["gpu"]), f"{r['gpus_per_replica']} GPUs TP{r['tp']} PP{r['pp']} EP{r['ep']} {r['precision']}",
            str(r["replicas"]), ttft, f"{r['itl_ms']:,.1f}", f"{Decimal(str(r['cost_per_hour'])):,.2f}",
            f"{Decimal(str(r['cost_per_million_output_tokens'])):,.4f}",
        )  # fmt: skip
    console.print(table)
    if missed:
        console.print(f"[red]cannot meet the SLO within {max_gpus} GPUs per replica:[/red] {', '.join(missed)}")
