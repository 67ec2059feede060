"""Every policy on every provided trace at two load levels, side by side.

Usage: python benchmarks/sched_quality.py [--traces DIR] [--quick] [--policies a,b+switch,c@field=N] [--only NAME] [--json OUT]

Reads the public traces in ../shared/data/traces (or --traces). For each trace the cluster is the one the
trace's own paper simulated (sizes below); load level 1 replays arrivals as recorded, level 2 compresses
them (the trace's `high_load` factor). Checks printed at the end:
  * the default policy beats `fifo` and `las` on average JCT on every trace and load (strictly lower),
    and is no worse on waste;
  * default's waste <= 1% of the GPU-hours during which work was queued;
  * default's average JCT <= 1.5x that of `oracle-srsf` (the clairvoyant reference, not a policy) at load x1.
Runs each simulation in its own process (2 at a time on 2 cores); prints medians of nothing — the
simulator is deterministic, only its wall time varies.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from suanli.sched import POLICIES, SchedulerConfig, configured
from suanli.sim import SimConfig, simulate
from suanli.sim.oracle import ORACLE_POLICIES, ORACLE_SRSF
from suanli.sim.slicing import first_n, scale_load
from suanli.topology import load_preset, parse
from suanli.traces import read_trace
from suanli.traces.files import open_text_file

DEFAULT_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"


@dataclass(frozen=True)
class Case:
    name: str
    spec: str  # FORMAT:relative path (globs merged)
    cluster: str | dict
    high_load: float
    quick_jobs: int | None = None
    skip: int = 0  # leave out the first N jobs (by submit time): a later slice of a long trace


PHILLY_2490 = {
    "name": "philly-2490",
    "node_groups": [
        {"name": "v100", "count": 311, "gpu": "V100", "gpus_per_node": 8, "nics": 1},
        {"name": "v100x2", "count": 1, "gpu": "V100", "gpus_per_node": 2, "nics": 1},
    ],
    "fabric": "ib-hdr",
    "nodes_per_leaf": 32,
    "leaf_oversubscription": 2.0,
}

# Held out while the policies were changed: other files or later slices of the same trace families.
HELD_OUT = (
    Case(
        "philly-later", "philly:philly-derived/pollux_philly.csv.gz", PHILLY_2490, 4.0, quick_jobs=15_000, skip=30_000
    ),
    Case("gavel-msr-seed1", "gavel:gavel-sim/msr/seed=1/*.trace.gz", "125x4:V100", 2.0, quick_jobs=6_000),
    Case("pollux-w2", "pollux:pollux-sim/workloads/workload-2.csv", "16x4:T4", 1.5),
    Case("shockwave-220", "shockwave:shockwave-sim/traces/220_*.trace", "8x4:V100", 1.5),
)

CASES = (
    Case("philly", "philly:philly-derived/pollux_philly.csv.gz", PHILLY_2490, 4.0, quick_jobs=15_000),
    Case("gavel-msr", "gavel:gavel-sim/msr/seed=0/*.trace.gz", "125x4:V100", 2.0, quick_jobs=6_000),
    Case("pollux", "pollux:pollux-sim/workloads/workload-1.csv", "16x4:T4", 1.5),
    Case("shockwave", "shockwave:shockwave-sim/traces/460_*.trace", "8x4:V100", 1.5),
    Case("tiresias", "tiresias:tiresias-sim/60_job.csv", "16x4:V100", 2.0),
    Case("alibaba-openb", "alibaba-openb:alibaba-gpu-v2023-openb/csv/openb_pod_list_default.csv", "200x8:T4", 2.0),
)


def load_jobs(root: Path, case: Case, quick: bool):
    fmt, pattern = case.spec.split(":", 1)
    jobs = []
    for path in sorted(glob.glob(str(root / pattern))):
        jobs.extend(read_trace(f"{fmt}:{path}", open_text_file))
    jobs.sort(key=lambda j: j.submit_time_s)
    if case.skip:
        jobs = jobs[case.skip :]
        t0 = jobs[0].submit_time_s if jobs else 0.0
        jobs = [replace(j, submit_time_s=j.submit_time_s - t0) for j in jobs]
    if quick and case.quick_jobs:
        jobs = first_n(jobs, case.quick_jobs)
    return jobs


def scheduler_config(variant: str) -> SchedulerConfig:
    """`policy[+switch...][/placement][@field=number...]` → the scheduler configuration it names (switches as
    `suanli sim --policy` takes them; any field by number: `@a=1@b=2`)."""
    name, *knobs = variant.split("@")
    policy, _, placement = name.partition("/")
    extra: dict[str, float] = {}
    for knob in knobs:
        field, _, value = knob.partition("=")
        extra[field] = float(value)
    base = SchedulerConfig(policy=policy) if policy in ORACLE_POLICIES else configured(policy)
    return replace(base, placement=placement or None, **extra)


def run_one(args: tuple) -> dict:
    root, case, policy, load, quick, cap = args
    jobs = load_jobs(Path(root), case, quick)
    if cap:
        jobs = first_n(jobs, cap)
    if load != 1.0:
        jobs = scale_load(jobs, load)
    cluster = load_preset(case.cluster) if isinstance(case.cluster, str) else parse(case.cluster)
    t0 = time.perf_counter()
    res = simulate(jobs, cluster, SimConfig(scheduler=scheduler_config(policy)), clock=time.perf_counter)
    out = res.summary()
    out.update(trace=case.name, policy=policy, load=load, gpus=cluster.n_gpus, wall_s=time.perf_counter() - t0)
    return out


BREAKDOWN = (
    ("work_gpu_h", "work"),
    ("slowdown_gpu_h", "slowdown"),
    ("preemption_gpu_h", "preempt redo"),
    ("resize_gpu_h", "resize redo"),
    ("elastic_gpu_h", "elastic"),
    ("idle_queued_gpu_h", "idle, work waiting"),
    ("requeued_gpu_h", "preempted, waiting"),
)


def breakdown_table(sub: dict, title: str):
    """Per policy: recorded work and, beside it, each extra as GPU-hours and a share of the work."""
    from rich.table import Table

    t = Table(title=title)
    t.add_column("policy")
    for _, label in BREAKDOWN:
        t.add_column(label, justify="right")
    t.add_column("slowdown by gang size", justify="left")
    for p, r in sub.items():
        work = r["work_gpu_h"] or 1.0
        cells = [f"{r['work_gpu_h']:,.0f}"]
        cells += [f"{r[k]:,.0f} ({r[k] / work:.1%})" for k, _ in BREAKDOWN[1:]]
        sizes = ", ".join(f"{b}: {v:,.0f}" for b, v in r["slowdown_by_size"].items())
        t.add_row(p, *cells, sizes)
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--quick", action="store_true", help="cap the two long traces (Philly, Gavel) at their quick size")
    ap.add_argument("--policies", default=",".join([*POLICIES, ORACLE_SRSF]))
    ap.add_argument("--only", default=None, help="comma-separated case names")
    ap.add_argument("--held-out", action="store_true", help="the held-out cases (other files, later slices)")
    ap.add_argument("--jobs", type=int, default=0, help="replay only the first N jobs of each case")
    ap.add_argument("--x1", action="store_true", help="recorded load only")
    ap.add_argument("--json", type=Path, default=None, help="also write all rows to this file")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    if not args.traces.exists():
        print(f"traces not found: {args.traces}", file=sys.stderr)
        return 2
    policies = args.policies.split(",")
    pool_cases = HELD_OUT if args.held_out else CASES
    cases = [c for c in pool_cases if not args.only or c.name in args.only.split(",")]
    loads = {c.name: (1.0,) if args.x1 else (1.0, c.high_load) for c in cases}
    work = [
        (str(args.traces), c, p, load, args.quick, args.jobs) for c in cases for load in loads[c.name] for p in policies
    ]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        rows = list(pool.map(run_one, work))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))

    from rich.console import Console
    from rich.table import Table

    con = Console(width=180)
    failures: list[str] = []
    for case in cases:
        for load in loads[case.name]:
            sub = {r["policy"]: r for r in rows if r["trace"] == case.name and r["load"] == load}
            any_row = next(iter(sub.values()))
            t = Table(title=f"{case.name} x{load:g} load — {any_row['jobs']} jobs on {any_row['gpus']} GPUs")
            for col in (
                "policy",
                "avg JCT h",
                "p99 JCT h",
                "avg queue h",
                "util",
                "useful",
                "waste",
                "frag",
                "preempt",
                "Jain",
                "slowdown",
                "dec p99 ms",
                "wall s",
                "vs fifo JCT",
                "vs oracle JCT",
            ):
                t.add_column(col, justify="left" if col == "policy" else "right")
            fifo = sub.get("fifo")
            oracle = sub.get(ORACLE_SRSF)
            for p, r in sub.items():
                ratio = f"{r['avg_jct_s'] / fifo['avg_jct_s']:.2f}x" if fifo and fifo["avg_jct_s"] else "-"
                vs_oracle = f"{r['avg_jct_s'] / oracle['avg_jct_s']:.2f}x" if oracle and oracle["avg_jct_s"] else "-"
                t.add_row(
                    p,
                    f"{r['avg_jct_s'] / 3600:.2f}",
                    f"{r['p99_jct_s'] / 3600:.1f}",
                    f"{r['avg_queue_s'] / 3600:.2f}",
                    f"{r['utilization']:.1%}",
                    f"{r['useful_utilization']:.1%}",
                    f"{r['waste_fraction']:.2%}",
                    f"{r['fragmentation']:.2%}",
                    str(r["preemptions"]),
                    f"{r['jain_fairness']:.3f}",
                    f"{r['avg_placement_slowdown']:.3f}",
                    f"{r['decision_p99_ms']:.2f}",
                    f"{r['wall_s']:.1f}",
                    ratio,
                    vs_oracle,
                    style="bold" if p == "default" else ("italic" if p == ORACLE_SRSF else ""),
                )
            con.print(t)
            con.print(
                breakdown_table(sub, f"{case.name} x{load:g}: where the GPU-time went (GPU-h; % of recorded work)")
            )
            d = sub.get("default")
            if d is None:
                continue
            for base in ("fifo", "las"):
                b = sub.get(base)
                if b is None:
                    continue
                if not d["avg_jct_s"] < b["avg_jct_s"]:
                    failures.append(
                        f"{case.name} x{load:g}: default avg JCT {d['avg_jct_s']:.0f}s !< {base} {b['avg_jct_s']:.0f}s"
                    )
                if d["waste_fraction"] > b["waste_fraction"] + 1e-9:
                    failures.append(
                        f"{case.name} x{load:g}: default waste {d['waste_fraction']:.3%} > {base} {b['waste_fraction']:.3%}"
                    )
            if d["waste_fraction"] > 0.01:
                failures.append(f"{case.name} x{load:g}: default waste {d['waste_fraction']:.2%} > 1%")
            if load == 1.0 and oracle and d["avg_jct_s"] > 1.5 * oracle["avg_jct_s"]:
                ratio = d["avg_jct_s"] / oracle["avg_jct_s"]
                failures.append(f"{case.name} x1: default avg JCT {ratio:.2f}x {ORACLE_SRSF}'s > 1.5x")
    if failures:
        con.print("[red]targets missed:[/]")
        for f in failures:
            con.print(f"  - {f}")
    else:
        con.print(
            f"[green]all targets met: default beats fifo and las on avg JCT, no worse on waste, waste <= 1%, "
            f"avg JCT <= 1.5x {ORACLE_SRSF} at recorded load[/]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
