"""The crash loop, long: a real `suanli server` killed with SIGKILL N times while local and virtual jobs run and
submissions arrive, restarted each time, then left to finish; the invariants after every crash and restart and
at the end, as a markdown table per database.

Usage: python benchmarks/chaos.py [--cycles 10] [--db sqlite|postgresql|both] [--hard 0.3] [--seed 1]
       [--pg-url URL]

Each cycle starts the server on the same data directory and database, checks, sends traffic (two clients
submitting virtual GPU gangs and local CPU jobs, stopping some) until `--answers` submissions were answered, its
loop leads and work is placed, then for a random 0.5-2.5 s, and kills it: the server process alone (its loop
process then stops on its parent-death signal), or, with probability `--hard` and always the last time, the loop
process with it, as a host crash would (the loop's leases then run out: 15 s for the scheduling loop). At the end
a last restart lets everything finish, including attempts a crash left half-launched (lost after 120 s). See
`tests/crash_checks.py` for what each column counts; every column but the last must be 0. The last, allocations
billed after their workload ended by its executor's own record (and the seconds), is issue 18 #4.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import databases  # noqa: E402
from tests.crash_checks import Invariants  # noqa: E402
from tests.crash_loop import CrashLoop, table  # noqa: E402


def run(name: str, db_url: str, args: argparse.Namespace) -> Invariants:
    home = Path(tempfile.mkdtemp(prefix=f"suanli-chaos-{name}-"))
    rng = random.Random(args.seed)
    loop = CrashLoop(home, db_url, seed=args.seed)
    t0 = time.monotonic()
    try:
        for i in range(args.cycles):
            c = loop.cycle(hard=i == args.cycles - 1 or rng.random() < args.hard, answers=args.answers)
            print(f"{name}: cycle {c.cycle} ({c.kill}) {c.seconds:.1f} s (start {c.start_s:.1f} s), {c.submitted} "
                  f"submitted, {c.in_flight} in flight, {c.after_crash.broken() or 'ok'}", file=sys.stderr,
                  flush=True)  # fmt: skip
        t1 = time.monotonic()
        final = loop.finish()
        print(f"{name}: finished in {time.monotonic() - t1:.1f} s", file=sys.stderr, flush=True)
        elapsed = time.monotonic() - t0
        print(f"\n### {name}: {args.cycles} cycles, {elapsed:.0f} s, server tracebacks logged: "
              f"{loop.server_tracebacks()}\n")  # fmt: skip
        print(table(loop.cycles, final))
        for problem in [p for p in final.problems if not p.startswith("past_end")][:20]:
            print(f"- {problem}", file=sys.stderr)
        return final
    finally:
        loop.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=10)
    p.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--hard", type=float, default=0.3, help="chance a kill takes the loop process too (the last does)")
    p.add_argument("--answers", type=int, default=10, help="submissions answered in a cycle before its kill")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pg-url", help="an empty PostgreSQL database (default: a throwaway server)")
    args = p.parse_args()
    broken = False
    if args.db in ("sqlite", "both"):
        home = Path(tempfile.mkdtemp(prefix="suanli-chaos-db-"))
        broken |= bool(run("SQLite", f"sqlite+pysqlite:///{home}/suanli.db", args).broken())
    if args.db in ("postgresql", "both"):
        admin = args.pg_url or databases.postgres_server()
        if admin is None:
            print(f"postgresql: skipped ({databases.postgres_unavailable_reason()})")
        else:
            url = args.pg_url or databases.new_database(admin)
            broken |= bool(run("PostgreSQL", url, args).broken())
    databases.stop_postgres_server()
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
