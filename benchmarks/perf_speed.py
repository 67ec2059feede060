"""How fast the topology and performance-model core answers the scheduler's questions.

Usage: python benchmarks/perf_speed.py [--repeats N] [--plain]

Each case runs once to warm caches, then N times; the table shows the median and p90 wall time
(time.perf_counter) against its target. Exit status 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from suanli.perf import (
    Layout,
    Placement,
    Plan,
    ServeWorkload,
    TrainJob,
    estimate,
    evaluate,
    model_preset,
    search,
    serve,
)
from suanli.topology import load_preset, parse

GiB = 1 << 30


@dataclass
class Case:
    name: str
    fn: Callable[[], object]
    unit: str  # "us", "ms" or "s"
    target: float  # in `unit`
    repeats: int


SCALE = {"us": 1e6, "ms": 1e3, "s": 1.0}


def _timings(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up: imports, catalog parsing, cached properties
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]


def cases(repeats: int) -> list[Case]:
    two_nodes = parse(
        {
            "name": "2x8-h100",
            "node_groups": [{"name": "n", "count": 2, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 8}],
            "fabric": "ib-ndr",
        }
    )
    group = two_nodes.comm_group(np.arange(16))

    superpod = load_preset("dgx-h100-superpod-su")
    placement = Placement(superpod, superpod.compact_gpus(128))
    job = TrainJob(model_preset("llama3.1-70b"), "bf16", seq_len=8192, global_batch=256)
    plan = Plan(tp=4, pp=4, cp=2, vp=5, dp=4)

    h200 = parse(
        {
            "name": "1x8-h200",
            "node_groups": [{"name": "n", "count": 1, "gpu": "H200", "gpus_per_node": 8, "nics": 8}],
            "fabric": "ib-ndr",
        }
    )
    serve_at = Placement(h200, h200.compact_gpus(8))
    ds, llama = model_preset("deepseek-v3"), model_preset("llama3.1-70b")

    def serve_case(arch, lay: Layout, w: ServeWorkload):  # a fresh placement each time: no warm caches
        gpu = serve_at.gpu
        return lambda: serve(arch, gpu, lay, "fp8", w, Placement(h200, serve_at.gpus).group_fn())

    big = load_preset("synthetic-100k")
    rng = np.random.default_rng(0)
    scattered = np.sort(rng.choice(big.n_gpus, size=1024, replace=False))
    few = max(5, repeats // 10)
    moe_cluster = parse(
        {
            "name": "128x8-h100",
            "node_groups": [{"name": "n", "count": 128, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 8}],
            "fabric": "ib-ndr",
            "nodes_per_leaf": 32,
        }
    )
    moe_placement = Placement(moe_cluster, moe_cluster.compact_gpus(1024))
    moe_job = TrainJob(model_preset("deepseek-v3"), "fp8", seq_len=4096, global_batch=8192)

    return [
        Case("estimate all_reduce 1 GiB, 2x8 H100", lambda: estimate("all_reduce", GiB, group), "us", 50.0, repeats),
        Case("search llama3.1-70b, 128 H100 (superpod SU)", lambda: search(job, placement), "ms", 1000.0, few),
        Case("evaluate TP4 PP4 CP2 VP5, 128 H100", lambda: evaluate(job, plan, placement), "ms", 10.0, repeats),
        Case("search deepseek-v3 (671B MoE), 1,024 H100", lambda: search(moe_job, moe_placement), "ms", 2000.0, 3),
        Case(
            "perf serve llama3.1-70b TP8 H200, rate 10/s",
            serve_case(llama, Layout(8, 8), ServeWorkload(1024, 1024, rate=10.0)),
            "ms",
            5.0,
            repeats,
        ),
        Case(
            "perf serve deepseek-v3 TP8 EP8 H200, rate 2/s",
            serve_case(ds, Layout(8, 8, ep=8), ServeWorkload(1024, 1024, rate=2.0)),
            "ms",
            5.0,
            repeats,
        ),
        Case(
            "perf serve deepseek-v3 TP1 EP8 H200, max throughput",
            serve_case(ds, Layout(8, 1, ep=8), ServeWorkload(1024, 1024, num_requests=3000)),
            "ms",
            5.0,
            repeats,
        ),
        Case("load preset synthetic-100k", lambda: load_preset("synthetic-100k"), "ms", 1000.0, few),
        Case(
            "load synthetic-100k + first query (builds columns)",
            lambda: load_preset("synthetic-100k").comm_group(np.arange(8)),
            "ms",
            1000.0,
            few,
        ),
        Case("comm_group 1,024 scattered GPUs, synthetic-100k", lambda: big.comm_group(scattered), "ms", 10.0, repeats),
        Case(
            "comm_group 1,024 compact GPUs, synthetic-100k",
            lambda: big.comm_group(big.compact_gpus(1024)),
            "ms",
            10.0,
            repeats,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=200, help="timed runs of the fast cases (slow ones: 1/10)")
    ap.add_argument("--plain", action="store_true", help="plain text instead of a Rich table")
    args = ap.parse_args(argv)

    header = ("case", "runs", "median", "p90", "target", "ok")
    table_rows = []
    all_ok = True
    for case in cases(args.repeats):
        ts = [t * SCALE[case.unit] for t in _timings(case.fn, case.repeats)]
        med, p90 = statistics.median(ts), _p90(ts)
        ok = med <= case.target
        all_ok &= ok
        table_rows.append(
            (
                case.name,
                str(len(ts)),
                f"{med:,.2f} {case.unit}",
                f"{p90:,.2f} {case.unit}",
                f"<= {case.target:g} {case.unit}",
                "yes" if ok else "NO",
            )
        )
    if args.plain:
        widths = [max(len(r[i]) for r in (header, *table_rows)) for i in range(len(header))]
        for r in (header, *table_rows):
            print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="suanli core speed (median / p90 wall time)")
        for h in header:
            table.add_column(h, justify="left" if h == "case" else "right")
        for r in table_rows:
            table.add_row(*r, style=None if r[-1] == "yes" else "bold red")
        Console().print(table)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
