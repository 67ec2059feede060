"""A lower bound on average JCT for any scheduler whose p99 JCT stays at or below a bar: can both bars hold?

Usage: python benchmarks/sched_tail_bound.py [--traces DIR] [--only pollux,pollux-w2] [--slot-h 0.05]
       [--horizon-h 30] [--p99-h X] [--theta-cuts 0.95]   (needs SciPy: pip install scipy)

Issue 23 asks for the default's average JCT within 1.5x of `oracle-srsf`'s and its p99 no worse than today's
default's. On Pollux the candidates that meet the first miss the second. This asks whether any policy, even one
that knows every duration, can meet both. It solves a linear program whose optimum is at most the average JCT of
every schedule the simulator can produce whose p99 is at or below the bar:

- Time is cut into slots. Job j does work x[j,k] (GPU-seconds at its ask) on n[j,k] GPU-seconds in slot k, only
  after it arrives; its work sums to its recorded work. A slot holds at most the cluster's GPUs.
- Work per GPU-second is bounded by the concave hull of the simulator's own elastic speedup curve over the sizes
  the job may take (`ScalingModel.speedup`, 0..max_gpus): so shrinking (fewer, more efficient GPUs) and growing
  (more, less efficient ones) both stay possible, and no slot does more work than the job could at any size.
- Left out, each of which only makes real schedules slower: gangs (a job may hold a fraction of a GPU-slot),
  placement slowdown, restart and resize penalties, node boundaries.
- JCT: a job's completion is at least its mean busy time (work-weighted slot starts) plus half its work at its
  fastest rate, and at least its arrival plus its work at that rate; both hold for every schedule.
- p99: with N jobs numpy's p99 is at or below the bar only if at most N - 1 - floor(0.99 (N - 1)) jobs end later
  than the bar. So at most that many jobs may do work after arrival + bar, chosen by the LP itself
  (which jobs, the program's choice: z[j] binary, summing to that many).
- Exact p99 ('exact' columns): numpy's p99 of 160 values is 0.59 x the third-longest + 0.41 x the second-longest,
  so the second-longest is bounded too. Cases on theta, the third-longest: theta in [a, b] means at most two JCTs
  above b and at most one above (bar - 0.59 a) / 0.41. Every schedule falls in some case, so the least of the
  cases' optima is a bound (`theta_intervals`; more cuts, a tighter one).

If the bound is above 1.5x `oracle-srsf`'s average, no schedule the simulator allows meets both bars on that trace.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sched_quality import CASES, DEFAULT_DIR, HELD_OUT, load_jobs, scheduler_config
from suanli.sched.scaling import ScalingModel
from suanli.sim import SimConfig
from suanli.sim.engine import Simulation
from suanli.sim.workload import TraceJob
from suanli.topology import load_preset, parse


def hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The upper concave hull's pieces as (slope, intercept), of points sorted by x (the first at (0, 0))."""
    up: list[tuple[float, float]] = []
    for p in points:
        while len(up) >= 2:
            (x1, y1), (x2, y2) = up[-2], up[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) >= 0:  # the middle point is not above the chord
                up.pop()
            else:
                break
        up.append(p)
    return [((y2 - y1) / (x2 - x1), y1 - (y2 - y1) / (x2 - x1) * x1) for (x1, y1), (x2, y2) in itertools.pairwise(up)]


def late_allowed(n: int, q: float = 99.0) -> int:
    """How many of n JCTs may exceed the bar while numpy's q-th percentile stays at or below it."""
    return n - 1 - math.floor(q / 100 * (n - 1))


def p99_split(n: int, q: float = 99.0) -> tuple[int, float]:
    """numpy's q-th percentile of n sorted values v is v[lo] + frac (v[lo + 1] - v[lo]): (lo, frac)."""
    idx = q / 100 * (n - 1)
    return math.floor(idx), idx - math.floor(idx)


def theta_intervals(bar_s: float, n: int, cuts_h: list[float]) -> list[tuple[float, float]]:
    """Cover every schedule with p99 <= bar by cases on theta, the JCT at numpy's index lo (the third-longest of
    160): theta in [a, b] means at most n - 1 - lo JCTs above b, and, since (1 - frac) theta + frac T2 <= bar for
    the next one T2, at most n - 2 - lo above (bar - (1 - frac) a) / frac. Returns (b, that) per case."""
    _, frac = p99_split(n)
    edges = sorted({0.0, *(c * 3600 for c in cuts_h if 0 < c * 3600 < bar_s), bar_s})
    return [(b, (bar_s - (1 - frac) * a) / frac if frac else math.inf) for a, b in itertools.pairwise(edges)]


def bound(jobs: list[TraceJob], scaling: ScalingModel, gpus: int, p99_s: float | None, slot_s: float,
          horizon_s: float, at_ask: bool = False, integral: bool = True, time_limit_s: float = 600,
          second_s: float | None = None) -> float:  # fmt: skip
    """The LP's lower bound on average JCT (seconds) of every schedule with p99 <= p99_s (None: no bar);
    `at_ask`: every job at most its asked GPUs, one unit of work per GPU-second (schedules without resizing);
    `second_s`: besides, one job fewer may end later than this (the exact p99 case split, `theta_intervals`)."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    n_slots = math.ceil(horizon_s / slot_s)
    starts = np.arange(n_slots) * slot_s
    cols: list[tuple[int, int]] = []  # (job, slot) of each x (and its n right after it)
    rows_ub: list[tuple[int, int, float]] = []
    rhs_ub: list[float] = []
    rows_eq: list[tuple[int, int, float]] = []
    rhs_eq: list[float] = []
    cap_rows: dict[int, list[int]] = {}
    per_job: list[tuple[float, float, float, list[int]]] = []
    for j, job in enumerate(jobs):
        lo, hi = job.min_gpus or job.num_gpus, job.max_gpus or job.num_gpus
        hi = job.num_gpus if at_ask else max(hi, job.num_gpus)
        lo = job.num_gpus if at_ask else lo
        sizes = range(min(lo, job.num_gpus), hi + 1)
        curve = [(0.0, 0.0)] + [(float(m), job.num_gpus * scaling.speedup(m, job.num_gpus, job.model)) for m in sizes]
        if at_ask:
            curve = [(0.0, 0.0), (float(job.num_gpus), float(job.num_gpus))]
        pieces = hull(curve)
        fastest = max(y for _, y in curve)
        work = job.num_gpus * job.duration_s
        k0 = int(job.submit_time_s // slot_s)
        mine = []
        for k in range(k0, n_slots):
            span = min(slot_s, starts[k] + slot_s - job.submit_time_s)
            if span <= 0:
                continue
            x = len(cols) * 2
            cols.append((j, k))
            mine.append(x)
            for slope, icpt in pieces:  # x <= slope * n + icpt * span
                rows_ub.append((len(rhs_ub), x, 1.0))
                rows_ub.append((len(rhs_ub), x + 1, -slope))
                rhs_ub.append(icpt * span)
            rows_ub.append((len(rhs_ub), x + 1, 1.0))  # n <= hi * span
            rhs_ub.append(hi * span)
            cap_rows.setdefault(k, []).append(x + 1)
        per_job.append((work, fastest, job.submit_time_s, mine))
    n_x = len(cols) * 2
    first_c = n_x
    n_var = n_x + 3 * len(jobs)  # then C[j], then z[j] (late past p99_s), then y[j] (late past second_s)
    first_y = first_c + 2 * len(jobs)
    for ns in cap_rows.values():
        r = len(rhs_ub)
        rows_ub += [(r, c, 1.0) for c in ns]
        rhs_ub.append(gpus * slot_s)
    bounds = [(0.0, None)] * n_x
    late = late_allowed(len(jobs))
    for j, (work, fastest, arrive, mine) in enumerate(per_job):
        rows_eq += [(j, x, 1.0) for x in mine]
        rhs_eq.append(work)
        r = len(rhs_ub)  # sum (slot start / work) x - C <= -work / (2 fastest)
        rows_ub += [(r, x, max(starts[cols[x // 2][1]], arrive) / work) for x in mine]
        rows_ub.append((r, first_c + j, -1.0))
        rhs_ub.append(-work / (2 * fastest))
        if p99_s is not None:
            r = len(rhs_ub)  # work after arrival + bar <= work * z
            after = [x for x in mine if starts[cols[x // 2][1]] >= arrive + p99_s]
            rows_ub += [(r, x, 1.0) for x in after]
            rows_ub.append((r, first_c + len(jobs) + j, -work))
            rhs_ub.append(0.0)
        if p99_s is not None and second_s is not None:
            r = len(rhs_ub)  # work after arrival + second_s <= work * y
            after = [x for x in mine if starts[cols[x // 2][1]] >= arrive + second_s]
            rows_ub += [(r, x, 1.0) for x in after]
            rows_ub.append((r, first_y + j, -work))
            rhs_ub.append(0.0)
    if p99_s is not None:
        r = len(rhs_ub)
        rows_ub += [(r, first_c + len(jobs) + j, 1.0) for j in range(len(jobs))]
        rhs_ub.append(float(late))
        if second_s is not None:
            r = len(rhs_ub)
            rows_ub += [(r, first_y + j, 1.0) for j in range(len(jobs))]
            rhs_ub.append(float(late - 1))
    bounds += [(a + w / f, None) for w, f, a, _ in per_job]
    bounds += [(0.0, 1.0)] * len(jobs)
    bounds += [(0.0, 1.0 if second_s is not None else 0.0)] * len(jobs)
    cost = np.zeros(n_var)
    cost[first_c : first_c + len(jobs)] = 1.0 / len(jobs)
    a_ub = coo_matrix(([v for _, _, v in rows_ub], ([r for r, _, _ in rows_ub], [c for _, c, _ in rows_ub])),
                      shape=(len(rhs_ub), n_var)).tocsr()  # fmt: skip
    a_eq = coo_matrix(([v for _, _, v in rows_eq], ([r for r, _, _ in rows_eq], [c for _, c, _ in rows_eq])),
                      shape=(len(rhs_eq), n_var)).tocsr()  # fmt: skip
    if p99_s is None or not integral:
        res = linprog(cost, A_ub=a_ub, b_ub=rhs_ub, A_eq=a_eq, b_eq=rhs_eq, bounds=bounds, method="highs")
        if res.status != 0:
            raise RuntimeError(f"LP not solved: {res.message}")
        return float(res.fun) - float(np.mean([j.submit_time_s for j in jobs]))
    from scipy.optimize import Bounds, LinearConstraint, milp

    lo = np.array([b[0] for b in bounds], dtype=float)
    hi = np.array([np.inf if b[1] is None else b[1] for b in bounds], dtype=float)
    kinds = np.zeros(n_var)
    kinds[first_c + len(jobs) :] = 1  # which jobs may end late: a choice, not a share (y is fixed at 0 unused)
    res = milp(cost, integrality=kinds, bounds=Bounds(lo, hi),
               constraints=[LinearConstraint(a_ub, -np.inf, rhs_ub), LinearConstraint(a_eq, rhs_eq, rhs_eq)],
               options={"time_limit": time_limit_s, "disp": False})  # fmt: skip
    if res.x is None:
        raise RuntimeError(f"MILP not solved: {res.message}")
    # the bound is the solver's dual bound (at or below its best schedule), valid even when stopped early
    return float(getattr(res, "mip_dual_bound", res.fun)) - float(np.mean([j.submit_time_s for j in jobs]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--only", default="pollux,pollux-w2")
    ap.add_argument("--slot-h", type=float, default=0.1)
    ap.add_argument("--horizon-h", type=float, default=30.0)
    ap.add_argument("--p99-h", type=float, default=0.0, help="the p99 bar (default: today's default's p99)")
    ap.add_argument("--time-limit-s", type=float, default=600.0, help="per MILP; its dual bound stays valid")
    ap.add_argument(
        "--theta-cuts",
        default="0.95",
        help="cases of the exact p99 bound, as fractions of the bar (more cuts: a tighter bound)",
    )
    args = ap.parse_args()
    if not args.traces.exists():
        print(f"no traces at {args.traces}", file=sys.stderr)
        return 2
    print("lower bounds on average JCT (h) of any schedule the simulator allows; 'bar': at most the two longest JCTs")
    print("above the p99 bar (necessary); 'exact': numpy's p99 itself at or below it (third-longest and second-longest")
    print("together), the least bound over cases on the third-longest JCT")
    print(f"{'trace':<10} {'oracle':>7} {'x1.5':>6} {'default':>8} {'p99 bar':>8} {'elastic':>8} {'bar':>6} "
          f"{'exact':>6} {'at ask':>7} {'bar':>6} {'exact':>6}  verdict")  # fmt: skip
    for name in args.only.split(","):
        case = next(c for c in (*CASES, *HELD_OUT) if c.name == name)
        jobs = load_jobs(args.traces, case, quick=True)
        cluster = load_preset(case.cluster) if isinstance(case.cluster, str) else parse(case.cluster)
        runs = {p: Simulation(jobs, cluster, SimConfig(scheduler=scheduler_config(p))).run().summary()
                for p in ("default", "oracle-srsf")}  # fmt: skip
        bar = args.p99_h * 3600 or runs["default"]["p99_jct_s"]
        scaling, g = ScalingModel(cluster), cluster.n_gpus
        slot, horizon, limit = args.slot_h * 3600, args.horizon_h * 3600, args.time_limit_s
        cases = theta_intervals(bar, len(jobs), [float(c) * bar / 3600 for c in args.theta_cuts.split(",")])
        lbs = []
        for ask in (False, True):
            lbs += [bound(jobs, scaling, g, p99, slot, horizon, at_ask=ask, time_limit_s=limit) / 3600
                    for p99 in (None, bar)]  # fmt: skip
            lbs.append(min(bound(jobs, scaling, g, theta, slot, horizon, at_ask=ask, time_limit_s=limit,
                                 second_s=second) for theta, second in cases) / 3600)  # fmt: skip
        o_avg = runs["oracle-srsf"]["avg_jct_s"] / 3600
        verdict = "both bars impossible" if min(lbs[2], lbs[5]) > 1.5 * o_avg else "not ruled out"
        print(f"{name:<10} {o_avg:>7.3f} {1.5 * o_avg:>6.3f} {runs['default']['avg_jct_s'] / 3600:>8.3f} "
              f"{bar / 3600:>8.2f} {lbs[0]:>8.3f} {lbs[1]:>6.3f} {lbs[2]:>6.3f} {lbs[3]:>7.3f} {lbs[4]:>6.3f} "
              f"{lbs[5]:>6.3f}  {verdict}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
