"""How fast the scheduler decides, against the issue's targets, with medians over repeats.

Usage: python benchmarks/sched_speed.py [--repeats N] [--philly PATH | --no-philly]

1. A 1,024-GPU gang on the 100,000-GPU preset (half full) with 10,000 jobs queued: latency of the
   placement decision for the gang (target p99 <= 10 ms) and of a whole cycle over that queue.
2. Placements per second on a 5,000-node cluster: one cycle placing a queue of 8,000 mixed jobs
   (target >= 1,000/s; kube-scheduler manages ~180 pods/s with extended resources).
3. The full Philly-derived trace (82k jobs) replayed with the default policy on 2,490 GPUs
   (target <= 60 s on 2 cores). Needs ../shared (skipped with a note when absent).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from sched_quality import PHILLY_2490
from suanli.sched import ClusterState, Request, Scheduler, SchedulerConfig, topology_aware
from suanli.sched.types import Allocation
from suanli.topology import load_preset, parse

PHILLY = Path(__file__).resolve().parents[1].parent / "shared/data/traces/philly-derived/pollux_philly.csv.gz"


def fill(state: ClusterState, fraction: float, seed: int) -> None:
    """Occupy about `fraction` of the GPUs with 1-8 GPU allocations on random nodes."""
    rng = np.random.default_rng(seed)
    n_nodes = state.cluster.n_nodes
    target = int(state.n_gpus * fraction)
    used = 0
    for i, node in enumerate(rng.permutation(n_nodes)):
        if used >= target:
            break
        k = int(rng.integers(1, 9))
        gpus = tuple(state.cluster.gpus_of_node(int(node)))[:k]
        req = Request(f"bg{i}", k, 0.0)
        state.reserve(Allocation(req.id, req, gpus, 0.0))
        used += k


def queue(n: int, seed: int, start: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    sizes = rng.choice([1, 1, 1, 2, 4, 8, 8, 16, 32, 64], n)
    return [Request(f"q{start + i}", int(s), float(start + i)) for i, s in enumerate(sizes)]


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(values, p))


def bench_gang(repeats: int) -> list[tuple[str, str, str, str]]:
    cluster = load_preset("synthetic-100k")
    gang_ms, cycle_ms = [], []
    sched = Scheduler(SchedulerConfig(policy="default"))
    for r in range(repeats):
        state = ClusterState(cluster)
        fill(state, 0.5, seed=r)
        gang = Request("gang", 1024, 0.0)
        q = [gang, *queue(10_000, seed=r, start=1)]
        t0 = time.perf_counter()
        res = topology_aware(state, gang, 1024)
        gang_ms.append((time.perf_counter() - t0) * 1e3)
        assert res.gpus is not None and res.gpus.size == 1024
        t0 = time.perf_counter()
        result, _ = sched.cycle(state, q, 1.0)
        cycle_ms.append((time.perf_counter() - t0) * 1e3)
        assert any(p.request_id == "gang" for p in result.placed)
    return [
        (
            "1,024-GPU gang placement, 100k GPUs, 10k queued",
            f"{statistics.median(gang_ms):.2f} ms",
            f"p99 {pct(gang_ms, 99):.2f} ms",
            "p99 <= 10 ms " + ("ok" if pct(gang_ms, 99) <= 10 else "MISSED"),
        ),
        (
            "whole cycle over that queue (places every job that fits)",
            f"{statistics.median(cycle_ms):.1f} ms",
            f"p99 {pct(cycle_ms, 99):.1f} ms",
            "-",
        ),
    ]


def bench_rate(repeats: int) -> list[tuple[str, str, str, str]]:
    cluster = parse(
        {
            "name": "5k",
            "node_groups": [{"name": "h", "count": 5_000, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 8}],
            "fabric": "ib-ndr",
            "nodes_per_leaf": 32,
        }
    )
    sched = Scheduler(SchedulerConfig(policy="default", backfill_depth=100_000))
    rates = []
    for r in range(repeats):
        state = ClusterState(cluster)
        q = queue(8_000, seed=100 + r)
        t0 = time.perf_counter()
        result, _ = sched.cycle(state, q, 0.0, explain=False)
        dt = time.perf_counter() - t0
        rates.append(len(result.placed) / dt)
    med = statistics.median(rates)
    return [
        (
            "placements/s, 5,000 nodes, one cycle of 8,000 jobs",
            f"{med:,.0f}/s",
            f"min {min(rates):,.0f}/s",
            ">= 1,000/s " + ("ok" if med >= 1_000 else "MISSED"),
        )
    ]


def bench_philly(path: Path) -> list[tuple[str, str, str, str]]:
    from suanli.sim import SimConfig, simulate
    from suanli.traces import read_trace
    from suanli.traces.files import open_text_file

    if not path.exists():
        return [("Philly replay", "skipped", f"{path.name} not found", "-")]
    jobs = read_trace(f"philly:{path}", open_text_file)
    cluster = parse(PHILLY_2490)  # the cluster the quality benchmark replays Philly on
    t0 = time.perf_counter()
    res = simulate(jobs, cluster, SimConfig(), clock=time.perf_counter)
    wall = time.perf_counter() - t0
    return [
        (
            f"Philly replay, {len(jobs):,} jobs on {cluster.n_gpus:,} GPUs (default policy)",
            f"{wall:.1f} s",
            f"{res.finished:,} finished, decision p99 {res.decision_p99_ms:.2f} ms",
            "<= 60 s " + ("ok" if wall <= 60 else "MISSED"),
        )
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--philly", type=Path, default=PHILLY)
    ap.add_argument("--no-philly", action="store_true")
    args = ap.parse_args()
    rows = bench_gang(args.repeats) + bench_rate(max(3, args.repeats // 2))
    if not args.no_philly:
        rows += bench_philly(args.philly)
    from rich.console import Console
    from rich.table import Table

    t = Table(title="scheduler speed (medians)")
    for col in ("case", "median", "spread", "target"):
        t.add_column(col)
    for row in rows:
        t.add_row(*row)
    Console(width=160).print(t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
