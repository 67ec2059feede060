"""How low can p99 JCT go when durations are known and every job runs at the size it asked for?

Usage: python benchmarks/sched_deadline_bound.py [--traces DIR] [--only pollux] [--held-out] [--load 1]
       [--deadlines-h 8.7,10,11] [--margins-h 0.05,0.1,0.25,0.5]

`oracle-srsf` orders by remaining service and so leaves the longest jobs for last: its p99 is above today's
default on every Pollux row (docs/scheduling.md). This asks whether knowing durations lets a scheduler keep the
tail down without losing the average: the same clairvoyant repack, but a job whose slack to a JCT deadline D
(submit + D - now - its remaining time at its ask) is between 0 and a margin goes first, least slack first (EDF);
a job already past saving (slack below 0) goes back to the SRSF order, so it cannot hold the cluster. Prints, per
deadline and margin, average JCT (and its ratio to `oracle-srsf`'s) and p99 JCT, beside today's default (which may
grow elastic jobs beyond their ask, as the oracle does not). A measurement of the trade-off, not a policy: it
reads the simulator's true remaining work.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sched_quality import CASES, DEFAULT_DIR, HELD_OUT, load_jobs, scheduler_config
from suanli.sched.types import Request
from suanli.sim import SimConfig
from suanli.sim.engine import Simulation
from suanli.sim.oracle import ORACLE_SRSF, OracleScheduler
from suanli.sim.slicing import scale_load
from suanli.topology import load_preset, parse

URGENT = -1e18  # below any service: urgent jobs first


class DeadlineGuarded(OracleScheduler):
    """`oracle-srsf` with an EDF lane for jobs that can still end within `deadline_s` of submission."""

    def __init__(self, remaining: list[float], deadline_s: float, margin_s: float) -> None:
        super().__init__(remaining)
        self.deadline_s, self.margin_s, self.now = deadline_s, margin_s, 0.0

    def cycle(self, snapshot, queue, now, explain=False):  # type: ignore[no-untyped-def]
        self.now = now
        return super().cycle(snapshot, queue, now, explain)

    def service(self, req: Request) -> float:
        slack = req.submit_time + self.deadline_s - self.now - self.remaining[int(req.id)]
        return URGENT + slack if 0 <= slack <= self.margin_s else super().service(req)


def run_one(args: tuple[str, str, float, str, float, float]) -> tuple[str, float, float, float, float]:
    root, trace, load, policy, deadline_h, margin_h = args
    case = next(c for c in (*CASES, *HELD_OUT) if c.name == trace)
    jobs = load_jobs(Path(root), case, quick=True)
    if load != 1.0:
        jobs = scale_load(jobs, load)
    cluster = load_preset(case.cluster) if isinstance(case.cluster, str) else parse(case.cluster)
    sim = Simulation(jobs, cluster, SimConfig(scheduler=scheduler_config(policy)))
    if deadline_h:
        sim.scheduler = DeadlineGuarded(sim.remaining, deadline_h * 3600, margin_h * 3600)
    s = sim.run().summary()
    return policy, deadline_h, margin_h, s["avg_jct_s"] / 3600, s["p99_jct_s"] / 3600


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--only", default="pollux")
    ap.add_argument("--held-out", action="store_true")
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--deadlines-h", default="", help="default: today's default's p99, and that x1.15 and x1.3")
    ap.add_argument("--margins-h", default="0.05,0.1,0.25,0.5")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if not args.traces.exists():
        print(f"traces not found: {args.traces}", file=sys.stderr)
        return 2
    root = str(args.traces)
    from rich.console import Console
    from rich.table import Table

    for trace in args.only.split(","):
        base = [(root, trace, args.load, p, 0.0, 0.0) for p in ("default", ORACLE_SRSF)]
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            (_, _, _, d_avg, d_p99), (_, _, _, o_avg, o_p99) = list(pool.map(run_one, base))
            deadlines = floats(args.deadlines_h) or [round(d_p99 * f, 2) for f in (1.0, 1.15, 1.3)]
            grid = [(root, trace, args.load, ORACLE_SRSF, d, m) for d in deadlines for m in floats(args.margins_h)]
            rows = list(pool.map(run_one, grid))
        t = Table(title=f"{trace} x{args.load:g}: clairvoyant, every job at its ask, an EDF lane for a JCT deadline")
        for col in ("run", "avg JCT h", "x oracle", "p99 JCT h"):
            t.add_column(col, justify="left" if col == "run" else "right")
        t.add_row("today's default (elastic growth)", f"{d_avg:.2f}", f"{d_avg / o_avg:.2f}x", f"{d_p99:.2f}")
        t.add_row(ORACLE_SRSF, f"{o_avg:.2f}", "1.00x", f"{o_p99:.2f}")
        for _, d, m, avg, p99 in rows:
            t.add_row(f"deadline {d:g} h, margin {m:g} h", f"{avg:.2f}", f"{avg / o_avg:.2f}x", f"{p99:.2f}")
        Console(width=120).print(t)
        best = min(r[4] for r in rows)
        print(f"lowest p99 with durations known, at asked sizes: {best:.2f} h (today's default: {d_p99:.2f} h)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
