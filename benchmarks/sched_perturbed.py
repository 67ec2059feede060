"""Policies compared over replays with perturbed arrivals: medians of waste and JCT, not one path.

Usage: python benchmarks/sched_perturbed.py [--traces DIR] [--only shockwave,gavel-msr] [--held-out] [--seeds 8]
       [--jitter-s 60] [--policies las,default,oracle-srsf,default/first-fit,default@starvation_s=inf]

One replay of a small trace is one path through a chaotic system: a different tie or a job ending a second
earlier changes everything after it, and waste differences of a tenth of a point between two policies can be
that alone. Here every arrival of the trace (as `benchmarks/sched_quality.py` loads it, `--quick` sizes) is
moved by a uniform draw in +-`--jitter-s` seconds, once per seed, and each policy replays every perturbed
trace at the trace's two load levels. A policy may override its placement (`las/topology`) or numbers of
the scheduler's configuration (`default@starvation_s=inf`, `default@a=1@b=1`), to see which part of a policy makes
a difference. Prints per trace, load and policy the median (and range) of waste, of average JCT and of p99 JCT
(over a few hundred jobs, p99 is two or three jobs: one replay's is a lottery), in
how many seeds its waste was above the first policy's, and the median ratio of its average JCT to `oracle-srsf`'s
(the clairvoyant reference) on the same perturbed trace.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sched_quality import CASES, DEFAULT_DIR, HELD_OUT, load_jobs, scheduler_config
from suanli.sim import SimConfig, simulate
from suanli.sim.slicing import scale_load
from suanli.topology import load_preset, parse


def run_one(args: tuple[str, str, float, str, int, float]) -> tuple[float, float, float]:
    root, trace, load, variant, seed, jitter = args
    case = next(c for c in (*CASES, *HELD_OUT) if c.name == trace)
    jobs = load_jobs(Path(root), case, True)
    if seed:
        rng = np.random.default_rng(seed)
        moved = (max(0.0, j.submit_time_s + float(rng.uniform(-jitter, jitter))) for j in jobs)
        jobs = sorted((replace(j, submit_time_s=t) for j, t in zip(jobs, moved, strict=True)),
                      key=lambda j: j.submit_time_s)  # fmt: skip
    if load != 1.0:
        jobs = scale_load(jobs, load)
    cluster = load_preset(case.cluster) if isinstance(case.cluster, str) else parse(case.cluster)
    summary = simulate(jobs, cluster, SimConfig(scheduler=scheduler_config(variant))).summary()
    return summary["waste_fraction"], summary["avg_jct_s"], summary["p99_jct_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--only", default="shockwave,gavel-msr", help="comma-separated case names of sched_quality.py")
    ap.add_argument("--policies", default="las,default,oracle-srsf", help="the first one is the reference for waste")
    ap.add_argument("--seeds", type=int, default=8, help="perturbed replays per trace and load (seeds 1..N)")
    ap.add_argument("--jitter-s", type=float, default=60.0)
    ap.add_argument("--held-out", action="store_true", help="the held-out cases of sched_quality.py")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    if not args.traces.exists():
        print(f"traces not found: {args.traces}", file=sys.stderr)
        return 2
    variants = args.policies.split(",")
    for v in variants:
        scheduler_config(v)  # a bad name fails here, not in a worker
    cases = [c for c in (HELD_OUT if args.held_out else CASES) if c.name in args.only.split(",")]
    seeds = range(1, args.seeds + 1)
    work = [(str(args.traces), c.name, load, v, s, args.jitter_s)
            for c in cases for load in (1.0, c.high_load) for v in variants for s in seeds]  # fmt: skip
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = dict(zip(work, pool.map(run_one, work), strict=True))

    print(f"{args.seeds} replays per row, arrivals moved by up to +-{args.jitter_s:g} s; medians (min-max)")
    print(
        f"| trace | load | policy | waste | avg JCT h | p99 JCT h | seeds with waste above {variants[0]} "
        "| avg JCT / oracle-srsf |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for c in cases:
        for load in (1.0, c.high_load):
            ref = [results[(str(args.traces), c.name, load, variants[0], s, args.jitter_s)][0] for s in seeds]
            for v in variants:
                rows = [results[(str(args.traces), c.name, load, v, s, args.jitter_s)] for s in seeds]
                waste = [w for w, _, _ in rows]
                jct = [j / 3600 for _, j, _ in rows]
                p99 = [p / 3600 for _, _, p in rows]
                above = sum(w > r + 1e-12 for w, r in zip(waste, ref, strict=True))
                key = (str(args.traces), c.name, load, "oracle-srsf")
                oracle = (
                    [results[(*key, s, args.jitter_s)][1] / 3600 for s in seeds] if "oracle-srsf" in variants else []
                )
                ratio = f"{statistics.median(j / o for j, o in zip(jct, oracle, strict=True)):.2f}x" if oracle else "-"
                print(f"| {c.name} | x{load:g} | {v} | {statistics.median(waste):.3%} ({min(waste):.2%}-"
                      f"{max(waste):.2%}) | {statistics.median(jct):.2f} | {statistics.median(p99):.2f} "
                      f"({min(p99):.1f}-{max(p99):.1f}) | {above} of {len(ref)} | {ratio} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
