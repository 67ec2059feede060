"""Rendering replay results: the metric rows `suanli sim` prints, the plots and the markdown summary.

Everything here is a function of `SimResult`s (keyed by policy name); only `write_report` touches the file
system. matplotlib is imported on first use (with the Agg backend), so the metric rows stay cheap to import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from suanli.sim.metrics import SimResult

Better = Literal["min", "max"] | None
HOUR = 3600.0


def _hours(x: float) -> str:
    return f"{x / HOUR:,.2f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _times(x: float) -> str:
    return f"{x:.3f}x"


def _int(x: float) -> str:
    return f"{int(x):,}"


def _ms(x: float) -> str:
    return f"{x:.2f}"


def _secs(x: float) -> str:
    return f"{x:.2f}"


def _gpu_h(x: float) -> str:
    return f"{x:,.1f}"


@dataclass(frozen=True)
class Metric:
    key: str  # a key of `SimResult.summary()`
    label: str
    fmt: Callable[[float], str]
    better: Better = None  # which way is better, for highlighting; None: not a quality measure


METRICS: tuple[Metric, ...] = (
    Metric("avg_jct_s", "avg JCT (h)", _hours, "min"),
    Metric("p50_jct_s", "p50 JCT (h)", _hours, "min"),
    Metric("p95_jct_s", "p95 JCT (h)", _hours, "min"),
    Metric("p99_jct_s", "p99 JCT (h)", _hours, "min"),
    Metric("avg_queue_s", "avg queueing delay (h)", _hours, "min"),
    Metric("makespan_s", "makespan (h)", _hours, "min"),
    Metric("utilization", "utilization", _pct),  # not a quality measure: slow placements raise it too
    Metric("useful_utilization", "useful utilization", _pct, "max"),
    Metric("waste_fraction", "waste (idle while queued)", _pct, "min"),
    Metric("fragmentation", "fragmentation", _pct, "min"),
    Metric("avg_placement_slowdown", "avg placement slowdown", _times, "min"),
    Metric("jain_fairness", "Jain fairness", lambda x: f"{x:.3f}", "max"),
    Metric("worst_tenant_slowdown", "worst tenant slowdown", _times, "min"),
    Metric("preemptions", "preemptions", _int),
    Metric("failures", "node failures", _int),
    Metric("finished", "jobs finished", _int),
    Metric("queued", "jobs still queued", _int),
    Metric("running", "jobs still running", _int),
    Metric("unschedulable", "jobs unschedulable", _int),
    Metric("work_gpu_h", "GPU-h: recorded work", _gpu_h),
    Metric("slowdown_gpu_h", "GPU-h: placement slowdown", _gpu_h, "min"),
    Metric("preemption_gpu_h", "GPU-h: redone after preemption", _gpu_h, "min"),
    Metric("failure_gpu_h", "GPU-h: redone after failures", _gpu_h, "min"),
    Metric("resize_gpu_h", "GPU-h: redone after resizes", _gpu_h, "min"),
    Metric("elastic_gpu_h", "GPU-h: elastic scaling (<0 paid)", _gpu_h),
    Metric("idle_queued_gpu_h", "GPU-h: idle while work waited", _gpu_h, "min"),
    Metric("requeued_gpu_h", "GPU-h: asked by preempted jobs waiting", _gpu_h, "min"),
    Metric("decision_p50_ms", "decision p50 (ms)", _ms),
    Metric("decision_p99_ms", "decision p99 (ms)", _ms),
    Metric("replay_wall_s", "replay wall time (s)", _secs),
)


Summaries = Mapping[str, Mapping[str, Any]]  # policy name → `SimResult.summary()`


def summarize(results: Mapping[str, SimResult]) -> dict[str, dict[str, Any]]:
    """`SimResult.summary()` per policy (compute it once: it copies the timeline)."""
    return {name: r.summary() for name, r in results.items()}


def best(summaries: Summaries, key: str, better: Literal["min", "max"] = "min") -> list[str]:
    """The policies with the best value of `key` (several on a tie); empty when there are none."""
    values = {name: s[key] for name, s in summaries.items()}
    if not values:
        return []
    target = min(values.values()) if better == "min" else max(values.values())
    tol = 1e-9 * max(1.0, abs(target))
    return [name for name, v in values.items() if abs(v - target) <= tol]


def metric_rows(summaries: Summaries) -> list[tuple[str, list[tuple[str, bool]]]]:
    """One row per metric: its label and, per policy (in `summaries` order), the formatted cell and whether
    it shows the best value of the row. Only quality measures are marked, and only where the shown values
    differ (a cell that reads the same as the best one is marked too)."""
    rows = []
    for m in METRICS:
        cells = [m.fmt(s[m.key]) for s in summaries.values()]
        marks = [False] * len(cells)
        winners = best(summaries, m.key, m.better) if m.better is not None else []
        if winners and len(set(cells)) > 1:
            top = m.fmt(summaries[winners[0]][m.key])
            marks = [c == top for c in cells]
        rows.append((m.label, list(zip(cells, marks, strict=True))))
    return rows


def title(trace: str, cluster: str, n_gpus: int, jobs: int, load_scale: float = 1.0) -> str:
    load = f", load x{load_scale:g}" if load_scale != 1.0 else ""
    return f"{trace} on {cluster} ({n_gpus:,} GPUs), {jobs:,} jobs{load}"


# ---- markdown ------------------------------------------------------------------------------------------------
def _winners(summaries: Summaries, key: str, fmt: Callable[[float], str]) -> str:
    names = best(summaries, key, "min")
    if not names:
        return "-"
    value = fmt(summaries[names[0]][key])
    if len(names) == len(summaries) and len(names) > 1:
        return f"all policies tie ({value})"
    tie = " (tie)" if len(names) > 1 else ""
    return f"{', '.join(f'**{n}**' for n in names)}{tie}: {value}"


def markdown(summaries: Summaries, heading: str, command: str, plots: Sequence[str] = ()) -> str:
    """The summary document: heading, command line, metric table (best values in bold) and the winners."""
    names = list(summaries)
    lines = [f"# suanli sim: {heading}", "", "Produced by:", "", "```sh", command, "```", ""]
    lines.append("| metric | " + " | ".join(names) + " |")
    lines.append("|---|" + "---:|" * len(names))
    for label, cells in metric_rows(summaries):
        shown = [f"**{text}**" if is_best else text for text, is_best in cells]
        lines.append(f"| {label} | " + " | ".join(shown) + " |")
    lines += [
        "",
        f"- Best on average JCT: {_winners(summaries, 'avg_jct_s', lambda x: f'{x / HOUR:,.2f} h = {x:,.0f} s')}",
        f"- Best on waste (idle GPU-time while work was queued): {_winners(summaries, 'waste_fraction', _pct)}",
    ]
    finished = {s["finished"] for s in summaries.values()}
    if len(finished) > 1:
        lines.append("- Note: the policies finished different numbers of jobs; JCTs cover finished jobs only.")
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{Path(p).stem}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


# ---- plots -----------------------------------------------------------------------------------------------------
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _legend(ax: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)


def plot_jct_cdf(results: Mapping[str, SimResult], path: Path, heading: str) -> None:
    """Empirical CDF of the finished jobs' JCTs per policy, log x axis (hours)."""
    import numpy as np

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    drawn = False
    for name, r in results.items():
        jct = np.sort(np.asarray(r.jct_samples, dtype=float)) / HOUR
        jct = jct[jct > 0]  # a log axis cannot show zero-length jobs
        if jct.size == 0:
            continue
        frac = np.arange(1, jct.size + 1) / jct.size
        ax.step(jct, frac, where="post", label=name)
        drawn = True
    if drawn:
        ax.set_xscale("log")
        _legend(ax)
    else:
        ax.text(0.5, 0.5, "no finished jobs", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of finished jobs")
    ax.set_ylim(0, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"JCT CDF: {heading}", fontsize=9)
    _save(fig, path)


def plot_timeline(
    results: Mapping[str, SimResult], path: Path, series: str, ylabel: str, heading: str, capacity: int | None = None
) -> None:
    """`SimResult.timeline[series]` over simulated time (hours) per policy; a dashed line at `capacity`."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, r in results.items():
        t = [x / HOUR for x in r.timeline.get("t", [])]
        y = r.timeline.get(series, [])
        if t:
            ax.step(t, y, where="pre", label=name, linewidth=1)
    if capacity is not None:
        ax.axhline(capacity, color="grey", linestyle="--", linewidth=1, label=f"capacity ({capacity:,})")
        ax.set_ylim(0, capacity * 1.05)
    ax.set_xlabel("simulated time (h)")
    ax.set_ylabel(ylabel)
    if capacity is None:
        ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    _legend(ax)
    ax.set_title(f"{ylabel}: {heading}", fontsize=9)
    _save(fig, path)


BREAKDOWN_PARTS = (
    ("work_gpu_h", "recorded work"),
    ("slowdown_gpu_h", "placement slowdown"),
    ("preemption_gpu_h", "redone: preemption"),
    ("failure_gpu_h", "redone: failure"),
    ("resize_gpu_h", "redone: resize"),
    ("elastic_gpu_h", "elastic scaling"),
    ("idle_queued_gpu_h", "idle while work waited"),
)


def plot_gpu_time(results: Mapping[str, SimResult], path: Path, heading: str) -> None:
    """Where the GPU-time went, per policy: stacked bars of GPU-hours (allocated parts, then idle while queued)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = list(results)
    bottom = [0.0] * len(names)
    for key, label in BREAKDOWN_PARTS:
        values = [max(0.0, getattr(results[n], key)) for n in names]
        if not any(values):
            continue
        ax.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("GPU-hours")
    ax.tick_params(axis="x", labelrotation=30)
    ax.grid(True, axis="y", alpha=0.3)
    _legend(ax)
    ax.set_title(f"where the GPU-time went: {heading}", fontsize=9)
    _save(fig, path)


def write_report(
    out_dir: str | Path,
    results: Mapping[str, SimResult],
    *,
    heading: str,
    command: str,
    n_gpus: int,
    summaries: Summaries | None = None,
) -> list[Path]:
    """Write jct_cdf.png, utilization.png, queue.png, gpu_time.png and summary.md into `out_dir` (created if needed);
    returns their paths. `summaries` (from `summarize(results)`) saves recomputing them."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    names = ("jct_cdf.png", "utilization.png", "queue.png", "gpu_time.png", "summary.md")
    cdf, util, queue, gpu_time, summary = (folder / n for n in names)
    plot_jct_cdf(results, cdf, heading)
    plot_timeline(results, util, "allocated", "allocated GPUs", heading, capacity=n_gpus)
    plot_timeline(results, queue, "queue", "queued jobs", heading)
    plot_gpu_time(results, gpu_time, heading)
    text = markdown(
        summaries if summaries is not None else summarize(results),
        heading,
        command,
        plots=[p.name for p in (cdf, util, queue, gpu_time)],
    )
    summary.write_text(text, encoding="utf-8")
    return [cdf, util, queue, gpu_time, summary]
