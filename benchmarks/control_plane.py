"""The workload path under load: submissions/s through the API, scheduling-pass latency, and the time until
everything that fits is placed, on virtual nodes of the 100,000-GPU preset.

Usage: python benchmarks/control_plane.py [--jobs 10000] [--clients 16] [--tenants 20] [--repeats 1]
       [--backend sqlite|postgresql ...] [--pg-url URL] [--preset synthetic-100k]

For each backend a real `suanli server --virtual PRESET` process (scheduling loop, supervisor and metering
running) starts on a fresh database; `--tenants` tenants sign up and are topped up; then `--clients` keep-alive
HTTP clients (in one load process per core) submit `--jobs` jobs as fast as answers come, round-robin over the
tenants. The job mix is fixed by a seed: gang sizes 1-64 GPUs (powers of two), topology `leaf` for gangs over 8,
durations 10-60 min, so that more GPUs are asked for than the preset has and some work must wait. Reported:
- submissions/s over the whole submission phase (goal, issue 5: >= 500/s sustained on 2 cores);
- submission latency p50/p99;
- scheduling passes while submitting and after: the server's own timing of its last pass (snapshot of the
  inventory and allocations, the `sched/` cycles, persisting placements), sampled from the operator summary;
- time from the first submission until the loop placed everything that fits (no pending workload left that the
  scheduler could place, i.e. the placed count stops changing), and how many were placed and left pending.
The load generator shares the machine's cores with the server: the numbers are a floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.api_load import RawConnection, start_server  # noqa: E402
from tests import databases  # noqa: E402
from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD  # noqa: E402

SIZES = [1, 1, 1, 2, 2, 4, 4, 8, 8, 8, 16, 16, 32, 64]


def job(i: int, rng: random.Random) -> dict[str, Any]:
    gpus = rng.choice(SIZES)
    return {"spec": {"name": f"bench-{i}", "command": "train", "duration": rng.randint(600, 3600),
                     "resources": {"gpu": "H100-SXM", "gpus": gpus, "topology": "leaf" if gpus > 8 else "any"}}}  # fmt: skip


def _submitter(
    args: tuple[str, int, list[tuple[dict[str, str], list[dict[str, Any]]]]],
) -> tuple[list[float], int, float]:
    """One load process: one keep-alive connection per client, each submitting its jobs as one tenant, the next
    as soon as the answer arrives, and opening a new connection every `per_connection` submissions (latency
    counts the reconnect); latencies, errors and when its last answer came."""
    url, per_connection, clients = args
    lat: list[float] = []
    errors = 0

    async def client(headers: dict[str, str], bodies: list[dict[str, Any]]) -> None:
        nonlocal errors
        conn = RawConnection(url, headers)
        for i, body in enumerate(bodies):
            if per_connection and i and i % per_connection == 0:
                await conn.aclose()
            t = time.perf_counter()
            status = await conn.request("POST", "/api/v1/workloads", body)
            lat.append(time.perf_counter() - t)
            errors += status != 201
        await conn.aclose()

    async def main() -> None:
        await asyncio.gather(*(client(headers, bodies) for headers, bodies in clients))

    asyncio.run(main())
    return lat, errors, time.time()


def summary(url: str, admin: dict[str, str]) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/api/v1/admin/workloads/summary", headers=admin, timeout=60).json())


def _steady_s(samples: list[dict[str, Any]]) -> float:
    passes = [x["loop"]["pass_ms"] for x in samples if x["loop"].get("pass_ms") is not None]
    return max(5.0, 2 * max(passes, default=0) / 1000)


def bench(name: str, db_url: str, args: argparse.Namespace, loops: bool = True) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix=f"suanli-cp-{name}-"))
    extra = ["--virtual", args.preset] + ([] if loops else ["--no-background"])
    proc, url = start_server(db_url, home, args.workers, extra=extra)
    try:
        with httpx.Client(base_url=url, timeout=120) as c:
            admin_token = c.post("/api/v1/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()
            admin = {"Authorization": f"Bearer {admin_token['token']}"}
            tenants = []
            for t in range(args.tenants):
                r = c.post("/api/v1/signup", json={"email": f"t{t}@example.com", "password": "tenant-password"})
                r.raise_for_status()
                c.post(f"/api/v1/admin/orgs/{r.json()['org']['id']}/transactions", headers=admin,
                       json={"kind": "topup", "amount": "100000000"}).raise_for_status()  # fmt: skip
                tenants.append({"Authorization": f"Bearer {r.json()['token']}"})
        rng = random.Random(args.seed)
        jobs = [job(i, rng) for i in range(args.jobs)]
        clients = [(tenants[c % len(tenants)], jobs[c :: args.clients]) for c in range(args.clients)]
        procs = max(1, min(args.procs, args.clients))
        shares = [(url, args.per_connection, clients[p::procs]) for p in range(procs)]
        samples: list[dict[str, Any]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    samples.append({"t": time.time(), **summary(url, admin)})
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        t0 = time.time()
        sampler.start()
        with mp.get_context("spawn").Pool(procs) as pool:
            results = pool.map(_submitter, shares)
        t_submitted = max(r[2] for r in results)
        lat = sorted(x for r in results for x in r[0])
        errors = sum(r[1] for r in results)
        # wait until the placed count stops changing for a few passes (5 s, or two of the longest pass so far)
        placed_prev, steady_since, t_placed = -1, time.time(), t_submitted
        while loops and time.time() - steady_since < _steady_s(samples) and time.time() - t0 < args.timeout:
            st = summary(url, admin)["states"]
            placed = sum(v for k, v in st.items() if k != "pending")
            if placed != placed_prev:
                placed_prev, steady_since, t_placed = placed, time.time(), time.time()
            time.sleep(0.5)
        stop.set()
        sampler.join()
        final = summary(url, admin)
        passes = [s["loop"]["pass_ms"] for s in samples if s["loop"].get("pass_ms") is not None]
        q = statistics.quantiles(lat, n=100)
        return {
            "backend": name, "loops": "on" if loops else "off", "jobs": args.jobs, "errors": errors,
            "submit_per_s": args.jobs / (t_submitted - t0), "submit_p50_ms": q[49] * 1000, "submit_p99_ms": q[98] * 1000,
            "pass_ms_median": statistics.median(passes) if passes else float("nan"),
            "pass_ms_max": max(passes) if passes else float("nan"),
            "place_all_s": t_placed - t0, "placed": placed_prev, "pending": final["states"].get("pending", 0),
        }  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--procs", type=int, default=2, help="load-generator processes")
    p.add_argument("--workers", type=int, default=2, help="server processes (`suanli server --workers`)")
    p.add_argument("--per-connection", type=int, default=50,
                   help="submissions per client connection before it reconnects (0: one connection throughout)")  # fmt: skip
    p.add_argument("--tenants", type=int, default=20)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--preset", default="synthetic-100k")
    p.add_argument("--backend", action="append", choices=["sqlite", "postgresql"])
    p.add_argument("--pg-url", help="an empty PostgreSQL database (default: a throwaway server)")
    p.add_argument("--loops", choices=["both", "on", "off"], default="both",
                   help="run the API alone (off), with the background loops (on), or both one after the other")  # fmt: skip
    args = p.parse_args()
    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.loops]
    rows = []
    for backend in args.backend or ["sqlite", "postgresql"]:
        for _ in range(args.repeats):
            if backend == "sqlite":
                for loops in modes:  # the API alone, then with the scheduling loop placing as it goes
                    url = f"sqlite+pysqlite:///{tempfile.mkdtemp(prefix='suanli-cp-db-')}/suanli.db"
                    rows.append(bench(backend, url, args, loops))
                continue
            admin = args.pg_url or databases.postgres_server()
            if admin is None:
                print(f"postgresql: skipped ({databases.postgres_unavailable_reason()})")
                break
            for loops in modes:
                url = args.pg_url or databases.new_database(admin)
                rows.append(bench(backend, url, args, loops))
    cols = ["backend", "loops", "jobs", "errors", "submit_per_s", "submit_p50_ms", "submit_p99_ms", "pass_ms_median",
            "pass_ms_max", "place_all_s", "placed", "pending"]  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    print("goal (issue 5): submit_per_s >= 500 on 2 cores")
    databases.stop_postgres_server()


if __name__ == "__main__":
    main()
