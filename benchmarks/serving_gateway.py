"""The OpenAI gateway against calling the runtime directly: the same replica, streamed completions at concurrency
1, 16 and 64; added latency to the first token and to the whole request (p50, p99), tokens/s through the gateway
over direct, the server process's CPU per request, and the cold start from zero replicas.

    python benchmarks/serving_gateway.py [--tokens 32] [--token-delay 0.005] [--requests 200] [--rounds 3]
                                         [--transformers]

A real `suanli server` (SQLite) on this host runs one endpoint whose replica is the fake OpenAI runtime of the tests
(`tests/fixtures/fake_openai_runtime.py`, as `vllm` in a published environment), in a bubblewrap sandbox: it sends
`--tokens` tokens `--token-delay` seconds apart, so the numbers are the gateway's overhead, not a model's speed.
Direct requests go to the replica's port; gateway requests to SERVER/v1 with an endpoint key. Modes alternate
(direct, gateway, direct, …) `--rounds` times per concurrency level and each number is the median over the rounds,
so a load spike on a shared machine hits both modes alike. The server process's CPU per request (its own, not its
background loops' child process) is measured in both modes: in direct mode it is what the server burns anyway. `--transformers` also times a cold start of the real `transformers serve` on a tiny model.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.control_plane import admin_token, bearer, live_server, signup  # noqa: E402
from tests.serving_helpers import (  # noqa: E402
    FAST,
    add_hub_model,
    describe,
    fake_environment,
    minimal_model,
    stop_all,
    wait_ready,
)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


async def one(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], model: str, tokens: int
) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    first, n = None, 0
    body = {"model": model, "prompt": "x", "max_tokens": tokens, "stream": True}
    async with client.stream("POST", url, json=body, headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and '"choices": [{' in line:
                first = first or time.perf_counter() - t0
                n += 1
    return first or 0.0, time.perf_counter() - t0, n


async def run(url: str, headers: dict[str, str], model: str, tokens: int, conc: int, total: int) -> dict[str, float]:
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await one(client, url, headers, model, tokens)  # warm the connection pool
        queue = list(range(total))
        out: list[tuple[float, float, int]] = []
        errors: list[str] = []

        async def worker() -> None:
            while queue:
                queue.pop()
                try:
                    out.append(await one(client, url, headers, model, tokens))
                except httpx.HTTPError as e:  # counted and shown: a reset connection must not end the run
                    errors.append(type(e).__name__)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        wall = time.perf_counter() - t0
    ttft, whole = [x[0] for x in out], [x[1] for x in out]
    return {"ttft50": pct(ttft, 50), "ttft99": pct(ttft, 99), "req50": pct(whole, 50), "req99": pct(whole, 99),
            "tps": sum(x[2] for x in out) / wall, "n": len(out), "errors": len(errors)}  # fmt: skip


def cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--token-delay", type=float, default=0.005)
    ap.add_argument("--requests", type=int, default=200, help="per concurrency level and mode (x4 at 64)")
    ap.add_argument("--levels", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=3, help="direct/gateway pairs per level; medians are reported")
    ap.add_argument("--transformers", action="store_true", help="also time a real transformers serve cold start")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="suanli-serving-bench-") as d:
        tmp = Path(d)
        env_dir = fake_environment(tmp / "fakert")
        db_url = f"sqlite+pysqlite:///{tmp / 'suanli.db'}"
        with live_server(tmp / "home", db_url, env={**FAST, "SUANLI_ENVIRONMENTS": f"fakert={env_dir}"}) as srv:
            http = httpx.Client(base_url=srv.url, timeout=60)
            adm = bearer(admin_token(http))
            http.post(
                "/api/v1/admin/clusters", json={"local": True, "name": "this-host"}, headers=adm
            ).raise_for_status()
            add_hub_model(db_url, srv.home, "tiny", "acme/tiny", minimal_model(tmp / "model"))
            who = signup(http, "bench@example.com")
            http.post(f"/api/v1/admin/orgs/{who.org_id}/transactions", json={"kind": "topup", "amount": "1000"},
                      headers=adm).raise_for_status()  # fmt: skip
            try:
                cpu = {"gpus": 0, "cpus": 1, "memory": "1Gi"}
                http.post("/api/v1/endpoints", headers=who.headers, json={"spec": {
                    "name": "bench", "kind": "service", "model": "tiny", "runtime": "vllm", "image": "fakert",
                    "resources": cpu, "replicas": 1, "env": {"FAKE_TOKEN_DELAY_S": str(args.token_delay)}}},
                ).raise_for_status()  # fmt: skip
                key = http.post(
                    "/api/v1/endpoints/bench/keys", json={"password": "tenant-password"}, headers=who.headers
                ).json()["key"]
                port = wait_ready(http, who, "bench", 1)["replicas"][0]["port"]
                direct = (f"http://127.0.0.1:{port}/v1/completions", {}, "bench")
                gateway = (f"{srv.url}/v1/completions", bearer(key), "bench")
                print(
                    f"streamed completions of {args.tokens} tokens, {args.token_delay * 1000:g} ms apart; "
                    f"one replica (fake runtime in a sandbox); 2-core host shared with the load generator"
                )
                print("| concurrency | mode | requests | TTFT p50 ms | TTFT p99 ms | request p50 ms | request p99 ms "
                      "| tokens/s | server CPU ms per request | failed requests |")  # fmt: skip
                print("|---|---|---|---|---|---|---|---|---|---|")
                summary = []
                for conc in [int(x) for x in args.levels.split(",")]:
                    total = args.requests * (4 if conc >= 64 else 1)
                    runs: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
                    for _ in range(args.rounds):
                        for mode, (url, h, model) in (("direct", direct), ("gateway", gateway)):
                            before = cpu_s(srv.proc.pid)
                            r = asyncio.run(run(url, h, model, args.tokens, conc, total))
                            r["cpu"] = (cpu_s(srv.proc.pid) - before) / r["n"]
                            runs[mode].append(r)
                    res = {m: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for m, rs in runs.items()}
                    for mode, r in res.items():
                        print(f"| {conc} | {mode} | {args.rounds} x {r['n']:.0f} | {r['ttft50'] * 1000:.1f} | "
                              f"{r['ttft99'] * 1000:.1f} | {r['req50'] * 1000:.1f} | {r['req99'] * 1000:.1f} | "
                              f"{r['tps']:.0f} | {r['cpu'] * 1000:.2f} | {r['errors']:.0f} |")  # fmt: skip
                    g, dd = res["gateway"], res["direct"]
                    summary.append((conc, (g["ttft50"] - dd["ttft50"]) * 1000, (g["ttft99"] - dd["ttft99"]) * 1000,
                                    (g["req50"] - dd["req50"]) * 1000, (g["req99"] - dd["req99"]) * 1000,
                                    g["tps"] / dd["tps"], (g["cpu"] - dd["cpu"]) * 1000))  # fmt: skip
                print("\n| concurrency | added TTFT p50 ms | added TTFT p99 ms | added request p50 ms | added request "
                      "p99 ms | tokens/s gateway/direct | gateway CPU ms per request |")  # fmt: skip
                print("|---|---|---|---|---|---|---|")
                for row in summary:
                    print("| {} | {:+.1f} | {:+.1f} | {:+.1f} | {:+.1f} | {:.3f}x | {:.2f} |".format(*row))
                # cold start: an endpoint at zero replicas, the first request waits for one
                http.post("/api/v1/endpoints", headers=who.headers, json={"spec": {
                    "name": "cold", "kind": "service", "model": "tiny", "runtime": "vllm", "image": "fakert",
                    "resources": cpu, "autoscale": {"min_replicas": 0, "max_replicas": 1, "idle_s": 5}}},
                ).raise_for_status()  # fmt: skip
                ckey = http.post(
                    "/api/v1/endpoints/cold/keys", json={"password": "tenant-password"}, headers=who.headers
                ).json()["key"]
                colds = []
                for _ in range(3):
                    while describe(http, who, "cold")["replicas"]:
                        time.sleep(0.5)
                    t0 = time.perf_counter()
                    r = httpx.post(f"{srv.url}/v1/completions", headers=bearer(ckey), timeout=300,
                                   json={"model": "cold", "prompt": "x", "max_tokens": 1})  # fmt: skip
                    r.raise_for_status()
                    colds.append(time.perf_counter() - t0)
                print(f"\ncold start from zero (fake runtime), 3 runs: {', '.join(f'{c:.2f} s' for c in colds)}; "
                      f"median {statistics.median(colds):.2f} s")  # fmt: skip
                if args.transformers:
                    cold_transformers(http, who, db_url, srv.home, tmp, srv.url)
            finally:
                stop_all(http, [who])


def cold_transformers(http: httpx.Client, who, db_url: str, home: Path, tmp: Path, url: str) -> None:  # type: ignore[no-untyped-def]
    from tests.hub_fixtures import make_model

    model = make_model(tmp / "tiny-llama")
    add_hub_model(db_url, home, "tiny-llama", "acme/tiny-llama", model)
    t0 = time.perf_counter()
    http.post("/api/v1/endpoints", headers=who.headers, json={"spec": {
        "name": "real", "kind": "service", "model": "tiny-llama", "runtime": "transformers",
        "resources": {"gpus": 0, "cpus": 1, "memory": "4Gi"}}}).raise_for_status()  # fmt: skip
    key = http.post("/api/v1/endpoints/real/keys", json={"password": "tenant-password"}, headers=who.headers).json()[
        "key"
    ]
    r = httpx.post(f"{url}/v1/completions", headers=bearer(key), timeout=600,
                   json={"model": "real", "prompt": "hello", "max_tokens": 1})  # fmt: skip
    r.raise_for_status()
    print(f"cold start of a real transformers serve replica (tiny Llama, CPU): deploy to first token "
          f"{time.perf_counter() - t0:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
