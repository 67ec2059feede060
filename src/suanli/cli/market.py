"""Market commands: what is on offer, and what a training run would take and cost (`suanli offers`, `quote`)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from suanli.cli import credentials as cred
from suanli.cli.common import (
    JsonOpt,
    check_choice,
    check_positive,
    console,
    emit_json,
    fail,
    human_count,
    human_duration,
    parse_count,
    pct,
    user_errors,
)
from suanli.cli.credentials import ServerOpt, jsonable, money, org_id, unit_price


def offers(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """What is for rent: per GPU model, how many, how many free (plans' idle reservations are taken), the largest
    free NVLink/leaf blocks, how many plans reserve, prices."""
    with cred.api(server) as c:
        rows = c.offers()
        book = c.prices() if not rows and not json_out else None
    if json_out:
        emit_json(jsonable(rows))
        return
    if not rows:
        console.print("no GPUs on offer yet: an operator registers nodes with 'suanli admin register'")
        if book is not None:
            _host_line(book.get("cpu_core_hour"), book.get("memory_gib_hour"), book.get("currency", ""))
        return
    cur = rows[0].currency
    table = Table(title=f"offers (prices in {cur} per GPU-hour)")
    for col, just in (("GPU", "left"), ("memory", "right"), ("total", "right"), ("free", "right"),
                      ("free NVLink", "right"), ("free leaf", "right"), ("reserved", "right"), ("nodes", "right"),
                      ("on demand", "right"), ("spot", "right"), ("plan/month", "right"), ("usage", "right")):  # fmt: skip
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for o in rows:
        table.add_row(
            o.gpu, f"{o.memory_gb:g} GB", f"{o.total:,}", f"{o.free:,}", str(o.largest_free_nvlink),
            str(o.largest_free_leaf), f"{o.reserved:,}", f"{o.nodes:,}", money(o.on_demand_per_gpu_hour),
            money(o.spot_per_gpu_hour), money(o.plans_per_gpu_hour.get("monthly")),
            usage_range(o.usage_floor_per_gpu_hour, o.usage_per_gpu_hour),
        )  # fmt: skip
    console.print(table)
    console.print("free NVLink, free leaf: the largest free block in one NVLink domain, in one leaf switch")
    _host_line(rows[0].cpu_per_core_hour, rows[0].memory_per_gib_hour, cur)
    if any(o.usage_per_gpu_hour is not None for o in rows):
        console.print("usage (billing: usage): idle-busy; a GPU-hour costs between its idle price and its busy price, "
                      "by its measured activity; see docs/billing.md")  # fmt: skip


def usage_range(idle: Decimal | str | None, busy: Decimal | str | None) -> str:
    """`2.13-10.63` (billing: usage, from idle to fully active), or '-' when not offered."""
    return "-" if idle is None or busy is None else f"{money(idle)}-{money(busy)}"


def _host_line(cpu: Decimal | str | None, memory: Decimal | str | None, currency: str) -> None:
    console.print(f"host CPU {unit_price(cpu)} {currency} per core-hour, memory {unit_price(memory)} {currency} per "
                  "GiB-hour: what CPU-only work pays (1 core and 2 GiB unless it asks for more), and GPU work for "
                  "the cpus and memory it asks for; spot: times the spot factor")  # fmt: skip


def quote(
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model preset, e.g. llama3.1-8b.")] = None,
    spec: Annotated[
        Path | None,
        typer.Option("--spec", metavar="FILE.yaml", help="Price a workload spec instead (CPU-only work too)."),
    ] = None,
    tokens: Annotated[str | None, typer.Option("--tokens", help="Tokens to train on (1e9, 300B, 15T).")] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Optimizer steps (instead of --tokens).")] = None,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU model, or 'any'.")] = "any",
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPU count (default: try a range).")] = None,
    precision: Annotated[
        str | None,
        typer.Option(
            "--precision", help="bf16|fp16|fp8|fp8-blockwise|mxfp8 (Blackwell)|nvfp4 (Blackwell)|fp32 (default bf16)."
        ),
    ] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="Sequence length (default 4096).")] = None,
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", help="Sequences per step (default 256).")
    ] = None,
    spot: Annotated[bool, typer.Option("--spot", help="Price at the spot rate (preemptible).")] = False,
    usage: Annotated[
        bool, typer.Option("--usage", help="Price billed by usage: from GPUs idle to fully active.")
    ] = False,
    rank: Annotated[str, typer.Option("--rank", help="cheapest|fastest.")] = "cheapest",
    limit: Annotated[int, typer.Option("--limit", help="Most quotes to show.")] = 10,
    cpus_per_gpu: Annotated[
        str | None, typer.Option("--cpus-per-gpu", help="Host CPU cores a GPU asks for (priced in).")
    ] = None,
    memory_per_gpu: Annotated[
        str | None, typer.Option("--memory-per-gpu", help="Host memory a GPU asks for, e.g. 64Gi (priced in).")
    ] = None,
    serve: Annotated[
        bool, typer.Option("--serve", help="Price serving --model at --rps instead (replicas, GPUs, per 1M tokens).")
    ] = False,
    rps: Annotated[str | None, typer.Option("--rps", help="--serve: requests per second.")] = None,
    input_len: Annotated[int, typer.Option("--input-len", help="--serve: prompt tokens a request.")] = 1024,
    output_len: Annotated[int, typer.Option("--output-len", help="--serve: output tokens a request.")] = 256,
    slo_ttft_ms: Annotated[
        str, typer.Option("--slo-ttft-ms", help="--serve: mean time to first token, at most.")
    ] = "2000",
    slo_itl_ms: Annotated[
        str, typer.Option("--slo-itl-ms", help="--serve: mean inter-token latency, at most.")
    ] = "100",
    volume: Annotated[
        str | None,
        typer.Option("--volume", metavar="SIZE", help="Price volume storage of this size too (200Gi, 500G)."),
    ] = None,
    hours: Annotated[int, typer.Option("--hours", help="Hours of --volume storage to price (720: a month).")] = 720,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """What a training run would take and cost on each feasible offer, best first; or, with --spec, what a workload
    spec would pay per hour (GPUs and host CPU and memory) on each GPU model that could run it, and for its
    duration; or, with --serve, what serving a model at --rps would take (replicas, GPUs) and cost per 1M tokens.
    --volume SIZE [--hours H] prices volume storage as well (alone: only that)."""
    if serve:
        from suanli.cli.serving import quote_serve

        if model is None or rps is None or spec is not None or usage:
            fail("--serve needs --model and --rps (and takes neither --spec nor --usage)")
        quote_serve(model, rps, input_len=input_len, output_len=output_len, slo_ttft_ms=slo_ttft_ms,
                    slo_itl_ms=slo_itl_ms, gpu=gpu, precision=precision, spot=spot, server=server,
                    json_out=json_out)  # fmt: skip
        return
    if volume is not None:
        check_positive(hours, "--hours")
        alone = model is None and spec is None
        if json_out and not alone:
            fail("--volume: with --json, price storage alone (without --model or --spec)")
        with cred.api(server) as c, user_errors():
            sq = c.quote_storage(volume, hours)
        if json_out:
            emit_json(jsonable(sq))
            return
        console.print(f"volume storage: {volume} ({sq.bytes:,} bytes) for {hours:,} h at {unit_price(sq.storage_gb_month)}"
                      f" {sq.currency} per GB-month: {unit_price(sq.per_hour)} an hour, {unit_price(sq.cost)} "
                      f"{sq.currency}")  # fmt: skip
        if alone:
            return
    if (model is None) == (spec is None):
        fail("give exactly one of --model (a training run) and --spec (a workload spec)")
    if spec is not None:
        _quote_spec(spec, server, json_out)
        return
    assert model is not None
    if (tokens is None) == (steps is None):
        fail("give exactly one of --tokens and --steps")
    if spot and usage:
        fail("give at most one of --spot and --usage")
    n_tokens = parse_count(tokens) if tokens is not None else None
    for value, option in ((steps, "--steps"), (gpus, "--gpus"), (seq_len, "--seq-len"),
                          (global_batch, "--global-batch"), (limit, "--limit")):  # fmt: skip
        check_positive(value, option)
    rank = check_choice(rank, ("cheapest", "fastest"), "--rank")
    cpus = cred.parse_amount(cpus_per_gpu, "--cpus-per-gpu") if cpus_per_gpu is not None else None
    if precision is not None:
        precision = check_choice(precision, ("bf16", "fp16", "fp8", "fp32"), "--precision")
    with cred.api(server) as c:
        rows = c.quote(
            model, tokens=n_tokens, steps=steps, gpu=gpu, gpus=gpus, precision=precision, seq_len=seq_len,
            global_batch=global_batch, billing_mode="spot" if spot else "usage" if usage else None, rank=rank,
            limit=limit,
            cpus_per_gpu=cpus, memory_per_gpu=memory_per_gpu,
        )  # fmt: skip
    if json_out:
        emit_json(jsonable(rows))
        return
    if not rows:  # (a GPU count no parallel plan fits is the server's 422, with why)
        typer.echo("no feasible offer: no priced GPU model has the free GPUs this run needs now (see 'suanli offers')",
                   err=True)  # fmt: skip
        raise typer.Exit(1)
    from suanli.cli.jobs import plan_label

    size = human_count(n_tokens) + " tokens" if n_tokens is not None else f"{steps:,} steps"
    mode = "spot" if spot else "by usage: GPUs idle-fully active" if usage else "on demand"
    table = Table(title=f"{model}, {size}, {mode}, {rank} first")
    host = any(q.host_rate_per_hour for q in rows)
    cols = ("cluster", "GPU", "GPUs", "plan", "step", "tokens/s", "MFU", "time", "rate/h", *(("host/h",) if host else ()),
            "cost", "free now")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col in ("cluster", "GPU", "plan") else "right", no_wrap=col != "plan")
    for q in rows:
        table.add_row(
            q.cluster, q.gpu, str(q.gpus), plan_label(q.plan), f"{q.step_time_s:.3g} s", human_count(q.tokens_per_s),
            pct(q.mfu), human_duration(q.total_time_s), usage_range(q.floor_rate_per_hour, q.rate_per_hour)
            if q.floor_rate_per_hour is not None else money(q.rate_per_hour),
            *((unit_price(q.host_rate_per_hour),) if host else ()),
            f"{usage_range(q.floor_cost, q.cost) if q.floor_cost is not None else money(q.cost)} {q.currency}",
            "yes" if q.available_now else "no",
        )  # fmt: skip
    console.print(table)


def _quote_spec(file: Path, server: str | None, json_out: bool) -> None:
    """`suanli quote --spec FILE`: the workload's rate on each GPU model that could run it, and its cost."""
    from suanli.workloads.host import host_text

    with cred.api(server) as c, user_errors():
        rows = c.quote_workload(file)
    if json_out:
        emit_json(jsonable(rows))
        return
    cur = rows[0].currency if rows else ""
    table = Table(title=f"{file.name}: price per hour in {cur}, and for its duration")
    for col in ("GPU", "GPUs", "host", "billing", "GPUs/h", "host/h", "rate/h", "duration", "cost"):
        table.add_column(col, justify="left" if col in ("GPU", "host", "billing") else "right")
    for q in rows:
        table.add_row(
            q.gpu or "- (CPU only)", str(q.gpus), host_text(q.cpu_milli, q.memory_mib), q.billing_mode,
            unit_price(q.gpu_rate_per_hour), unit_price(q.host_rate_per_hour),
            unit_price(q.rate_per_hour) if q.floor_rate_per_hour is None
            else f"{unit_price(q.floor_rate_per_hour)}-{unit_price(q.rate_per_hour)}",
            human_duration(q.duration_s) if q.duration_s is not None else "-",
            "- (no duration)" if q.cost is None else money(q.cost) if q.floor_cost is None
            else usage_range(q.floor_cost, q.cost),
        )  # fmt: skip
    console.print(table)
    if any(q.floor_rate_per_hour is not None for q in rows):
        console.print("billing: usage: rate/h and cost run from the GPUs idle to fully active (GPUs/h: fully "
                      "active); what it pays lies between, by their measured activity")  # fmt: skip


plans_app = typer.Typer(
    no_args_is_help=True, help="Reserved plans: GPUs for an hour, day, week or month, paid upfront."
)


@plans_app.command("buy")
def plans_buy(
    plan: Annotated[str, typer.Option("--plan", help="hourly|daily|weekly|monthly (the operator's price book).")],
    gpu: Annotated[str, typer.Option("--gpu", help="GPU model, e.g. H20.")],
    gpus: Annotated[int, typer.Option("--gpus", help="How many GPUs.")],
    org: Annotated[str | None, typer.Option("--org", help="Organisation id or name (default: your own).")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Idempotency key: retrying with it buys once.")] = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Buy a plan, starting now; its price is taken from the balance now. Refused when the balance does not cover it,
    or when the GPUs are not there to reserve (other plans hold them, or running on-demand work, which is not stopped
    for a plan; spot work gives way). While it runs, the scheduler keeps its idle GPUs for its work."""
    check_positive(gpus, "--gpus")
    with cred.api(server) as c:
        p = c.plan_buy(plan, gpu, gpus, org_id(c, org), key=key)
    if json_out:
        emit_json(jsonable(p))
        return
    console.print(f"bought {p.plan} plan {p.id}: {p.gpus} x {p.gpu_model} until {p.ends_at:%Y-%m-%d %H:%M} UTC "
                  f"for {money(p.price)}")  # fmt: skip


@plans_app.command("list")
def plans_list(
    org: Annotated[str | None, typer.Option("--org", help="Organisation id or name (default: your own).")] = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Plans the organisation bought, newest first."""
    with cred.api(server) as c:
        rows = c.plans(org_id(c, org))
    if json_out:
        emit_json(jsonable(rows))
        return
    table = Table(title="plans")
    for col in ("id", "plan", "GPUs", "from", "until", "price", "active"):
        table.add_column(col)
    for p in rows:
        table.add_row(p.id, p.plan, f"{p.gpus} x {p.gpu_model}", f"{p.starts_at:%Y-%m-%d %H:%M}",
                      f"{p.ends_at:%Y-%m-%d %H:%M}", money(p.price), "yes" if p.active else "no")  # fmt: skip
    console.print(table)
