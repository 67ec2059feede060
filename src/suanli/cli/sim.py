"""`suanli sim`: replay a trace (or a synthetic workload) through the scheduler, one run per policy."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from suanli import traces
from suanli.cli import common
from suanli.cli.common import JsonOpt, console, fail, user_errors
from suanli.cli.terminal import SafeConsole
from suanli.sched import KNOBS, POLICIES, SchedulerConfig, config_name, configured
from suanli.sim import SimConfig, SimResult, TraceJob, simulate
from suanli.sim import report as rep
from suanli.sim.oracle import ORACLE_POLICIES, ORACLE_SRSF
from suanli.sim.slicing import first_n, scale_load
from suanli.sim.synthetic import synthetic_jobs
from suanli.topology import Cluster

SYNTHETIC = "synthetic"
DEFAULT_POLICIES = ("fifo", "default")
DEFAULT_MTTR_H = SimConfig().mttr_h

_W = "Workload"
_R = "Replay"
_TRACE = f"FORMAT:PATH with FORMAT one of {', '.join(traces.FORMATS)}; or {SYNTHETIC}:N for N synthetic jobs (--seed)."
_POLICY = (
    f"Scheduling policy (repeatable or comma-separated): {', '.join(POLICIES)}, or 'all' (default: "
    f"{', '.join(DEFAULT_POLICIES)}); '{ORACLE_SRSF}' is a reference that knows every job's duration (no real "
    "scheduler does; the server refuses it). Switches follow a policy with '+': "
    f"default+gittins+elastic_shrink+grow_las ({', '.join(KNOBS)}; docs/scheduling.md)."
)


def _err_console() -> Console:
    return SafeConsole(stderr=True)


# ---- inputs --------------------------------------------------------------------------------------------------
def load_jobs(spec: str, seed: int, err: Console | None) -> list[TraceJob]:
    """The jobs of ``FORMAT:PATH`` or ``synthetic:N``; notes on skipped rows go to `err` (when given)."""
    fmt, _, rest = spec.partition(":")
    if fmt.strip().lower() == SYNTHETIC:
        try:
            n = int(rest.strip())
        except ValueError:
            n = -1
        if n <= 0:
            fail(f"invalid --trace {spec!r}: {SYNTHETIC}:N needs a positive number of jobs N")
        return synthetic_jobs(n, seed)
    try:
        traces.parse_spec(spec)
    except traces.TraceError as e:
        fail(f"{e} (or {SYNTHETIC}:N)")
    result = traces.read_trace_result(spec)
    if err is not None and (result.skipped or result.notes):
        parts = []
        if result.skipped:
            what = ", ".join(f"{k}: {v:,}" for k, v in sorted(result.skipped.items()))
            parts.append(f"skipped {result.n_skipped:,} row{'' if result.n_skipped == 1 else 's'} ({what})")
        if result.notes:
            parts.append("approximated: " + ", ".join(f"{k}: {v:,}" for k, v in sorted(result.notes.items())))
        err.print(f"[dim]{spec}: {len(result.jobs):,} jobs; {'; '.join(parts)}[/dim]")
    return result.jobs


def resolve_policies(names: list[str] | None) -> list[str]:
    """Policy names in the order given, without repeats; 'all' expands to every policy and the clairvoyant reference."""
    out: list[str] = []
    for item in names or list(DEFAULT_POLICIES):
        for raw in item.split(","):
            name = raw.strip().lower()
            if not name:
                continue
            if name == "default":
                name = SchedulerConfig().policy
            expanded = [*POLICIES, *ORACLE_POLICIES] if name == "all" else [name]
            for n in expanded:
                if "+" in n and n.split("+", 1)[0] in POLICIES:
                    try:
                        n = config_name(configured(n))
                    except ValueError as e:
                        fail(str(e))
                elif n not in POLICIES and n not in ORACLE_POLICIES:
                    fail(f"unknown policy {raw.strip()!r}; known: {', '.join([*POLICIES, *ORACLE_POLICIES])}, all")
                if n not in out:
                    out.append(n)
    if not out:
        fail("--policy needs a policy name")
    return out


def _command_line(**opts: Any) -> str:
    """The `suanli sim` invocation these options amount to (defaults left out), for the report."""
    parts = ["suanli", "sim", "--trace", opts["trace"], "--cluster", opts["cluster"]]
    for p in opts["policy"] or []:
        parts += ["--policy", p]
    if opts["jobs"] is not None:
        parts += ["--jobs", str(opts["jobs"])]
    if opts["load_scale"] != 1.0:
        parts += ["--load-scale", f"{opts['load_scale']:g}"]
    if opts["seed"] != 0:
        parts += ["--seed", str(opts["seed"])]
    if opts["mtbf_hours"] is not None:
        parts += ["--mtbf-hours", f"{opts['mtbf_hours']:g}"]
    if opts["mttr_hours"] != DEFAULT_MTTR_H:
        parts += ["--mttr-hours", f"{opts['mttr_hours']:g}"]
    parts += ["--report", str(opts["report"])]
    if opts["json_out"]:
        parts.append("--json")
    return shlex.join(parts)


# ---- output --------------------------------------------------------------------------------------------------
def _short_trace(spec: str) -> str:
    """``FORMAT:file name`` (no folders), for a table title that fits on one line."""
    fmt, sep, path = spec.partition(":")
    return f"{fmt}:{Path(path).name}" if sep and path else spec


def _table(summaries: rep.Summaries, heading: str) -> Table:
    table = Table(title=heading, min_width=min(len(heading) + 2, console.width))  # keep the title on one line
    table.add_column("metric", no_wrap=True)
    for name in summaries:
        table.add_column(name, justify="right")
    for label, cells in rep.metric_rows(summaries):
        table.add_row(label, *(f"[bold green]{text}[/bold green]" if is_best else text for text, is_best in cells))
    return table


def _scheduler(name: str) -> SchedulerConfig:
    """The configuration a resolved policy name stands for (the clairvoyant reference is the simulator's own)."""
    return SchedulerConfig(policy=name) if name in ORACLE_POLICIES else configured(name)


def _replay(
    jobs: list[TraceJob], cluster: Cluster, policies: list[str], config: dict[str, Any], err: Console | None
) -> dict[str, SimResult]:
    """One simulation per policy; a progress bar per policy on `err` (none when `err` is None)."""
    results: dict[str, SimResult] = {}
    if err is None:
        for name in policies:
            cfg = SimConfig(scheduler=_scheduler(name), **config)
            results[name] = simulate(jobs, cluster, cfg, clock=time.perf_counter)
        return results
    columns = (
        TextColumn("{task.description:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err) as progress:
        for name in policies:
            task = progress.add_task(name, total=len(jobs))

            def update(done: int, total: int, task: Any = task) -> None:
                progress.update(task, completed=done, total=total)

            cfg = SimConfig(scheduler=_scheduler(name), **config)
            results[name] = simulate(jobs, cluster, cfg, clock=time.perf_counter, progress=update)
    return results


# ---- the command -----------------------------------------------------------------------------------------------
def sim(
    trace: Annotated[str, typer.Option("--trace", "-t", metavar="FORMAT:PATH", help=_TRACE, rich_help_panel=_W)],
    cluster: Annotated[
        str, typer.Option("--cluster", "-c", metavar="NAME|FILE", help=common._CLUSTER, rich_help_panel=_W)
    ],
    policy: Annotated[
        list[str] | None, typer.Option("--policy", "-p", metavar="NAME", help=_POLICY, rich_help_panel=_R)
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option("--jobs", "-n", help="Replay only the first N jobs (by submit time).", rich_help_panel=_W),
    ] = None,
    load_scale: Annotated[
        float,
        typer.Option(
            "--load-scale", help="Arrivals X times faster (2 = twice the load; 0.5 = half).", rich_help_panel=_W
        ),
    ] = 1.0,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of synthetic:N and of node failures.", rich_help_panel=_R)
    ] = 0,
    mtbf_hours: Annotated[
        float | None,
        typer.Option(
            "--mtbf-hours", help="Per-node mean time between failures (default: no failures).", rich_help_panel=_R
        ),
    ] = None,
    mttr_hours: Annotated[
        float, typer.Option("--mttr-hours", help="Mean time to repair a failed node.", rich_help_panel=_R)
    ] = DEFAULT_MTTR_H,
    report: Annotated[
        Path | None,
        typer.Option(
            "--report",
            metavar="DIR",
            help="Write jct_cdf.png, utilization.png, queue.png, gpu_time.png (where the GPU-time went) and summary.md into DIR.",
            file_okay=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Replay a trace through the scheduler under each policy; compare JCT, utilization, waste, fairness."""
    err = None if json_out else _err_console()
    with user_errors():
        names = resolve_policies(policy)
        if jobs is not None and jobs <= 0:
            fail(f"--jobs must be positive (got {jobs})")
        common.check_positive(load_scale, "--load-scale")
        common.check_positive(mtbf_hours, "--mtbf-hours")
        common.check_positive(mttr_hours, "--mttr-hours")
        c = common.load_cluster(cluster)
        workload = load_jobs(trace, seed, err)
        if jobs is not None:
            workload = first_n(workload, jobs)
        workload = scale_load(workload, load_scale)
        if not workload:
            fail(f"{trace}: no jobs to replay")
        if report is not None:
            report.mkdir(parents=True, exist_ok=True)
    config = {"seed": seed, "node_mtbf_h": mtbf_hours, "mttr_h": mttr_hours}
    results = _replay(workload, c, names, config, err)
    summaries = rep.summarize(results)
    heading = rep.title(trace, c.name, c.n_gpus, len(workload), load_scale)
    if json_out:
        common.emit_json(
            {"trace": trace, "cluster": c.name, "jobs": len(workload), "load_scale": load_scale, "policies": summaries}
        )
    else:
        short = rep.title(_short_trace(trace), c.name, c.n_gpus, len(workload), load_scale)
        console.print(_table(summaries, short))
    if report is not None:
        command = _command_line(
            trace=trace, cluster=cluster, policy=policy, jobs=jobs, load_scale=load_scale, seed=seed,
            mtbf_hours=mtbf_hours, mttr_hours=mttr_hours, report=report, json_out=json_out,
        )  # fmt: skip
        with user_errors():
            paths = rep.write_report(
                report, results, heading=heading, command=command, n_gpus=c.n_gpus, summaries=summaries
            )
        for p in paths:
            typer.echo(f"wrote {p}", err=json_out)
