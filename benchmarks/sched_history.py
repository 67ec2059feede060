"""What runtime history costs the server's scheduling pass: pass and cycle time, median and p99, with no history and
with `--finished` finished jobs in the database, on a busy cluster with a queue that waits.

Usage: python benchmarks/sched_history.py [--finished 10000] [--queue 1000] [--passes 200] [--tenants 20]
       [--preset synthetic-100k] [--policy default[+switch...]] [--undeclared] [--backend sqlite|postgresql ...]

In-process (the API for setup, `SchedulingPass.run` timed directly): an operator registers the preset as virtual
nodes; `--tenants` tenants are topped up; they hold all GPUs but 4 (so the queue waits and every pass runs its cycle
over it); `--finished` succeeded jobs of the tenants (gang sizes 1-64, run times 1 min-10 h) are written as rows;
`--queue` jobs of 8-64 GPUs are submitted. Then three passes: one with history, two without (a `ServerHistory` that
reads nothing; two, so that the difference between equals shows the noise). Each runs its first pass (the startup
read), then `--passes` passes forced to run (nothing changed: the cycle over the whole queue again), the three in
turn, then a pass after a burst of 1,000 more jobs ended (one `batch_rows` read). Reported: cycle (`Scheduler.cycle`,
the `cycle_s` the pass times) and whole-pass median and p99, and the rows each read.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import insert  # noqa: E402
from tests import databases  # noqa: E402
from tests.control_plane import admin_token, bearer, settings, signup  # noqa: E402

from suanli.api.app import create_app  # noqa: E402
from suanli.control.ids import utcnow  # noqa: E402
from suanli.control.scheduling.history import ServerHistory  # noqa: E402
from suanli.control.scheduling.scheduling import SchedulingPass  # noqa: E402
from suanli.db.models import Workload  # noqa: E402
from suanli.sched import configured  # noqa: E402
from suanli.workloads.spec import parse_spec  # noqa: E402

SIZES = [1, 1, 1, 2, 2, 4, 4, 8, 8, 8, 16, 16, 32, 64]
API = "/api/v1"


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, round(p / 100 * (len(v) - 1)))]


def finished_rows(tenants: list[Any], n: int, rng: random.Random, end_h: float, tag: str) -> list[dict[str, Any]]:
    specs = {g: parse_spec({"name": "done", "command": "x", "resources": {"gpu": "H100-SXM", "gpus": g}})
             .model_dump(mode="json") for g in set(SIZES)}  # fmt: skip
    end = utcnow() - timedelta(hours=end_h)
    rows = []
    for i in range(n):
        t, g = rng.choice(tenants), rng.choice(SIZES)
        at = end - timedelta(seconds=(n - i) * 5)
        rows.append(dict(id=f"wh{tag}{i:09d}", org_id=t.org_id, user_id=t.user_id, name=f"done-{i}", kind="job",
                         spec=specs[g], state="succeeded", reason="", pending_reason="", attempt=1, retries=0,
                         attained_gpu_s=rng.uniform(60, 36_000) * g, has_workdir=False, created_at=at,
                         submitted_at=at, queued_at=at, started_at=at, finished_at=at))  # fmt: skip
    return rows


def bench(name: str, db_url: str, args: argparse.Namespace) -> list[tuple[str, ...]]:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as home, TestClient(create_app(settings(Path(home), db_url))) as api:
        db = api.app.state.server.db  # type: ignore[attr-defined]
        adm = bearer(admin_token(api))
        r = api.post(f"{API}/admin/clusters", json={"preset": args.preset}, headers=adm)
        assert r.status_code == 201, r.text
        n_gpus = int(r.json()["gpus"])
        tenants = []
        for i in range(args.tenants):
            t = signup(api, f"t{i}@example.com")
            r = api.post(f"{API}/admin/orgs/{t.org_id}/transactions", json={"kind": "topup", "amount": "100000000"},
                         headers=adm)  # fmt: skip
            assert r.status_code == 201, r.text
            tenants.append(t)

        def submit(who: Any, name: str, gpus: int, declared: bool = True) -> None:
            spec = {"name": name, "command": "x", "resources": {"gpu": "H100-SXM", "gpus": gpus, "topology": "any"},
                    **({"duration": 3600} if declared else {})}  # fmt: skip
            r = api.post(f"{API}/workloads", json={"spec": spec}, headers=who.headers)
            assert r.status_code == 201, r.text

        left, k = n_gpus - 4, 0
        while left > 0:  # a spec asks for at most 65,536 GPUs
            submit(tenants[k % len(tenants)], f"wall-{k}", min(left, 32_768))
            left, k = left - min(left, 32_768), k + 1
        SchedulingPass().run(db, utcnow())  # the wall is placed: from now on the queue waits
        rows = finished_rows(tenants, args.finished, rng, 2.0, "a")
        with db.write() as s, s.begin():
            for i in range(0, len(rows), 1000):
                s.execute(insert(Workload), rows[i : i + 1000])
        for i in range(args.queue):
            submit(tenants[i % len(tenants)], f"q-{i}", rng.choice([8, 16, 32, 64]), not args.undeclared)
        out = []
        burst = finished_rows(tenants, 1000, rng, 0.05, "b")  # ends after the first rows, before the lag
        labels = ("none", "none again", "history")  # a second pass without history: the noise between two equals
        passes = {label: SchedulingPass(configured(args.policy),
                                        history=ServerHistory(startup_rows=0) if label != "history" else ServerHistory())
                  for label in labels}  # fmt: skip
        first: dict[str, tuple[float, int]] = {}
        for label in labels:
            t0 = time.perf_counter()
            passes[label].run(db, utcnow())
            first[label] = (time.perf_counter() - t0, passes[label].history.rows_read)
        cycles: dict[str, list[float]] = {k: [] for k in labels}
        totals: dict[str, list[float]] = {k: [] for k in labels}
        for k in range(args.passes):  # interleaved, each first in turn: all see the same machine
            for label in labels[k % 3 :] + labels[: k % 3]:
                passes[label]._signature = None  # force the pass: the cycle over the whole queue again
                rep = passes[label].run(db, utcnow())
                cycles[label].append(rep.cycle_s * 1e3)
                totals[label].append(rep.total_s * 1e3)
        with db.write() as s, s.begin():
            s.execute(insert(Workload), burst)
        for label in labels:
            sched = passes[label]
            sched._signature = None
            rep = sched.run(db, utcnow())
            c, tt = cycles[label], totals[label]
            out.append((name, label, str(first[label][1]), f"{first[label][0] * 1e3:.0f}",
                        f"{statistics.median(c):.2f}", f"{pct(c, 99):.2f}", f"{statistics.median(tt):.1f}",
                        f"{pct(tt, 99):.1f}", str(sched.history.rows_read), f"{rep.total_s * 1e3:.1f}"))  # fmt: skip
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--finished", type=int, default=10_000)
    p.add_argument("--queue", type=int, default=1000)
    p.add_argument("--passes", type=int, default=200)
    p.add_argument("--tenants", type=int, default=20)
    p.add_argument("--preset", default="synthetic-100k")
    p.add_argument("--policy", default="default")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--undeclared",
        action="store_true",
        help="queued jobs declare no duration: their estimates and samples come from history",
    )
    p.add_argument("--backend", action="append", choices=["sqlite", "postgresql"])
    args = p.parse_args()
    rows = []
    for backend in args.backend or ["sqlite"]:
        if backend == "sqlite":
            with tempfile.TemporaryDirectory() as d:
                rows += bench("sqlite", f"sqlite:///{d}/bench.db", args)
        else:
            admin = databases.postgres_server()
            if admin is None:
                print(f"postgresql skipped: {databases.postgres_unavailable_reason()}")
                continue
            url = databases.new_database(admin)
            try:
                rows += bench("postgresql", url, args)
            finally:
                databases.drop_database(admin, url)
                databases.stop_postgres_server()
    head = ("db", "history", "startup rows", "first pass ms", "cycle p50 ms", "cycle p99 ms", "pass p50 ms",
            "pass p99 ms", "burst rows", "burst pass ms")  # fmt: skip
    print(f"{args.finished} finished jobs, {args.queue} queued ({'no' if args.undeclared else 'a'} duration declared), "
          f"{args.preset}, policy {args.policy}, {args.passes} passes")  # fmt: skip
    print(" | ".join(head))
    for r in rows:
        print(" | ".join(r))


if __name__ == "__main__":
    main()
