"""Load on the API server: requests/s and latency with N concurrent clients, on SQLite and PostgreSQL.

Usage: python benchmarks/api_load.py [--clients 50] [--seconds 10] [--repeats 3] [--workers 2] [--client httpx|raw]
       [--rate 1000] [--backend sqlite|postgresql ...] [--pg-url URL]

For each backend a real `suanli server` process is started on a fresh database (PostgreSQL: `--pg-url`, or a
throwaway server as the test suite starts one), an operator registers the `h20-roce800-128` and
`dgx-h100-superpod-su` presets, a tenant signs up, and then `--clients` asyncio clients (httpx on uvloop, one
connection each, in one load process per core) hammer one endpoint at a time for `--seconds`:
- `GET /orgs/{org}/balance`: an authenticated read (token lookup + balance row + price book);
- `GET /offers`: the offers table from the cached inventory snapshot;
- `POST /quotes`: a repeated quote (after the first, a cache hit; the first costs a plan search per offer).
Each endpoint is loaded twice: closed loop (every client sends its next request as soon as the answer
arrives: the most the server gives) and open loop (the clients together send `--rate` requests/s on a fixed
schedule, latency counted from when each request was due). The goal (issue 4): >= 1,000 authenticated
reads/s with p99 <= 50 ms at 50 clients on 2 cores. The load generator shares the machine's cores with the
server, so these numbers are a floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, free_port, wait_healthy  # noqa: E402

QUOTE = {"model": "llama3.1-8b", "tokens": 1e9, "gpu": "any"}


class HttpxConnection:
    """One `httpx.AsyncClient` (one keep-alive connection): the load generator the issue names. Each distinct
    request is built once and sent again and again (`client.send`): building one (URL join, header merge) is a
    quarter of httpx's CPU per request, which on a small machine is taken from the server under test."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.client = httpx.AsyncClient(base_url=url, headers=headers, timeout=30)
        self.built: dict[tuple[str, str, str], httpx.Request] = {}

    async def request(self, method: str, path: str, json_body: Any = None) -> int:
        key = (method, path, json.dumps(json_body))
        built = self.built.get(key)
        if built is None:
            built = self.built[key] = self.client.build_request(method, path, json=json_body)
        return (await self.client.send(built)).status_code

    async def aclose(self) -> None:
        await self.client.aclose()


class RawConnection:
    """A minimal HTTP/1.1 keep-alive client over asyncio streams: a cheap load generator, so that on a small
    machine the numbers say what the server can do rather than what the client library costs."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.host, self.port = url.removeprefix("http://").split(":")
        self.headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, json_body: Any = None) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, int(self.port))
        assert self.reader is not None
        body = b"" if json_body is None else json.dumps(json_body).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{self.headers}"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await self.reader.readexactly(length)
        return int(status_line.split()[1])

    async def aclose(self) -> None:
        """Close the connection; a further request opens a new one."""
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _client_loop(conn: HttpxConnection | RawConnection, method: str, path: str, body: Any, until: float,
                       lat: list[float], errors: list[int], interval: float | None, first_due: float,
                       done: list[float]) -> None:  # fmt: skip
    """Closed loop (`interval` None): the next request leaves when the answer arrives. Open loop: requests leave
    on a fixed schedule from `first_due` (the same clock for every client, so a client that starts late catches
    up rather than sending less), and latency counts from the scheduled time (no coordinated omission)."""
    due = first_due
    try:
        while True:
            if interval is not None:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
            t = due if interval is not None else time.perf_counter()
            if t >= until:
                return
            status = await conn.request(method, path, body)
            done.append(time.perf_counter())
            lat.append(done[-1] - t)
            if status >= 400:
                errors.append(status)
            if interval is not None:
                due += interval
    finally:
        await conn.aclose()


def _load_process(
    args: tuple[str, str, str, Any, dict[str, str], int, float, float, float | None, str],
) -> tuple[list[float], list[int], float]:
    """One load-generator process: its latencies, error statuses, and how long until its last answer."""
    url, method, path, body, headers, clients, seconds, start_at, interval, client = args
    connection = HttpxConnection if client == "httpx" else RawConnection
    lat: list[float] = []
    errors: list[int] = []
    done: list[float] = []
    began = 0.0

    async def main() -> None:
        nonlocal began
        conns = [connection(url, headers) for _ in range(clients)]  # before the clock starts: an httpx client
        # builds an SSL context, milliseconds each
        await asyncio.sleep(max(0.0, start_at - time.time()))
        began = time.perf_counter()
        until = began + seconds
        spread = interval or 0.0
        await asyncio.gather(*(_client_loop(conn, method, path, body, until, lat, errors, interval,
                                            began + spread * i / clients, done) for i, conn in enumerate(conns)))  # fmt: skip

    uvloop.run(main())  # the event loop the server runs on too (uvicorn[standard]): less CPU per request
    return lat, errors, (max(done) - began) if done else seconds


def run_load(url: str, method: str, path: str, body: Any, headers: dict[str, str], clients: int, seconds: float,
             procs: int, rate: float | None = None, client: str = "httpx") -> dict[str, float]:  # fmt: skip
    """`rate` None: closed loop, as fast as answers come; else open loop at `rate` requests/s in all."""
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    start_at = time.time() + 1.0
    interval = clients / rate if rate else None
    jobs = [(url, method, path, body, headers, n, seconds, start_at, interval, client) for n in per if n]
    with mp.get_context("spawn").Pool(len(jobs)) as pool:
        results = pool.map(_load_process, jobs)
    lat = sorted(x for r in results for x in r[0])
    errors = [x for r in results for x in r[1]]
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0]] * 99
    # Throughput over the time until the last answer: an overloaded open loop finishes late, and says so.
    elapsed = max(seconds, *(r[2] for r in results))
    return {"requests": len(lat), "rps": len(lat) / elapsed, "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000,
            "errors": len(errors)}  # fmt: skip


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu(pid: int) -> float:
    """CPU seconds used by the server process and its workers (Linux /proc): a measure of the server's cost
    per request that noisy neighbours on a shared machine do not distort the way wall-clock latency is."""
    pids = [pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        pids.append(int(entry))
            except OSError:
                continue
    return sum(_cpu_seconds(p) for p in pids)


def start_server(
    db_url: str, home: Path, workers: int, extra: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    # Every tenant signs up from this host: no per-address signup limit gets in the way of `--tenants`.
    env = {**os.environ, "SUANLI_HOME": str(home), "SUANLI_ADMIN_EMAIL": ADMIN_EMAIL,
           "SUANLI_ADMIN_PASSWORD": ADMIN_PASSWORD, "SUANLI_SIGNUP_PER_ADDRESS_PER_HOUR": "1000000"}  # fmt: skip
    log = home / "server.log"
    cmd = [sys.executable, "-m", "suanli.cli.main", "server", "--port", str(port), "--db", db_url,
           "--log-level", "warning", "--workers", str(workers), *(extra or [])]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log, timeout=180)
    return proc, url


def setup(url: str) -> tuple[dict[str, str], str]:
    with httpx.Client(base_url=url, timeout=60) as c:
        admin = c.post("/api/v1/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
        ah = {"Authorization": f"Bearer {admin}"}
        for preset in ("h20-roce800-128", "dgx-h100-superpod-su"):
            c.post("/api/v1/admin/clusters", json={"preset": preset}, headers=ah).raise_for_status()
        r = c.post("/api/v1/signup", json={"email": "tenant@example.com", "password": "tenant-password"})
        r.raise_for_status()
        headers = {"Authorization": f"Bearer {r.json()['token']}"}
        t = time.perf_counter()
        c.post("/api/v1/quotes", json=QUOTE, headers=headers).raise_for_status()
        first_quote_ms = (time.perf_counter() - t) * 1000
        print(f"  first (uncached) quote: {first_quote_ms:.0f} ms")
        return headers, r.json()["org"]["id"]


def bench_backend(name: str, db_url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    home = Path(tempfile.mkdtemp(prefix=f"suanli-bench-{name}-"))
    proc, url = start_server(db_url, home, args.workers)
    rows = []
    try:
        headers, org = setup(url)
        targets = [("balance (auth read)", "GET", f"/api/v1/orgs/{org}/balance", None),
                   ("offers", "GET", "/api/v1/offers", None), ("quotes (repeat)", "POST", "/api/v1/quotes", QUOTE)]  # fmt: skip
        for label, method, path, body in targets:
            if args.endpoint and not any(label.startswith(e) for e in args.endpoint):
                continue
            # Warm up (connections, caches, the token cache of every worker) without recording.
            run_load(url, method, path, body, headers, args.clients, args.warmup, args.load_procs, None, args.client)
            for mode, rate in (("closed", None), (f"open {args.rate:g}/s", args.rate)):
                runs = []
                for _ in range(args.repeats):
                    cpu0 = server_cpu(proc.pid)
                    res = run_load(url, method, path, body, headers, args.clients, args.seconds, args.load_procs,
                                   rate, args.client)  # fmt: skip
                    res["server_cpu_ms"] = (server_cpu(proc.pid) - cpu0) / max(1, res["requests"]) * 1000
                    runs.append(res)
                    print(f"  {label} ({mode}): {res['rps']:.0f} req/s, p50 {res['p50_ms']:.1f} ms, "
                          f"p99 {res['p99_ms']:.1f} ms, server CPU {res['server_cpu_ms']:.2f} ms/request, "
                          f"errors {res['errors']}")  # fmt: skip
                median = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "errors"}
                p99s = sorted(r["p99_ms"] for r in runs)
                rows.append({"backend": name, "endpoint": label, "mode": mode, **median, "p99_range": (p99s[0], p99s[-1]),
                             "errors": sum(r["errors"] for r in runs)})  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(20)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2, help="server worker processes")
    ap.add_argument("--load-procs", type=int, default=2, help="load-generator processes")
    ap.add_argument("--client", choices=["httpx", "raw"], default="httpx",
                    help="load generator: httpx.AsyncClient, or a minimal asyncio HTTP/1.1 client (cheaper)")  # fmt: skip
    ap.add_argument("--endpoint", action="append", choices=["balance", "offers", "quotes"], help="only these")
    ap.add_argument("--repeats", type=int, default=3, help="runs per endpoint and load; the table shows medians")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of unrecorded load before each endpoint")
    ap.add_argument("--rate", type=float, default=1000.0, help="open-loop rate, requests/s over all clients")
    ap.add_argument("--backend", action="append", choices=["sqlite", "postgresql"])
    ap.add_argument("--pg-url", help="admin URL of a PostgreSQL server (default: start a throwaway one)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON at the end")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for backend in args.backend or ["sqlite", "postgresql"]:
        print(f"{backend}: {args.clients} clients, {args.seconds:g} s per endpoint, {args.workers} server worker(s)")
        if backend == "sqlite":
            db_url = f"sqlite+pysqlite:///{tempfile.mkdtemp(prefix='suanli-bench-db-')}/suanli.db"
            rows += bench_backend(backend, db_url, args)
            continue
        from tests import databases

        admin_url = args.pg_url or databases.postgres_server()
        if admin_url is None:
            print(f"  skipped: {databases.postgres_unavailable_reason()}")
            continue
        try:
            rows += bench_backend(backend, databases.new_database(admin_url), args)
        finally:
            if not args.pg_url:
                databases.stop_postgres_server()
    print()
    print(
        f"medians of {args.repeats} runs of {args.seconds:g} s; client: {args.client}; {args.workers} server worker(s)"
    )
    print("| backend | endpoint | load | req/s | p50 ms | p99 ms (min-max) | server CPU ms/req | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["p99_range"]
        print(f"| {r['backend']} | {r['endpoint']} | {r['mode']} | {r['rps']:,.0f} | {r['p50_ms']:.1f} | "
              f"{r['p99_ms']:.1f} ({lo:.0f}-{hi:.0f}) | {r['server_cpu_ms']:.2f} | {r['errors']} |")  # fmt: skip
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
