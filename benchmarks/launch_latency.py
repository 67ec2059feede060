"""Submit → all ranks running for a 4-node gang through suanli, side by side with the engine alone.

Usage: python benchmarks/launch_latency.py [--engine slurm] [--engine ray] [--runs 20] [--failures]

For each engine a real one-host cluster of 4 GPU nodes (8 fake GPUs each) is started with the tests' fixtures
(tests/slurm_cluster.py, tests/ray_cluster.py) and a real `suanli server` (SQLite) runs on it. Each run submits a
4-node, 32-GPU job through the API whose every rank first prints the wall clock; the launch time is the latest
rank's start minus the moment the submission was sent (so the API's answer, the scheduling pass, the supervisor's
launch, the engine and the sandbox all count; polling by this script does not). The engine alone runs the same
command on the same 4 nodes: Slurm, `sbatch --nodelist … --wrap 'srun …'`; Ray, `ray job submit` of a driver that
places one bundle per node and runs one task in each, and (a second baseline) the same placement group and
tasks from a driver that stays connected between runs, as suanli's server does, so `ray job submit`'s own job
start-up is not counted against Ray. Both sides are measured the same way: from just before the
submission to the latest rank's first line. It also counts ranks that ran on another node than the one the
scheduler chose (the engine's own record of where each rank ran), and with `--failures` times a node killed
mid-run (until the job runs again elsewhere) and a server killed with SIGKILL (until the restarted server reports
the running job again). Prints markdown tables; quote medians.

Slurm starts a job at the next pass of slurmctld's scheduler (here the backfill pass, every second: bf_interval=1),
not at submission, so a launch waits 0-1 s for it. A submission made just after wait_idle is in step with that
cadence (the last job ended on it), so each side waits a random 0-1 s (the same draws) before it submits: both
then meet the scheduler at random moments, as real submissions do.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.control_plane import Tenant, admin_token, bearer, live_server, signup  # noqa: E402

STAMP = "python3 -c 'import time; print(\"started\", repr(time.time()), flush=True)'"
FAST = {"SUANLI_SCHEDULE_INTERVAL_S": "0.1", "SUANLI_METER_INTERVAL_S": "1", "SUANLI_STOP_GRACE_S": "2",
        "SUANLI_ENGINE_SYNC_S": "1"}  # fmt: skip
NODES, GPUS = 4, 8


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def _wait(what: str, check: Callable[[], Any], timeout: float = 120.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise RuntimeError(f"timed out waiting for {what}")


def _stamps(text: str) -> list[float]:
    return [float(line.split()[1]) for line in text.splitlines() if line.startswith("started ")]


@dataclass
class Result:
    suanli: list[float] = field(default_factory=list)
    engine: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)  # Ray only: a driver already connected (no job startup)
    misplaced: int = 0
    ranks: int = 0
    node_kill_s: float | None = None
    server_kill_s: tuple[float, float] | None = None


@dataclass
class Platform:
    """A suanli server on one engine, with a tenant who can pay for 32 GPUs."""

    http: httpx.Client
    tenant: Tenant
    admin: dict[str, str]
    home: Path
    cluster: str
    srv: Any = None
    db: str = ""
    env: dict[str, str] = field(default_factory=dict)
    stack: ExitStack = field(default_factory=ExitStack)  # a restarted server lives until the platform closes

    def submit(self, command: str, name: str, retry: int = 0, gpus: int = NODES * GPUS) -> str:
        spec = {"name": name, "command": command, "resources": {"gpu": "H100", "gpus": gpus},
                "retry": {"on": ["node-failure"], "limit": retry}}  # fmt: skip
        r = self.http.post("/api/v1/workloads", json={"spec": spec}, headers=self.tenant.headers)
        r.raise_for_status()
        return str(r.json()["id"])

    def doc(self, wid: str) -> dict[str, Any]:
        r = self.http.get(f"/api/v1/workloads/{wid}", headers=self.tenant.headers)
        r.raise_for_status()
        return dict(r.json())

    def log(self, wid: str, rank: int) -> str:
        r = self.http.get(f"/api/v1/workloads/{wid}/logs", params={"rank": rank}, headers=self.tenant.headers)
        r.raise_for_status()
        return str(r.json()["data"])

    def launch_once(self, i: int) -> tuple[float, dict[str, Any]]:
        t0 = time.time()
        wid = self.submit(f"{STAMP}; sleep 1", f"launch-{i}")
        doc = _wait("the job to end", lambda: (d := self.doc(wid))["state"] in ("succeeded", "failed", "lost") and d)
        if doc["state"] != "succeeded":
            raise RuntimeError(f"run {i} {doc['state']}: {doc['reason']}")
        stamps = [s for r in range(NODES) for s in _stamps(self.log(wid, r))]
        if len(stamps) != NODES:
            raise RuntimeError(f"run {i}: {len(stamps)} of {NODES} ranks printed their start")
        return max(stamps) - t0, doc


@contextmanager
def platform(engine_env: dict[str, str], cluster: str) -> Iterator[Platform]:
    tmp = Path(tempfile.mkdtemp(prefix="suanli-launch-"))
    with live_server(tmp / "home", f"sqlite+pysqlite:///{tmp / 'suanli.db'}", env={**FAST, **engine_env}) as srv:
        http = httpx.Client(base_url=srv.url, timeout=60)
        adm = bearer(admin_token(http))
        _wait(f"{cluster}'s nodes", lambda: len([n for n in http.get("/api/v1/admin/nodes", params={"cluster": cluster},
              headers=adm).json() if n["state"] == "ready"]) >= NODES, timeout=90)  # fmt: skip
        tenant = signup(http, "bench@example.com")
        http.post(f"/api/v1/admin/orgs/{tenant.org_id}/transactions", json={"kind": "topup", "amount": "100000"},
                  headers=adm).raise_for_status()  # fmt: skip
        db = f"sqlite+pysqlite:///{tmp / 'suanli.db'}"
        with ExitStack() as stack:
            p = Platform(http, tenant, adm, srv.home, cluster, srv, db, {**FAST, **engine_env}, stack)
            yield p
            p.http.close()


# ---- Slurm --------------------------------------------------------------------------------------------------------
def slurm(runs: int, failures: bool) -> Result:
    from tests.slurm_cluster import slurm_cluster

    res = Result()
    with slurm_cluster(n_nodes=NODES, gpus_per_node=GPUS) as sc:
        env = {"SUANLI_SLURM": "true", "SUANLI_SLURM_CONF": str(sc.conf), "SLURM_CONF": str(sc.conf)}
        with platform(env, "slurm") as p:
            out = Path(tempfile.mkdtemp(prefix="suanli-sbatch-"))
            phase = random.Random(7)
            for i in range(runs):  # interleaved: both sides see the same machine, and idle nodes
                sc.wait_idle()
                time.sleep(phase.uniform(0, 1))  # a random moment of slurmctld's 1 s scheduling cadence (see below)
                dt, doc = p.launch_once(i)
                res.suanli.append(dt)
                attempt = p.home / "workloads" / doc["id"] / f"attempt-{doc['attempt']}"
                for r, chosen in enumerate(doc["allocation"]["nodes"]):  # node-ranks in placement order
                    ran = json.loads((attempt / f"rank-{r}.slurm.json").read_text())["node"]  # slurmd's own name
                    res.misplaced += f"slurm.{ran}" != chosen
                    res.ranks += 1
                sc.wait_idle()
                time.sleep(phase.uniform(0, 1))
                res.engine.append(_sbatch_once(sc, out / f"run-{i}.out"))
            report("slurm", res)
            if failures:
                res.server_kill_s = _server_kill(p)
                res.node_kill_s = _node_kill(p, lambda node: sc.kill_node(node.removeprefix("slurm.")))
    return res


def _sbatch_once(sc: Any, out: Path) -> float:
    nodes = ",".join(sc.nodes[:NODES])
    t0 = time.time()
    sc.run("sbatch", "--parsable", f"--nodelist={nodes}", f"--nodes={NODES}", "--ntasks-per-node=1",
           f"--gres=gpu:{GPUS}", f"--output={out}", "--wrap", f"srun {STAMP}")  # fmt: skip
    stamps = _wait("sbatch's ranks", lambda: len(s := _stamps(out.read_text() if out.exists() else "")) == NODES and s)
    return max(stamps) - t0


# ---- Ray ----------------------------------------------------------------------------------------------------------
RAY_DRIVER = r"""
import ray, subprocess, sys
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init()
nodes = sys.argv[1].split(",")
pg = placement_group([{"GPU": 8, "CPU": 0.01} for _ in nodes], strategy="STRICT_SPREAD",
                     bundle_label_selector=[{"ray.io/node-id": n} for n in nodes])
ray.get(pg.ready())
command = sys.argv[2]  # passed to each task: a task's own sys.argv is its Ray worker's, not this driver's
@ray.remote(num_gpus=8, num_cpus=0.01)
def rank(command):
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
out = ray.get([rank.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote(command)
               for i in range(len(nodes))])
print("".join(out), flush=True)
"""


# The same placement from a driver that stays connected between runs, as suanli's server does: what Ray itself
# needs to start one task per chosen node, without `ray job submit`'s own job driver start-up. One line in per run
# (the chosen node ids), one line out (the seconds until the latest task printed its start).
RAY_WARM_DRIVER = r"""
import json, subprocess, sys, time
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init(logging_level="ERROR", log_to_driver=False)
command = sys.argv[1]
@ray.remote(num_gpus=8, num_cpus=0.01)
def rank(command):
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
print("ready", flush=True)
for line in sys.stdin:
    nodes = line.split()
    t0 = time.time()
    pg = placement_group([{"GPU": 8, "CPU": 0.01} for _ in nodes], strategy="STRICT_SPREAD",
                         bundle_label_selector=[{"ray.io/node-id": n} for n in nodes])
    ray.get(pg.ready())
    out = ray.get([rank.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote(command)
                   for i in range(len(nodes))])
    remove_placement_group(pg)
    stamps = [float(w.split()[1]) for o in out for w in o.splitlines() if w.startswith("started ")]
    print(json.dumps(max(stamps) - t0), flush=True)
"""


def ray(runs: int, failures: bool) -> Result:
    from tests.ray_cluster import RayCluster

    res = Result()
    workers = tuple((f"node-{i + 1}", f"leaf-{i // 2}", "spine-0") for i in range(NODES))
    with RayCluster.started(workers=workers, dashboard=True) as cluster:
        env = {"SUANLI_RAY_ADDRESS": cluster.address, **cluster.driver_env()}
        driver = Path(tempfile.mkdtemp(prefix="suanli-ray-")) / "driver.py"
        driver.write_text(RAY_DRIVER)
        warm = subprocess.Popen([sys.executable, "-c", RAY_WARM_DRIVER, STAMP], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env={**os.environ, **cluster.driver_env()})  # fmt: skip
        assert warm.stdin is not None and warm.stdout is not None
        if warm.stdout.readline().strip() != "ready":
            raise RuntimeError("the warm Ray driver did not connect")
        ids = " ".join(cluster.node_ids[w.name] for w in cluster.workers[:NODES])
        with platform(env, "ray") as p:
            for i in range(runs):
                dt, doc = p.launch_once(i)
                res.suanli.append(dt)
                res.ranks += NODES
                res.misplaced += _ray_misplaced(p, cluster, doc)
                res.engine.append(_ray_job_once(cluster, driver))
                warm.stdin.write(ids + "\n")
                warm.stdin.flush()
                res.warm.append(float(warm.stdout.readline()))
            warm.stdin.close()
            warm.wait(timeout=60)
            report("ray", res)
            if failures:
                res.server_kill_s = _server_kill(p)
                res.node_kill_s = _node_kill(p, lambda node: cluster.kill_node(node.removeprefix("ray.")))
    return res


def _ray_misplaced(p: Platform, cluster: Any, doc: dict[str, Any]) -> int:
    """Ranks whose actor ran on another Ray node than the one suanli's placement named, by Ray's own record."""
    from tests.ray_cluster import actor_nodes

    wanted = {n["name"]: n["labels"].get("engine_host") for n in
              p.http.get("/api/v1/admin/nodes", params={"cluster": "ray"}, headers=p.admin).json()}  # fmt: skip
    prefix = f"suanli:{doc['id']}:a{doc['attempt']}:r"
    ran = {int(name[len(prefix) :]): node for name, node in actor_nodes(cluster, prefix).items()}
    return sum(ran.get(r) != wanted.get(node) for r, node in enumerate(doc["allocation"]["nodes"]))


def _ray_job_once(cluster: Any, driver: Path) -> float:
    ids = ",".join(cluster.node_ids[w.name] for w in cluster.workers[:NODES])
    env = {**os.environ, **cluster.driver_env()}
    t0 = time.time()
    out = subprocess.run(["ray", "job", "submit", "--address", cluster.dashboard_url, "--working-dir", str(driver.parent),
                          "--", "python", driver.name, ids, STAMP], capture_output=True, text=True, env=env,
                         timeout=300, check=True).stdout  # fmt: skip
    return max(_stamps(out)) - t0


def _server_kill(p: Platform) -> tuple[float, float]:
    """SIGKILL the server while a 4-node job runs and start it again: (seconds until the restarted server answers,
    seconds between the job's end and the restarted server recording it). The e2e tests check it finishes once."""
    wid = p.submit("sleep 12", "outlive")
    _wait("it to run", lambda: p.doc(wid)["state"] == "running")
    time.sleep(2)
    t0 = time.monotonic()
    os.kill(p.srv.proc.pid, signal.SIGKILL)
    p.srv.proc.wait()
    p.srv = srv = p.stack.enter_context(live_server(p.home, p.db, env=p.env))
    up = time.monotonic() - t0
    p.http.close()
    p.http = httpx.Client(base_url=srv.url, timeout=60)
    doc = _wait("it to end", lambda: (d := p.doc(wid))["state"] in ("succeeded", "failed", "lost") and d)
    seen = time.time()
    if doc["state"] != "succeeded" or doc["attempt"] != 1:
        raise RuntimeError(f"after the restart the job {doc['state']} (attempt {doc['attempt']}): {doc['reason']}")
    ended = datetime.fromisoformat(doc["allocation"]["stopped_at"].replace("Z", "+00:00")).timestamp()
    return up, seen - ended


# ---- failures -----------------------------------------------------------------------------------------------------
def _node_kill(p: Platform, kill: Callable[[str], None]) -> float:
    wid = p.submit("sleep 600", "survivor", retry=3, gpus=GPUS)  # one node: three are left to move to
    first = _wait("it to run", lambda: (d := p.doc(wid))["state"] == "running" and d)
    victim = sorted(first["allocation"]["nodes"])[0]
    t0 = time.monotonic()
    kill(victim)
    _wait("it to run elsewhere", lambda: (d := p.doc(wid))["state"] == "running" and d["attempt"] > first["attempt"],
          timeout=120)  # fmt: skip
    dt = time.monotonic() - t0
    p.http.post(f"/api/v1/workloads/{wid}/stop", headers=p.tenant.headers)
    return dt


def report(engine: str, r: Result) -> None:
    """The launch figures as soon as they are in (the failure runs come after), on stderr."""
    print(f"{engine}: suanli {sorted(round(x, 3) for x in r.suanli)}", file=sys.stderr)
    print(f"{engine}: alone  {sorted(round(x, 3) for x in r.engine)}", file=sys.stderr)
    if r.warm:
        print(f"{engine}: warm   {sorted(round(x, 3) for x in r.warm)}", file=sys.stderr)
    print(table({engine: r}), file=sys.stderr, flush=True)


def table(results: dict[str, Result]) -> str:
    rows = ["| engine | runs | suanli p50 | suanli p99 | engine alone p50 | engine alone p99 | added p50 | ratio p50 |"
            " ranks elsewhere than chosen |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in results.items():
        s50, e50 = statistics.median(r.suanli), statistics.median(r.engine)
        rows.append(f"| {name} | {len(r.suanli)} | {s50:.3f} s | {pct(r.suanli, 99):.3f} s | {e50:.3f} s | "
                    f"{pct(r.engine, 99):.3f} s | {s50 - e50:+.3f} s | {s50 / e50:.2f}x | {r.misplaced} of {r.ranks} |")  # fmt: skip
        if r.warm:
            w50 = statistics.median(r.warm)
            rows.append(f"| {name} (warm driver) | {len(r.warm)} | {s50:.3f} s | {pct(r.suanli, 99):.3f} s | "
                        f"{w50:.3f} s | {pct(r.warm, 99):.3f} s | {s50 - w50:+.3f} s | {s50 / w50:.2f}x | |")  # fmt: skip
    extra = []
    for n, r in results.items():
        if r.node_kill_s is not None:
            extra.append(f"| {n} | a node killed (SIGKILL of its daemons and jobs) | running again on other nodes "
                         f"{r.node_kill_s:.1f} s after the kill |")  # fmt: skip
        if r.server_kill_s is not None:
            up, lag = r.server_kill_s
            extra.append(f"| {n} | the server killed with SIGKILL mid-run | restarted and answering in {up:.1f} s; "
                         f"the job's end recorded {lag:.1f} s after it ended, once |")  # fmt: skip
    if extra:
        rows += ["", "| engine | failure | recovery |", "|---|---|---|", *extra]
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", action="append", choices=("slurm", "ray"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--failures", action="store_true", help="also time a server kill and a node kill")
    args = ap.parse_args()
    results = {}
    for engine in args.engine or ["slurm", "ray"]:
        results[engine] = (slurm if engine == "slurm" else ray)(args.runs, args.failures)
        print(f"{engine}: done", file=sys.stderr)
    print(table(results))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
