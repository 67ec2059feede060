"""A real Ray cluster on this one host for the tests and benchmarks: a head (0 GPUs) and worker nodes with fake GPUs.

No tests here; `tests/test_ray_executor.py` takes the session fixture `ray_cluster`, a benchmark uses
`with RayCluster.started() as cluster:`. Each node is a `ray start --block` process of its own session, so the
cluster is what production runs (separate GCS, raylets and agents talking over TCP), and everything a node started
(raylet, agents, workers, the ranks our actors started) is its process tree: killing that tree is a node dying.

What one host needs that a real cluster gets for free, and how it is handled here:

- Token authentication: Ray 2.60's `ray start` turns it on by itself when a token is lying around
  (`~/.ray/auth_token`, left by any earlier local `ray.init()`), while a driver connecting to an explicit address
  never does, so a stray file makes every connection fail. We always run `RAY_AUTH_MODE=token` with a fresh token
  in a private 0600 file (`RAY_AUTH_TOKEN_PATH`), set for the nodes and, via `driver_env()`, for the drivers.
  Ray reads RAY_AUTH_MODE when `ray` is imported: the fixture never imports it before setting the variables.
- Ports: every node gets its own GCS/node-manager/object-manager/agent/metrics ports and a disjoint worker port
  range, picked below the kernel's ephemeral range (where outgoing connections would take them) and probed free.
- Memory: a small object store per node (`--object-store-memory`), and `--memory`/`--num-cpus` stated rather than
  each node claiming the whole host.
- PATH and python: the nodes run this interpreter with its `bin/` first on PATH, so a job's `python` is the venv's.
- Stopping: `ray stop` would kill every Ray process on the host (other sessions' clusters too), and gcs_server may
  outlive a SIGTERM; we SIGKILL each node's process tree, then anything still naming our temp dir.
- Node death: `RAY_health_check_*` make the GCS declare a killed node dead in ~3 s (default: ~30 s).
- Orphans: a rank's supervisor leaves its actor's session (on purpose: a stop signals the job, not Ray), so if the
  actor alone dies Ray's per-worker process-group cleanup misses it. The raylet runs as a subreaper instead
  (`RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper=true`, `RAY_process_group_cleanup_enabled=false`,
  which production nodes want too): it SIGKILLs the supervisor at once and the job within ~8 s.
- Idle workers: no prestarted Python workers per (fake) CPU, and no Ray memory monitor (four nodes, one host).
- A private `--temp-dir` per node (short: Ray's Unix socket paths must stay under 108 bytes). Nodes sharing one
  temp dir name their sockets `raylet.1`, `raylet.2`… by looking at what exists, so two nodes starting at once
  took the same name and one raylet died on "bind: Address already in use" (its `ray start` then hangs).
- Addresses: Ray maps 127.0.0.1 to the host's own IP (`--node-ip-address=127.0.0.1` is ignored), so every node,
  and `address`, is on that IP.
- Start time: every Ray process imports jsonschema, which imports `rfc3987_syntax` when installed (schemathesis
  pulls it in) and that builds a grammar for 3 s; with a dozen Python processes per cluster on 2 cores that made
  nodes miss Ray's 30 s registration deadline. The nodes get a PYTHONPATH entry where that import fails fast, a
  longer `RAY_raylet_start_wait_time_s`, no log monitor and no autoscaler monitor: ~22 s to start on 2 idle cores.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

GPUS_PER_NODE = 8
GPU_LABEL = "H100-SXM"
# (name, leaf, spine) of each worker node: two leaves under one spine.
WORKERS = (("node-1", "leaf-0", "spine-0"), ("node-2", "leaf-0", "spine-0"), ("node-3", "leaf-1", "spine-0"))
OBJECT_STORE_BYTES = 80 << 20  # Ray's minimum is 75 MiB; four of these live in /dev/shm
WORKER_CPUS = 8
WORKER_MEMORY_BYTES = 4 << 30
START_TIMEOUT_S = 180.0  # a head took over 90 s once, on a 2-core machine running other tests beside it
HEALTH_ENV = {  # the GCS pings each raylet every second and gives up after 3 misses
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
REQUIRE_ENV = "SUANLI_REQUIRE_RAY"


def ray_unavailable_reason() -> str | None:
    """Why there can be no cluster here (Ray not importable), or None."""
    import importlib.util

    # Not `import ray`: Ray reads RAY_AUTH_MODE when imported, and the fixture sets it only once the cluster runs.
    if importlib.util.find_spec("ray") is None:
        return "ray is not installed; pip install -e '.[ray]'"
    if shutil.which("ray", path=str(Path(sys.executable).parent)) is None:
        return f"no `ray` command next to {sys.executable}"
    return None


# -- ports ----------------------------------------------------------------------------------------------------------


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class _Ports:
    """Ports below the ephemeral range, starting at a random base, each probed free when handed out."""

    def __init__(self) -> None:
        self.next = random.randrange(12000, 28000, 100)

    def one(self) -> int:
        while not _bindable(self.next):
            self.next += 1
        self.next += 1
        return self.next - 1

    def span(self, n: int) -> tuple[int, int]:
        while True:
            lo = self.next
            self.next += n
            if all(_bindable(p) for p in range(lo, lo + n)):
                return lo, lo + n - 1


# -- processes ------------------------------------------------------------------------------------------------------


def _tree(root: int) -> set[int]:
    """`root`, its session and all their descendants (those that left the session too: the ranks' supervisors)."""
    from suanli.executors.proctree import family

    return {root, *family(root)}


def _naming(text: str) -> set[int]:
    """Processes whose command line mentions `text` (our temp dir): what outlived its parent's tree."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.add(int(name))
            except OSError:
                pass
    return found


def _kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class RayNodeProc:
    """One `ray start --block` process and what we told it."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    node_manager_port: int
    gpus: int
    labels: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    node_id: str = ""
    killed: bool = False

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True, cwd=self.log.parent)  # fmt: skip
        self.killed = False

    def kill(self) -> None:
        """SIGKILL the whole node at once (raylet, agents, workers, the ranks they run), as if its host died."""
        assert self.proc is not None
        for _ in range(3):  # a raylet may fork a worker while we look: sweep again
            pids = _tree(self.proc.pid)
            if pids == {self.proc.pid} and self.proc.poll() is not None:
                break
            _kill(pids)
            time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self.killed = True


@dataclass
class RayCluster:
    """A running cluster: `address` (GCS host:port), `nodes` (head first), `driver_env()` for drivers."""

    address: str
    temp_dir: Path
    token_file: Path
    nodes: list[RayNodeProc] = field(default_factory=list)
    dashboard_url: str | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds each start phase took

    @property
    def workers(self) -> list[RayNodeProc]:
        return [n for n in self.nodes if n.name != "head"]

    def node(self, name: str) -> RayNodeProc:
        return next(n for n in self.nodes if n.name == name)

    @property
    def node_ids(self) -> dict[str, str]:
        """suanli.io/name → Ray node id of every node started (the head as "head")."""
        return {n.name: n.node_id for n in self.nodes}

    def driver_env(self) -> dict[str, str]:
        """What a driver process (a RayExecutor's server, `ray job submit`) needs in its environment."""
        env = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_file),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ADDRESS": self.address,
        }
        if self.dashboard_url:
            env["RAY_API_SERVER_ADDRESS"] = self.dashboard_url
        return env

    def kill_node(self, name: str) -> None:
        """The node dies at once, with everything it runs (its Ray node id is dead for good)."""
        self.node(name).kill()

    def restart_node(self, name: str) -> str:
        """Start a killed node again, same name, labels and ports: Ray gives it a new node id (returned)."""
        node = self.node(name)
        if not node.killed:
            node.kill()
        node.log.write_bytes(b"")
        node.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        _wait_started(node, deadline)
        self._learn_node_ids(deadline)
        return node.node_id

    def stop(self) -> None:
        """Everything goes: worker nodes first, then the head; then stragglers naming our temp dir; then the dir."""
        for node in [*self.workers, *self.nodes[:1]]:
            if not node.killed and node.proc is not None:
                node.kill()
        for _ in range(3):
            left = _naming(str(self.temp_dir))
            if not left:
                break
            _kill(left)
            time.sleep(0.1)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    # -- starting ---------------------------------------------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def started(
        cls, workers: tuple[tuple[str, str, str], ...] = WORKERS, dashboard: bool = False
    ) -> Iterator[RayCluster]:
        """Start a cluster, yield it, stop it (also on interpreter exit, should the caller never come back)."""
        cluster = cls.start(workers, dashboard)
        atexit.register(cluster.stop)
        try:
            yield cluster
        finally:
            cluster.stop()
            atexit.unregister(cluster.stop)

    @classmethod
    def start(cls, workers: tuple[tuple[str, str, str], ...] = WORKERS, dashboard: bool = False) -> RayCluster:
        reason = ray_unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        temp_dir = Path(tempfile.mkdtemp(prefix="sr-", dir="/tmp"))  # short: socket paths live under it
        token_file = temp_dir / "auth_token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, secrets.token_hex(32).encode())
        os.close(fd)
        shim = temp_dir / "shim" / "rfc3987_syntax"
        shim.mkdir(parents=True)
        (shim / "__init__.py").write_text('raise ImportError("left out by tests/ray_cluster.py: 3 s to import")\n')
        ports = _Ports()
        gcs_port = ports.one()
        cluster = cls(address=f"{_node_ip()}:{gcs_port}", temp_dir=temp_dir, token_file=token_file)
        t0 = time.monotonic()
        try:
            dash_port = ports.one() if dashboard else None
            head = cluster._spawn(ports, "head", 0, 1, 1 << 30, {}, ["--head", f"--port={gcs_port}"], dash_port)
            deadline = time.monotonic() + START_TIMEOUT_S
            _wait_started(head, deadline)  # workers joining a half-started head only retry and slow it down
            cluster.timings["head"] = time.monotonic() - t0
            if dash_port is not None:
                cluster.dashboard_url = f"http://127.0.0.1:{dash_port}"
            for name, leaf, spine in workers:  # together: each node has its own temp dir, so nothing races
                labels = {"suanli.io/name": name, "suanli.io/gpu": GPU_LABEL, "suanli.io/leaf": leaf,
                          "suanli.io/spine": spine, "suanli.io/nvlink-domain": f"{name}-nvl"}  # fmt: skip
                cluster._spawn(ports, name, GPUS_PER_NODE, WORKER_CPUS, WORKER_MEMORY_BYTES, labels,
                               [f"--address={cluster.address}"], None)  # fmt: skip
            for node in cluster.workers:
                _wait_started(node, deadline)
            cluster.timings["workers"] = time.monotonic() - t0 - cluster.timings["head"]
            t = time.monotonic()
            cluster._learn_node_ids(deadline)
            cluster.timings["node ids"] = time.monotonic() - t
            cluster.timings["total"] = time.monotonic() - t0
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _node_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SUANLI_"))}
        venv_bin = str(Path(sys.executable).parent)
        env["PATH"] = f"{venv_bin}:{env.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"
        env.pop("VIRTUAL_ENV", None)
        env.update(self.driver_env())
        env.pop("RAY_ADDRESS")
        env.pop("RAY_API_SERVER_ADDRESS", None)
        env.update(HEALTH_ENV)
        env["RAY_raylet_start_wait_time_s"] = "90"
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(self.temp_dir / "shim"), env.get("PYTHONPATH")) if x)
        # A rank's supervisor (left its session on purpose) goes when its actor's worker does: the raylet kills it.
        env["RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper"] = "true"
        env["RAY_process_group_cleanup_enabled"] = "false"  # which would win over the subreaper, and miss it
        env["RAY_memory_monitor_refresh_ms"] = "0"  # four "nodes" share one host's memory: no OOM killer by Ray
        env["RAY_enable_worker_prestart"] = "0"  # idle Python workers per fake CPU would swamp 2 real cores
        env["RAY_prestart_worker_first_driver"] = "0"
        return env

    def _spawn(self, ports: _Ports, name: str, gpus: int, cpus: int, memory: int, labels: dict[str, str],
               extra: list[str], dashboard_port: int | None) -> RayNodeProc:  # fmt: skip
        lo, hi = ports.span(40)
        nm_port = ports.one()
        argv = [str(Path(sys.executable).parent / "ray"), "start", "--block", "--disable-usage-stats",
                "--include-log-monitor=false",  # it streams worker output to drivers: we read rank logs, not Ray's
                f"--temp-dir={self.temp_dir / name}",  # each node its own, as each host has its /tmp/ray
                f"--num-gpus={gpus}", f"--num-cpus={cpus}", f"--memory={memory}",
                f"--object-store-memory={OBJECT_STORE_BYTES}", f"--node-manager-port={nm_port}",
                f"--object-manager-port={ports.one()}", f"--min-worker-port={lo}", f"--max-worker-port={hi}",
                f"--dashboard-agent-listen-port={ports.one()}", f"--dashboard-agent-grpc-port={ports.one()}",
                f"--runtime-env-agent-port={ports.one()}", f"--metrics-export-port={ports.one()}", *extra]  # fmt: skip
        if "--head" in extra:
            argv += [f"--ray-client-server-port={ports.one()}", "--no-monitor"]  # no autoscaler here
            # The (minimal) dashboard process runs either way, on 8265 unless told: another cluster's port.
            include = "false" if dashboard_port is None else "true"
            port = dashboard_port if dashboard_port is not None else ports.one()
            argv += [f"--include-dashboard={include}", "--dashboard-host=127.0.0.1", f"--dashboard-port={port}"]
        if labels:
            argv.append("--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
        (self.temp_dir / name).mkdir(exist_ok=True)
        node = RayNodeProc(name, argv, self._node_env(), self.temp_dir / f"{name}.out", nm_port, gpus, labels)
        self.nodes.append(node)
        node.start()
        return node

    def _learn_node_ids(self, deadline: float) -> None:
        """Ask the GCS (from a throwaway driver: this process must stay free to connect with its own namespace)."""
        code = (
            "import json, ray, time\n"
            f"ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False)\n"
            f"want = {sum(not n.killed for n in self.nodes)}\n"
            "while True:\n"
            "    alive = [n for n in ray.nodes() if n['Alive']]\n"
            "    if len(alive) >= want: break\n"
            "    time.sleep(0.2)\n"
            "print(json.dumps({n['NodeManagerPort']: n['NodeID'] for n in alive}))\n"
        )
        env = {**self._node_env(), **self.driver_env()}
        left = max(1.0, deadline - time.monotonic())
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=left)
        if out.returncode != 0:
            raise RuntimeError(f"could not list the cluster's nodes: {out.stderr[-2000:]}")
        import json

        ids = {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
        for node in self.nodes:
            if not node.killed:
                node.node_id = ids[node.node_manager_port]


def actor_nodes(cluster: RayCluster, prefix: str) -> dict[str, str]:
    """Ray's own record of where actors whose name starts with `prefix` ran (the GCS's actor table; dead actors stay
    in it): name -> node id. Asked from a throwaway driver, so the caller never becomes one."""
    code = (
        "import json, ray\n"
        f"ray.init(address={cluster.address!r}, logging_level='ERROR', log_to_driver=False)\n"
        "from ray._private.state import state\n"
        f"print(json.dumps({{a['Name']: a['Address']['NodeID'] for a in state.actor_table(None).values()"
        f" if a['Name'].startswith({prefix!r})}}))\n"
    )
    env = {**os.environ, **cluster.driver_env()}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"could not read the actor table: {out.stderr[-2000:]}")
    import json

    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _node_ip() -> str:
    """The IP Ray puts every node of this host on (it resolves 127.0.0.1 to it): found as Ray finds it, the source
    address of a route outwards (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("8.8.8.8", 80))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def _wait_started(node: RayNodeProc, deadline: float) -> None:
    """`ray start --block` says "Ray runtime started" once its raylet registered; it exits if that failed."""
    assert node.proc is not None
    while time.monotonic() < deadline:
        text = node.log.read_text(errors="replace") if node.log.exists() else ""
        if "Ray runtime started" in text:
            return
        if node.proc.poll() is not None:
            raise RuntimeError(f"ray start for {node.name} exited {node.proc.returncode}: {text[-3000:]}")
        time.sleep(0.1)
    raise RuntimeError(
        f"ray start for {node.name} did not finish in time: {node.log.read_text(errors='replace')[-3000:]}"
    )


# -- pytest ---------------------------------------------------------------------------------------------------------

_SESSION: list[RayCluster] = []


def _unavailable() -> None:
    reason = ray_unavailable_reason() or "no Ray"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session", name="ray_cluster")
def ray_cluster_fixture() -> Iterator[RayCluster]:
    """This session's Ray cluster (head + 3 GPU nodes), started on first use and stopped at the end of the session.

    Skipped when Ray is not installed, failed instead when SUANLI_REQUIRE_RAY=1. The test process's environment
    gets `driver_env()`, so a `RayExecutor` built in it (or a subprocess it starts) connects."""
    if ray_unavailable_reason():
        _unavailable()
    with RayCluster.started() as cluster:
        saved = {k: os.environ.get(k) for k in cluster.driver_env()}
        os.environ.update(cluster.driver_env())
        from suanli.executors.ray_connect import refresh_auth

        refresh_auth()  # should `ray` be imported already
        _SESSION.append(cluster)
        try:
            yield cluster
        finally:
            _SESSION.remove(cluster)
            with contextlib.suppress(Exception):
                import ray

                ray.shutdown()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
