"""GPU telemetry ingest: samples/s the server takes in and stores from --gpus GPUs reporting at 1 Hz, on SQLite and
PostgreSQL, with bounded memory. Goal: >= 10,000 samples/s (10,000 GPUs at 1 Hz) on 2 cores.

Usage: python benchmarks/telemetry_ingest.py [--gpus 10000] [--seconds 30] [--repeats 3] [--batch 1000]
       [--agents 16] [--backends sqlite,postgresql] [--pg-url URL] [--raw-s 60] [--quick] [--profile]

Every measurement runs on a fresh database holding one virtual cluster of --gpus GPUs (nodes of 8 H100-SXM,
registered with a cluster spec: `POST /api/v1/admin/clusters`, or the same service call in-process). Side by side:

1. http: a real `suanli server` process with its background loops off (`--no-background`) and on (as deployed:
   metering, the workload loop and the telemetry loop, which itself samples the cluster's virtual GPUs every
   `--loop-interval` s and compacts every 60 s with raw samples kept `--raw-s` s). Node agents (`--agents`
   keep-alive connections in this process, bodies encoded beforehand) post every GPU's samples in batches of
   `--batch` to `POST /api/v1/telemetry/samples`, for --seconds each run:
   - paced: every GPU once a second, the agents spread over the second. It keeps up ("1 Hz sustained") when the
     rows stored reach 99 % of the samples sent and 99 % of the rounds are answered within their second;
   - flat out: each agent posts its next batch as soon as the answer comes: the ingest capacity.
   The agents' rows carry a marker (ecc_sbe = 1, a counter the simulated GPUs never raise) and are counted in
   gpu_samples after each run, apart from the rows the telemetry loop wrote. Also reported: request latency
   p50/p99, the lag of a paced round behind its second, the server's CPU per stored sample (/proc, loop child
   included), and memory: the server's RSS at start, after warm-up and at the end (and its peak), the loop
   child's, and the gpu_samples rows against the retention bound.
2. service: in-process, batches of --batch in one write transaction each, as the route runs them: `ingest` alone
   (the ceiling), and the route's whole body (JSON decode, validation with the route's schema, ingest, health
   judge); the HTTP path is measured against these.
3. loop: `TelemetryTicker.tick` on all the virtual GPUs (simulate + store + judge), its clock 1 s ahead each tick.
4. retention: the service path at 1 Hz of simulated time for --soak-s s, `compact` every 60 s of it as the loop
   runs it: the gpu_samples rows level off at the bound, and how long each compaction holds the write transaction.

The load generator shares the machine's cores with the server, so the HTTP numbers are a floor; on a noisy
machine compare medians over --repeats, and the server CPU per sample, which noise distorts less.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import math
import os
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.api_load import server_cpu, start_server  # noqa: E402
from tests import databases  # noqa: E402
from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD  # noqa: E402

from suanli.api.routers.telemetry import SamplesIn  # noqa: E402
from suanli.control.scheduling import inventory  # noqa: E402
from suanli.control.settings import Settings  # noqa: E402
from suanli.control.settings import load as load_settings  # noqa: E402
from suanli.control.telemetry import health, telemetry  # noqa: E402
from suanli.control.telemetry.health import rules_of  # noqa: E402
from suanli.control.telemetry.telemetry import FleetIndex, Retention  # noqa: E402
from suanli.control.telemetry.telemetry_loop import COMPACT_EVERY_S, COMPACT_SLICE_S, TelemetryTicker  # noqa: E402
from suanli.db.engine import Database  # noqa: E402
from suanli.db.migrate import migrate  # noqa: E402
from suanli.db.models import Gpu, Node  # noqa: E402
from suanli.db.telemetry import GpuRollup, GpuSampleRow  # noqa: E402
from suanli.telemetry.health import HealthJudge  # noqa: E402
from suanli.telemetry.samples import GpuSample  # noqa: E402
from suanli.topology import presets  # noqa: E402

GOAL = 10_000  # samples/s: 10,000 GPUs at 1 Hz
GPUS_PER_NODE = 8
MARK = 1  # ecc_sbe of the agents' samples: their rows are told apart from the loop's by it
T_SLOT = b"@T@"  # where each round's timestamp goes in an encoded batch
CLUSTER = "bench-telemetry"


# ---- fleet and samples ----------------------------------------------------------------------------------------
def cluster_spec(gpus: int) -> dict[str, Any]:
    spec = presets.homogeneous(math.ceil(gpus / GPUS_PER_NODE), GPUS_PER_NODE, "H100-SXM")
    return {**spec, "name": CLUSTER}


@dataclass(frozen=True)
class FleetGpu:
    node: str
    gpu: int
    uuid: str


def fleet_gpus(db: Database) -> list[FleetGpu]:
    with db.read() as s:
        rows = s.execute(select(Node.name, Gpu.index, Gpu.uuid).join(Gpu, Gpu.node_id == Node.id)
                         .order_by(Node.index, Gpu.index)).all()  # fmt: skip
    return [FleetGpu(*r) for r in rows]


def readings(gpus: list[FleetGpu], seed: int = 1) -> list[dict[str, Any]]:
    """One plausible, healthy reading per GPU (busy H100s well below their slowdown temperature), without `t`."""
    rng = random.Random(seed)
    out = []
    for g in gpus:
        out.append({"node": g.node, "gpu": g.gpu, "uuid": g.uuid, "util": round(rng.uniform(60, 100), 1),
                    "mem_used_mib": rng.randint(50_000, 78_000), "mem_total_mib": 81_559,
                    "temp_c": float(rng.randint(45, 72)), "power_w": round(rng.uniform(300, 690), 1),
                    "power_limit_w": 700.0, "sm_clock_mhz": 1980, "throttle": 4, "ecc_sbe": MARK, "ecc_dbe": 0,
                    "xid": 0, "error": ""})  # fmt: skip
    return out


def encoded_batches(rows: list[dict[str, Any]], batch: int) -> list[bytes]:
    """Request bodies of `batch` samples each, with T_SLOT where the time goes."""
    out = []
    for i in range(0, len(rows), batch):
        items = [
            json.dumps(r, separators=(",", ":"))[:-1] + ',"t":' + T_SLOT.decode() + "}" for r in rows[i : i + batch]
        ]
        out.append(('{"samples":[' + ",".join(items) + "]}").encode())
    return out


def sample_objects(rows: list[dict[str, Any]], t: float) -> list[GpuSample]:
    return [GpuSample(t=t, **r) for r in rows]


# ---- process memory -------------------------------------------------------------------------------------------
def _status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) in MiB; psutil's RSS where /proc is missing."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
        return {k: int(v.split()[0]) / 1024 for k, v in fields.items()}
    except OSError:
        try:
            import psutil  # type: ignore[import-untyped]

            return {"VmRSS": psutil.Process(pid).memory_info().rss / 2**20, "VmHWM": math.nan}
        except Exception:
            return {"VmRSS": math.nan, "VmHWM": math.nan}


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry))
    return out


def memory(pid: int) -> dict[str, float]:
    """The server process's RSS and peak, and the RSS of its children (the background loops' process)."""
    own = _status(pid)
    kids = sum(_status(c).get("VmRSS", 0.0) for c in _children(pid))
    return {"rss": own.get("VmRSS", math.nan), "peak": own.get("VmHWM", math.nan), "children": kids}


def rows_in(db: Database) -> tuple[int, int]:
    with db.read() as s:
        return s.scalar(select(func.count()).select_from(GpuSampleRow)) or 0, s.scalar(
            select(func.count()).select_from(GpuRollup)
        ) or 0


def retention_window_s(raw_s: int, late_s: int = Retention.late_s) -> float:
    """How much sample time gpu_samples can hold: raw_s (or the unrolled minute plus late_s, if longer) when a
    compaction has just run, plus what arrives until the next pass."""
    return max(raw_s, late_s + 60) + COMPACT_EVERY_S


# ---- HTTP agents ----------------------------------------------------------------------------------------------
class Agent:
    """A node agent's keep-alive HTTP/1.1 connection that posts ready-made bodies (cheap on a small machine)."""

    def __init__(self, url: str, token: str) -> None:
        self.host, port = url.removeprefix("http://").split(":")
        self.port = int(port)
        self.head = (f"POST /api/v1/telemetry/samples HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {token}"
                     "\r\nContent-Type: application/json\r\nContent-Length: ")  # fmt: skip
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(f"{self.head}{len(body)}\r\n\r\n".encode() + body)
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


@dataclass
class LoadResult:
    t0: float
    t_end: float = 0.0
    sent: int = 0
    lat: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)  # paced: round answered this long after it was due
    errors: int = 0
    first: float = math.inf  # sample times used
    last: float = 0.0


async def _agent(agent: Agent, bodies: list[tuple[bytes, int]], res: LoadResult, until: float, paced: bool,
                 offset: float) -> None:  # fmt: skip
    k = 0
    try:
        while True:
            due = res.t0 + k + offset
            if paced:
                if due >= until:
                    return
                await asyncio.sleep(max(0.0, due - time.time()))
                t = due  # the agent reads its GPUs on its second
            else:
                t = time.time()
                if t >= until:
                    return
            stamp = b"%.3f" % t
            res.first, res.last = min(res.first, t), max(res.last, t)
            for body, n in bodies:
                start = time.perf_counter()
                status = await agent.post(body.replace(T_SLOT, stamp))
                res.lat.append(time.perf_counter() - start)
                res.sent += n
                res.errors += status != 200
            res.t_end = max(res.t_end, time.time())
            if paced:
                res.lags.append(time.time() - due)
            k += 1
    finally:
        agent.close()


def run_agents(url: str, token: str, batches: list[tuple[bytes, int]], agents: int, seconds: float,
               paced: bool) -> LoadResult:  # fmt: skip
    n = max(1, min(agents, len(batches)))
    shares = [batches[i::n] for i in range(n)]
    res = LoadResult(t0=math.floor(time.time()) + 1.0)

    async def main() -> None:
        until = res.t0 + seconds
        await asyncio.sleep(max(0.0, res.t0 - time.time()) if paced else 0.0)
        if not paced:
            res.t0 = time.time()
        await asyncio.gather(*(_agent(Agent(url, token), share, res, until if paced else res.t0 + seconds, paced,
                                      i / n) for i, share in enumerate(shares)))  # fmt: skip

    asyncio.run(main())
    return res


def count_window(db: Database, lo_s: float, hi_s: float) -> tuple[int, int]:
    """Rows in gpu_samples timed inside [lo, hi]: the agents' (marked) and the loop's."""
    r = GpuSampleRow
    with db.read() as s:
        q = select(r.ecc_sbe, func.count()).where(r.t_ms >= int(lo_s * 1000), r.t_ms <= int(hi_s * 1000))
        counts = dict(s.execute(q.group_by(r.ecc_sbe)).all())
    marked = int(counts.pop(MARK, 0))
    return marked, int(sum(counts.values()))


def rows_older(db: Database, cutoff_s: float) -> int:
    with db.read() as s:
        return s.scalar(select(func.count()).where(GpuSampleRow.t_ms < int(cutoff_s * 1000))) or 0


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def bench_http(backend: str, db_url: str, args: argparse.Namespace, loops: bool) -> tuple[list[dict[str, Any]],
                                                                                        dict[str, Any]]:  # fmt: skip
    home = Path(tempfile.mkdtemp(prefix=f"suanli-tel-{backend}-"))
    env = {"SUANLI_TELEMETRY_RAW_S": str(args.raw_s), "SUANLI_TELEMETRY_INTERVAL_S": str(args.loop_interval)}
    with environ(**env):
        proc, url = start_server(db_url, home, args.workers, extra=[] if loops else ["--no-background"])
    db = Database(db_url, pool_size=2)
    runs: list[dict[str, Any]] = []
    try:
        with httpx.Client(base_url=url, timeout=300) as c:
            token = c.post("/api/v1/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
            t = time.perf_counter()
            c.post("/api/v1/admin/clusters", json={"spec": cluster_spec(args.gpus)},
                   headers={"Authorization": f"Bearer {token}"}).raise_for_status()  # fmt: skip
            register_s = time.perf_counter() - t
        gpus = fleet_gpus(db)
        rows = readings(gpus)
        bodies = encoded_batches(rows, args.batch)
        batches = [(b, min(args.batch, len(rows) - i * args.batch)) for i, b in enumerate(bodies)]
        mem_start = memory(proc.pid)
        served_from = time.time()
        run_agents(url, token, batches, args.agents, args.warmup, paced=True)
        mem_warm = memory(proc.pid)
        label = "on" if loops else "off"
        print(f"  http {backend}, loops {label}: {len(gpus):,} GPUs registered in {register_s:.1f} s, "
              f"{len(batches)} batches of <= {args.batch}")  # fmt: skip
        for rep in range(args.repeats):
            for mode in args.modes:
                cpu0 = server_cpu(proc.pid)
                res = run_agents(url, token, batches, args.agents, args.seconds, paced=mode == "paced")
                cpu = server_cpu(proc.pid) - cpu0
                elapsed = max(args.seconds, res.t_end - res.t0)
                stored, loop_rows = count_window(db, res.first - 0.002, res.last + 0.002)
                lat = sorted(res.lat)
                q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0] if lat else math.nan] * 99
                lags = sorted(res.lags)
                lag99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else math.nan
                run = {"backend": backend, "loops": label, "mode": mode, "rep": rep, "sent": res.sent,
                       "stored": stored, "stored_per_s": stored / elapsed, "sent_per_s": res.sent / elapsed,
                       "loop_per_s": loop_rows / elapsed, "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000,
                       "lag_p99_s": lag99, "lag_max_s": lags[-1] if lags else math.nan,
                       "cpu_us": cpu / max(1, stored + loop_rows) * 1e6, "errors": res.errors}  # fmt: skip
                if mode == "paced":
                    run["keeps_up"] = stored >= 0.99 * res.sent and res.errors == 0 and lag99 < 1.0
                runs.append(run)
                print(f"    {mode:8} #{rep + 1}: stored {run['stored_per_s']:>8,.0f}/s of {run['sent_per_s']:,.0f}/s "
                      f"sent, loop {run['loop_per_s']:,.0f}/s, p50 {run['p50_ms']:.0f} ms, p99 {run['p99_ms']:.0f} "
                      f"ms,{f' lag p99 {lag99:.2f} s,' if lags else ''} server CPU {run['cpu_us']:.0f} us/sample, "
                      f"RSS {memory(proc.pid)['rss']:.0f} MiB, gpu_samples {rows_in(db)[0]:,}, errors {res.errors}")  # fmt: skip
                time.sleep(1.0)
        mem_end = memory(proc.pid)
        raw, rollups = rows_in(db)
        window = retention_window_s(args.raw_s)
        per_gpu_hz = 1.0 + (1.0 / args.loop_interval if loops else 0.0)  # agents at 1 Hz, plus the loop's own
        mem = {"backend": backend, "loops": label, "start": mem_start["rss"], "warm": mem_warm["rss"],
               "end": mem_end["rss"], "peak": mem_end["peak"], "child_warm": mem_warm["children"],
               "child_end": mem_end["children"], "raw_rows": raw, "rollups": rollups,
               "served_s": time.time() - served_from, "window_s": window,
               "past": rows_older(db, time.time() - window), "bound": len(gpus) * per_gpu_hz * window}  # fmt: skip
        return runs, mem
    finally:
        proc.terminate()
        proc.wait(60)
        db.dispose()
        shutil.rmtree(home, ignore_errors=True)


# ---- in-process paths -----------------------------------------------------------------------------------------
def fresh_fleet(db_url: str, gpus: int) -> tuple[Database, list[FleetGpu], float]:
    db = Database(db_url)
    migrate(db.engine)
    t = time.perf_counter()
    with db.write() as s, s.begin():
        inventory.register_spec(s, cluster_spec(gpus), datetime.now(UTC))
    return db, fleet_gpus(db), time.perf_counter() - t


def bench_service(db_url: str, args: argparse.Namespace, route: bool, profile: cProfile.Profile | None = None
                  ) -> dict[str, Any]:  # fmt: skip
    """`--seconds` rounds (every GPU once; 1 s of simulated time apart) through `ingest` in batches of --batch,
    one write transaction each; `route`: the route's whole body, from the JSON request body on."""
    db, gpus, _ = fresh_fleet(db_url, args.gpus)
    rows = readings(gpus)
    bodies = encoded_batches(rows, args.batch)
    index = FleetIndex()
    judge = HealthJudge(rules_of(load_settings({"home": tempfile.gettempdir()}, environ={})))
    t0 = time.time() - args.seconds - 5
    busy = 0.0
    n = 0
    try:
        for k in range(args.seconds):
            t = t0 + k
            if route:
                work = [b.replace(T_SLOT, b"%.3f" % t) for b in bodies]
            else:
                objs = sample_objects(rows, t)
                work = [objs[i : i + args.batch] for i in range(0, len(objs), args.batch)]  # type: ignore[misc]
            if profile:
                profile.enable()
            start = time.perf_counter()
            for item in work:
                if route:
                    body = SamplesIn.model_validate(json.loads(item))  # what FastAPI does with the request body
                    batch = [GpuSample(**x.model_dump()) for x in body.samples]
                else:
                    batch = item  # type: ignore[assignment]
                with db.write() as s, s.begin():
                    idx = index.refresh(s)
                    report, _ = telemetry.ingest(s, batch, idx)
                    if route:
                        findings = judge.judge(batch, {key: m for key, (_, m) in idx.gpus.items()})
                        health.apply(s, findings, datetime.now(UTC))
                n += report.stored
            busy += time.perf_counter() - start
            if profile:
                profile.disable()
        raw, _ = rows_in(db)
        assert raw == n, f"stored {n} but gpu_samples holds {raw}"
        return {"per_s": n / busy, "us": busy / n * 1e6}
    finally:
        db.dispose()


def bench_loop(db_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """`--ticks` ticks of the telemetry loop over every virtual GPU, its clock a second ahead each tick."""
    home = Path(tempfile.mkdtemp(prefix="suanli-tel-loop-"))
    db, gpus, _ = fresh_fleet(db_url, args.gpus)
    flags: dict[str, Any] = {"home": home, "db": db_url, "telemetry_interval_s": 1.0, "telemetry_raw_s": args.raw_s,
                             "background": False}  # fmt: skip
    if "sim_samples_per_s" in Settings.model_fields:  # let the simulation run at 1 Hz however big the fleet
        flags["sim_samples_per_s"] = float(max(len(gpus), 1))
    settings = load_settings(flags, environ={})
    ticker = TelemetryTicker(db, settings, owner="bench-telemetry")
    sim_time: list[float] = []
    sample = ticker.sim.sample

    def timed_sample(*a: Any, **kw: Any) -> list[GpuSample]:
        t = time.perf_counter()
        out = sample(*a, **kw)
        sim_time.append(time.perf_counter() - t)
        return out

    ticker.sim.sample = timed_sample  # type: ignore[method-assign]
    now = datetime.now(UTC) - timedelta(seconds=args.ticks + 5)
    ticks: list[float] = []
    try:
        for k in range(args.ticks + 1):
            t = time.perf_counter()
            report = ticker.tick(now + timedelta(seconds=k))
            ticks.append(time.perf_counter() - t)
            assert report.stored == len(gpus), f"tick stored {report.stored} of {len(gpus)}"
        steady, sims = ticks[1:], sim_time[1:]
        med = statistics.median(steady)
        return {"first_ms": ticks[0] * 1000, "tick_ms": med * 1000, "tick_max_ms": max(steady) * 1000,
                "sim_ms": statistics.median(sims) * 1000, "per_s": len(gpus) / med}  # fmt: skip
    finally:
        ticker.release()
        db.dispose()
        shutil.rmtree(home, ignore_errors=True)


def bench_retention(db_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """--soak-s s of 1 Hz samples through `ingest`, with `compact` every COMPACT_EVERY_S s of simulated time."""
    db, gpus, _ = fresh_fleet(db_url, args.gpus)
    rows = readings(gpus)
    index = FleetIndex()
    keep = Retention(raw_s=args.raw_s)
    t0 = time.time() - args.soak_s - 3600
    compactions: list[float] = []
    ingest_s = 0.0
    max_rows = 0
    held: list[float] = []  # each compaction transaction: how long it held the write lock
    rss0 = _status(os.getpid())["VmRSS"]
    try:
        for k in range(args.soak_s):
            t = t0 + k
            objs = sample_objects(rows, t)
            start = time.perf_counter()
            for i in range(0, len(objs), args.batch):
                with db.write() as s, s.begin():
                    telemetry.ingest(s, objs[i : i + args.batch], index.refresh(s))
            ingest_s += time.perf_counter() - start
            if k % COMPACT_EVERY_S == 0:  # as the loop runs it: in slices, each its own transaction
                start, more = time.perf_counter(), True
                while more:
                    begun = time.perf_counter()
                    with db.write() as s, s.begin():
                        more = telemetry.compact(s, datetime.fromtimestamp(t, UTC), keep, slice_s=COMPACT_SLICE_S).more
                    held.append(time.perf_counter() - begun)
                compactions.append(time.perf_counter() - start)
                max_rows = max(max_rows, rows_in(db)[0])  # just after the pass
            if (k + 1) % COMPACT_EVERY_S == 0:
                max_rows = max(max_rows, rows_in(db)[0])  # just before the next pass: the most it holds
        raw, rollups = rows_in(db)
        return {"gpus": len(gpus), "per_s": len(gpus) * args.soak_s / ingest_s, "passes": len(compactions),
                "compact_ms": statistics.median(compactions[1:] or compactions) * 1000,
                "compact_max_ms": max(compactions) * 1000, "held_max_ms": max(held or [0.0]) * 1000,
                "max_rows": max_rows, "raw_rows": raw, "rollups": rollups,
                "bound": len(gpus) * retention_window_s(args.raw_s), "rss_start": rss0,
                "rss_end": _status(os.getpid())["VmRSS"]}  # fmt: skip
    finally:
        db.dispose()


# ---- databases and tables -------------------------------------------------------------------------------------
class Databases:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.made: list[tuple[str, str]] = []  # (backend, url)
        self.pg_admin: str | None = None

    def available(self, backend: str) -> bool:
        if backend == "sqlite":
            return True
        self.pg_admin = self.pg_admin or self.args.pg_url or databases.postgres_server()
        if self.pg_admin is None:
            print(f"postgresql: skipped ({databases.postgres_unavailable_reason()})")
        return self.pg_admin is not None

    def new(self, backend: str) -> str:
        if backend == "sqlite":
            url = f"sqlite+pysqlite:///{tempfile.mkdtemp(prefix='suanli-tel-db-')}/suanli.db"
        else:
            assert self.pg_admin is not None
            url = databases.new_database(self.pg_admin)
        self.made.append((backend, url))
        return url

    def drop(self, url: str) -> None:
        """Free the space (a soak leaves millions of rows)."""
        if url.startswith("sqlite"):
            shutil.rmtree(Path(url.split("///", 1)[1]).parent, ignore_errors=True)
        else:
            assert self.pg_admin is not None
            with contextlib.suppress(Exception):
                databases.drop_database(self.pg_admin, url)

    @contextlib.contextmanager
    def fresh(self, backend: str) -> Iterator[str]:
        url = self.new(backend)
        try:
            yield url
        finally:
            self.drop(url)


def med(runs: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    xs = [r[key] for r in runs if not math.isnan(r[key])]
    return (statistics.median(xs), min(xs), max(xs)) if xs else (math.nan, math.nan, math.nan)


def fmt_range(v: tuple[float, float, float], spec: str = ",.0f") -> str:
    m, lo, hi = v
    return f"{m:{spec}} ({lo:{spec}}-{hi:{spec}})" if lo != hi else f"{m:{spec}}"


def table(cols: list[str], rows: list[list[Any]]) -> None:
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=10_000, help="virtual GPUs (nodes of 8 H100-SXM)")
    ap.add_argument("--seconds", type=int, default=30, help="seconds per HTTP run; rounds per service run")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each; tables show medians (and ranges)")
    ap.add_argument("--batch", type=int, default=1000, help="samples per request / ingest call (<= 20,000)")
    ap.add_argument("--agents", type=int, default=16, help="agent connections (at most one per batch)")
    ap.add_argument("--workers", type=int, default=1, help="server processes (`suanli server --workers`)")
    ap.add_argument("--backends", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    ap.add_argument("--pg-url", help="admin URL of a PostgreSQL server (default: start a throwaway one)")
    ap.add_argument("--paths", default="http,service,loop,retention", help="comma-separated subset to run")
    ap.add_argument("--modes", default="paced,max", help="HTTP load: paced (1 Hz) and/or max (flat out)")
    ap.add_argument("--loops", default="off,on", help="HTTP server background loops: off and/or on")
    ap.add_argument("--warmup", type=int, default=3, help="paced seconds before the HTTP runs (not recorded)")
    ap.add_argument("--ticks", type=int, default=10, help="telemetry loop ticks per run (after the first)")
    ap.add_argument("--soak-s", type=int, default=240, help="seconds of 1 Hz simulated time in the retention run")
    ap.add_argument("--raw-s", type=int, default=60, help="raw sample retention (>= 60: the setting's minimum)")
    ap.add_argument("--loop-interval", type=float, default=5.0, help="the server loop's own sampling period, s")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1,000 GPUs, 5 s, 1 repeat, 3 ticks")
    ap.add_argument("--profile", action="store_true", help="cProfile the in-process route body (first backend)")
    args = ap.parse_args()
    if args.quick:
        args.gpus, args.seconds, args.repeats, args.ticks, args.warmup = 1000, 5, 1, 3, 2
    if not 1 <= args.batch <= 20_000:
        ap.error("--batch must be 1..20,000 (the route's limit)")
    args.modes = [m for m in args.modes.split(",") if m]
    paths = set(args.paths.split(","))
    dbs = Databases(args)
    http_runs: list[dict[str, Any]] = []
    mems: list[dict[str, Any]] = []
    service: list[dict[str, Any]] = []
    loops_out: list[dict[str, Any]] = []
    soaks: list[dict[str, Any]] = []
    profile = cProfile.Profile() if args.profile else None
    try:
        for backend in [b for b in args.backends.split(",") if b]:
            if not dbs.available(backend):
                continue
            print(f"{backend}: {args.gpus:,} GPUs")
            if "service" in paths:
                for rep in range(args.repeats):
                    for route in (False, True):
                        with dbs.fresh(backend) as url:
                            prof = (
                                profile
                                if route and rep == 0 and not any(r["path"] == "route body" for r in service)
                                else None
                            )
                            r = {"backend": backend, "path": "route body" if route else "ingest",
                                 **bench_service(url, args, route, prof)}  # fmt: skip
                        service.append(r)
                        print(f"  service {r['path']:10} #{rep + 1}: {r['per_s']:,.0f} samples/s ({r['us']:.1f} us)")
            if "loop" in paths:
                for rep in range(args.repeats):
                    with dbs.fresh(backend) as url:
                        r = {"backend": backend, **bench_loop(url, args)}
                    loops_out.append(r)
                    print(f"  loop tick #{rep + 1}: {r['tick_ms']:.0f} ms (simulate {r['sim_ms']:.0f} ms; "
                          f"first {r['first_ms']:.0f} ms) = {r['per_s']:,.0f} samples/s")  # fmt: skip
            if "retention" in paths:
                with dbs.fresh(backend) as url:
                    r = {"backend": backend, **bench_retention(url, args)}
                soaks.append(r)
                print(f"  retention: {r['per_s']:,.0f} samples/s, compaction {r['compact_ms']:.0f} ms (max "
                      f"{r['compact_max_ms']:.0f}), rows at most {r['max_rows']:,} (bound {r['bound']:,.0f})")  # fmt: skip
            if "http" in paths:
                for loops in [x == "on" for x in args.loops.split(",") if x]:
                    with dbs.fresh(backend) as url:
                        runs, mem = bench_http(backend, url, args, loops)
                    http_runs += runs
                    mems.append(mem)
    finally:
        if not args.pg_url:
            databases.stop_postgres_server()

    print(f"\n{args.gpus:,} GPUs, batches of {args.batch}, {args.repeats} repeat(s); goal {GOAL:,} samples/s "
          "(10,000 GPUs at 1 Hz) on 2 cores; medians (min-max)\n")  # fmt: skip
    if http_runs:
        print(f"HTTP, {args.seconds} s a run, {args.agents} agents max, {args.workers} server worker(s); loop samples "
              f"its virtual GPUs every {args.loop_interval:g} s when on")  # fmt: skip
        rows = []
        for key in dict.fromkeys((r["backend"], r["loops"], r["mode"]) for r in http_runs):
            rs = [r for r in http_runs if (r["backend"], r["loops"], r["mode"]) == key]
            stored = med(rs, "stored_per_s")
            keeps = "-" if key[2] != "paced" else f"{sum(r['keeps_up'] for r in rs)}/{len(rs)}"
            rows.append([*key, fmt_range(med(rs, "sent_per_s")), fmt_range(stored), f"{stored[0] / GOAL:.2f}",
                         f"{med(rs, 'loop_per_s')[0]:,.0f}", fmt_range(med(rs, "p50_ms")), fmt_range(med(rs, "p99_ms")),
                         "-" if key[2] != "paced" else f"{med(rs, 'lag_p99_s')[0]:.2f} / {med(rs, 'lag_max_s')[2]:.2f}",
                         f"{med(rs, 'cpu_us')[0]:.0f}", keeps, sum(r["errors"] for r in rs)])  # fmt: skip
        table(["backend", "loops", "mode", "sent/s", "stored/s", "x goal", "loop rows/s", "p50 ms", "p99 ms",
               "round lag p99 / max s", "server CPU us/sample", "keeps up 1 Hz", "errors"], rows)  # fmt: skip
        print(f"server memory (MiB) and gpu_samples rows; raw retention {args.raw_s} s, compaction every "
              f"{COMPACT_EVERY_S:g} s by the loop (none with loops off)")  # fmt: skip
        table(["backend", "loops", "RSS start", "after warm-up", "end", "peak", "loop process warm / end",
               "served s", "gpu_samples rows", "of them older than the window", "1 Hz bound", "rollup rows"],
              [[m["backend"], m["loops"], f"{m['start']:.0f}", f"{m['warm']:.0f}", f"{m['end']:.0f}",
                f"{m['peak']:.0f}", f"{m['child_warm']:.0f} / {m['child_end']:.0f}", f"{m['served_s']:.0f}",
                f"{m['raw_rows']:,}", f"{m['past']:,}", f"{m['bound']:,.0f}", f"{m['rollups']:,}"]
               for m in mems])  # fmt: skip
        print(
            f"window: {retention_window_s(args.raw_s):g} s of sample time (raw retention, or the unrolled minute "
            f"plus {Retention.late_s} s late arrivals, plus {COMPACT_EVERY_S:g} s between passes); 1 Hz bound: "
            "GPUs x (1 + the loop's own rate) x window. Rows only age past the window on a server that has run "
            "longer than it; flat-out runs store faster than 1 Hz, so the row count can exceed the 1 Hz bound.\n"
        )
    if service:
        rows = []
        for key in dict.fromkeys((r["backend"], r["path"]) for r in service):
            rs = [r for r in service if (r["backend"], r["path"]) == key]
            per = med(rs, "per_s")
            rows.append([*key, fmt_range(per), f"{per[0] / GOAL:.2f}", f"{med(rs, 'us')[0]:.1f}"])
        print(f"service path in-process, {args.seconds} rounds of every GPU, one transaction per {args.batch}")
        table(["backend", "path", "samples/s", "x goal", "us/sample"], rows)
    if loops_out:
        rows = []
        for backend in dict.fromkeys(r["backend"] for r in loops_out):
            rs = [r for r in loops_out if r["backend"] == backend]
            per = med(rs, "per_s")
            rows.append([backend, f"{args.gpus:,}", fmt_range(med(rs, "tick_ms")), f"{med(rs, 'sim_ms')[0]:.0f}",
                         f"{med(rs, 'tick_max_ms')[2]:.0f}", f"{med(rs, 'first_ms')[0]:.0f}", fmt_range(per),
                         f"{per[0] / GOAL:.2f}"])  # fmt: skip
        print(f"telemetry loop in-process (TelemetryTicker.tick: simulate + store + judge), {args.ticks} ticks")
        table(["backend", "GPUs", "tick ms", "of which simulate ms", "slowest tick ms", "first tick ms", "samples/s",
               "x goal"], rows)  # fmt: skip
    if soaks:
        print(f"retention: {args.soak_s} s of 1 Hz samples in-process, compact every {COMPACT_EVERY_S:g} s, "
              f"raw kept {args.raw_s} s")  # fmt: skip
        table(["backend", "ingest samples/s", "compactions", "compaction ms median / max",
               "longest transaction ms", "gpu_samples rows max",
               "bound", "rows at end", "rollup rows", "bench RSS start / end MiB"],
              [[r["backend"], f"{r['per_s']:,.0f}", r["passes"], f"{r['compact_ms']:.0f} / {r['compact_max_ms']:.0f}",
                f"{r['held_max_ms']:.0f}", f"{r['max_rows']:,}", f"{r['bound']:,.0f}", f"{r['raw_rows']:,}", f"{r['rollups']:,}",
                f"{r['rss_start']:.0f} / {r['rss_end']:.0f}"] for r in soaks])  # fmt: skip
    if profile is not None:
        print(
            "cProfile of the in-process route body (first backend, first repeat), top 25 by own time, then top 30 cumulative:"
        )
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
