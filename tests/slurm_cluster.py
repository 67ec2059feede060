"""A real Slurm cluster on this one host, for tests and benchmarks: munged, slurmctld and several slurmd daemons.

Debian's slurm-wlm 22.05 is built with --enable-multiple-slurmd (`scontrol show config` says MULTIPLE_SLURMD = Yes),
so every node is a real `slurmd -N nodeN` on this host: NodeHostname is this host, NodeAddr 127.0.0.1, a Port of
its own, a spool dir of its own (`SlurmdSpoolDir=.../%n`). Each node declares `gpus_per_node` fake GPUs as gres
with `File=` device paths that are symlinks to /dev/null: slurmd wants character devices there, and with `File=`
(not a bare Count) Slurm numbers the GPUs, so jobs see its choice in CUDA_VISIBLE_DEVICES and SLURM_STEP_GPUS /
SLURM_JOB_GPUS. CPUs and RealMemory are declared too (`SlurmdParameters=config_overrides`: not this host's).
topology.conf is the tree plugin's: one leaf switch per 2 nodes, one spine above them.

Everything lives in one temporary directory: munged with its own key and socket (so no system munge is needed or
touched), the controller's state, spool dirs, logs. Every daemon is started in the foreground (`-D`, `-F`) as a
child of this process and stopped by its PID; nothing runs after `stop()` (or at interpreter exit; a daemon also
gets SIGKILL when the process that started it dies). SUANLI_KEEP_SLURM=1 keeps the directory (its logs) afterwards.

    with slurm_cluster() as cluster:           # or the session fixture `slurm_session`
        cluster.run("sbatch", "--wrap", "true")
        os.environ["SLURM_CONF"] = str(cluster.conf)   # for any other Slurm client

Settings that matter: proctrack/linuxproc and task/none (no cgroups needed: it runs in a container), select/cons_tres
with CR_Core_Memory and DefMemPerCPU (a job without --mem does not take a whole node), no accounting database,
MinJobAge=3600 (finished jobs stay visible to `scontrol show job`), SlurmdTimeout=5 with MessageTimeout=3 (a killed
slurmd makes its jobs NODE_FAIL in about 12 s: a ping of a dead node fails only after the message timeout),
KillWait=2, ReturnToService=2 (a restarted slurmd takes its node back), bf_interval=1 (heterogeneous jobs are
started by the backfill scheduler only). SlurmUser and SlurmdUser are whoever runs the tests: as root, jobs may run
as any user; unprivileged, slurmd runs jobs as that same user only, which is all the tests need.

With `rest=True` it starts slurmrestd too, on a unix socket in the directory (`cluster.rest` is its address for
`SlurmExecutor(rest=…)`): `-a rest_auth/local -s openapi/v0.0.38`, so it acts as whoever runs the tests. slurmrestd
refuses to run as root or as SlurmUser (both are the test user here, as above) unless
SLURMRESTD_SECURITY=disable_user_check says that is meant, and unshares its file table and SysV IPC, which a
container's seccomp profile may forbid; the fixture turns both off, for that daemon alone. Where Slurm's
JWT plugin is installed (Debian: slurm-wlm-jwt-plugin), slurm.conf also has `AuthAltTypes=auth/jwt` with a key of its
own, and a second slurmrestd listens on 127.0.0.1 with `-a rest_auth/jwt` (`cluster.rest_jwt`; SLURM_JWT=daemon in
its environment is what makes slurmrestd hand callers' tokens to slurmctld); `cluster.token()` is `scontrol token`.

Missing Slurm (or slurmrestd, for the tests that use it) skips the tests that need it, or fails them when
SUANLI_REQUIRE_SLURM=1 (as on CI).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REQUIRE_ENV = "SUANLI_REQUIRE_SLURM"
PROGRAMS = ("munged", "slurmctld", "slurmd", "slurmstepd", "sbatch", "srun", "squeue", "scontrol", "scancel")
REST_PROGRAM = "slurmrestd"
JWT_DAEMON = "slurmrestd-jwt"  # the name of the second slurmrestd, for its log and PID
REST_VERSION = "v0.0.38"
REST_PLUGIN = f"openapi/{REST_VERSION}"
# It runs as root or SlurmUser here (see above); a container's seccomp profile may refuse its unshare() calls.
REST_SECURITY = "disable_user_check,disable_unshare_files,disable_unshare_sysv"
JWT_PLUGINS = ("/usr/lib/*/slurm-wlm/auth_jwt.so", "/usr/lib*/slurm/auth_jwt.so", "/usr/local/lib*/slurm/auth_jwt.so")
START_TIMEOUT_S = 45.0
_PR_SET_PDEATHSIG = 1


def slurm_unavailable_reason() -> str | None:
    """Why this host cannot run the fixture's cluster; None when it can."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None and not os.path.exists(f"/usr/sbin/{p}")]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
    return None


def slurmrestd_unavailable_reason() -> str | None:
    """Why this host cannot run the fixture's slurmrestd; None when it can."""
    if shutil.which(REST_PROGRAM) is None and not os.path.exists(f"/usr/sbin/{REST_PROGRAM}"):
        return f"{REST_PROGRAM} not installed (apt-get install slurmrestd)"
    return None


def jwt_unavailable_reason() -> str | None:
    """Why slurmctld here cannot take JWTs (no auth/jwt plugin); None when it can."""
    if not any(glob.glob(pattern) for pattern in JWT_PLUGINS):
        return "Slurm's auth/jwt plugin is not installed (apt-get install slurm-wlm-jwt-plugin)"
    return None


def require_slurm(rest: bool = False, jwt: bool = False) -> None:
    """Skip the calling test when Slurm (with `rest`, slurmrestd too; with `jwt`, its JWT plugin) is missing; fail
    it instead when SUANLI_REQUIRE_SLURM=1."""
    why = slurm_unavailable_reason() or (slurmrestd_unavailable_reason() if rest or jwt else None)
    why = why or (jwt_unavailable_reason() if jwt else None)
    if why is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {why}", pytrace=False)
    pytest.skip(f"{why}; {REQUIRE_ENV}=1 fails instead")


def _program(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            ppid = int(data[data.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(name))
    return out


def _with_descendants(roots: list[int]) -> set[int]:
    children, found, stack = _children(), set(), list(roots)
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


def _kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _die_with_parent() -> None:
    """A daemon gets SIGKILL when the test process dies without stopping it (killed, or SIGTERM with no handler)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass
class SlurmCluster:
    """A running one-host cluster: `conf` is the slurm.conf to point SLURM_CONF at, `nodes` the NodeNames."""

    root: Path
    conf: Path
    nodes: tuple[str, ...]
    gpus_per_node: int
    rest: str | None = None  # slurmrestd's address (`unix:/…/run/slurmrestd.sock`) when it was started
    rest_jwt: str | None = None  # the JWT one's (`http://127.0.0.1:PORT`) when it was started
    _daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with SLURM_CONF set: for Slurm clients and subprocesses."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client (`sbatch`, `scontrol`, …) against this cluster, in its directory (where a job's
        default slurm-%j.out goes)."""
        return subprocess.run([_program(argv[0]), *argv[1:]], cwd=self.root, env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=check)  # fmt: skip

    def node_states(self) -> dict[str, str]:
        """NodeName → State as `scontrol show node` says it (IDLE, MIXED, DOWN+NOT_RESPONDING, …)."""
        out = self.run("scontrol", "-o", "show", "node", check=False).stdout
        return dict(re.findall(r"NodeName=(\S+) .*? State=(\S+)", out))

    def wait_idle(self, nodes: tuple[str, ...] | None = None, timeout: float = START_TIMEOUT_S) -> None:
        """Until every node (or those named) is IDLE and responding."""
        want = nodes or self.nodes
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if all(states.get(n) == "IDLE" for n in want):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm nodes not idle after {timeout:g}s: {states}; logs in {self.root / 'log'}")
            time.sleep(0.2)

    def _spool(self, node: str) -> Path:
        return self.root / "spool" / node

    def _start_slurmd(self, node: str) -> None:
        # The cwd is the node's spool dir: slurmstepd inherits it, which tells `kill_node` whose steps are whose.
        self._daemons[node] = self._spawn(node, [_program("slurmd"), "-D", "-N", node, "-f", str(self.conf)],
                                          self._spool(node))  # fmt: skip

    def _spawn(
        self, name: str, argv: list[str], cwd: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(self.root / "log" / f"{name}.out", "ab") as out:
            return subprocess.Popen(argv, cwd=cwd, env=env or self.env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_die_with_parent)  # fmt: skip

    def kill_node(self, node: str, steps: bool = True) -> None:
        """A node failure: SIGKILL the node's slurmd, its slurmstepds and every process of their jobs (with
        `steps=False`, the slurmd alone, as when only the daemon crashes: its jobs run on)."""
        stepds = []
        spool = str(self._spool(node).resolve())
        for name in os.listdir("/proc") if steps else ():
            with contextlib.suppress(OSError):
                stepd = name.isdigit() and Path(f"/proc/{name}/comm").read_text().strip() == "slurmstepd"
                if stepd and os.readlink(f"/proc/{name}/cwd") == spool:
                    stepds.append(int(name))
        proc = self._daemons.get(node)
        roots = [*stepds, *([proc.pid] if proc is not None and proc.poll() is None else [])]
        _kill_all(_with_descendants(roots))
        if proc is not None:
            proc.wait(10)

    def start_rest(self) -> None:
        """Start slurmrestd on a unix socket in this cluster's directory and wait until it answers a ping."""
        sock = self.root / "run" / "slurmrestd.sock"
        env = {**self.env, "SLURMRESTD_SECURITY": REST_SECURITY}
        argv = [_program(REST_PROGRAM), "-f", str(self.conf), "-a", "rest_auth/local", "-s", REST_PLUGIN,
                f"unix:{sock}"]  # fmt: skip
        self._daemons[REST_PROGRAM] = self._spawn(REST_PROGRAM, argv, self.root, env)
        self.rest = f"unix:{sock}"
        _wait(lambda: _rest_answers(f"http://slurmrestd/slurm/{REST_VERSION}/ping", uds=str(sock)), self,
              REST_PROGRAM)  # fmt: skip
        if (self.root / "jwt.key").exists():
            (port,) = _free_ports(1)
            argv = [_program(REST_PROGRAM), "-f", str(self.conf), "-a", "rest_auth/jwt", "-s", REST_PLUGIN,
                    f"127.0.0.1:{port}"]  # fmt: skip
            self._daemons[JWT_DAEMON] = self._spawn(JWT_DAEMON, argv, self.root, {**env, "SLURM_JWT": "daemon"})
            self.rest_jwt = f"http://127.0.0.1:{port}"
            headers = {"X-SLURM-USER-NAME": pwd.getpwuid(os.geteuid()).pw_name, "X-SLURM-USER-TOKEN": self.token()}
            _wait(lambda: _rest_answers(f"{self.rest_jwt}/slurm/{REST_VERSION}/ping", headers=headers), self,
                  JWT_DAEMON)  # fmt: skip

    def token(self, lifespan_s: int = 3600) -> str:
        """A JWT for whoever runs the tests, from `scontrol token` (the cluster takes JWTs when `rest_jwt` is set)."""
        out = self.run("scontrol", "token", f"lifespan={lifespan_s}").stdout.strip()
        return out.removeprefix("SLURM_JWT=")

    def restart_node(self, node: str, wait: bool = True) -> None:
        """Start the node's slurmd again; with `wait`, until the controller has it back as IDLE."""
        proc = self._daemons.get(node)
        if proc is not None and proc.poll() is None:
            return
        self._start_slurmd(node)
        if wait:
            self.wait_idle((node,))

    def stop(self) -> None:
        """Stop every daemon by PID (and any job step left behind); leave nothing running."""
        for node in self.nodes:
            if node in self._daemons:
                self.kill_node(node)
                del self._daemons[node]
        for name in (JWT_DAEMON, REST_PROGRAM, "slurmctld", "munged"):
            proc = self._daemons.pop(name, None)
            if proc is not None:
                if name == "slurmctld":  # its slurmscriptd child goes with it
                    family = _with_descendants([proc.pid])
                    _stop(proc)
                    _kill_all(family - {proc.pid})
                else:
                    _stop(proc)


def _write_config(
    root: Path, nodes: tuple[str, ...], gpus: int, cpus: int, memory_mib: int, settings: dict[str, str]
) -> Path:
    host = socket.gethostname().split(".")[0]
    user = pwd.getpwuid(os.geteuid()).pw_name
    ctld_port, *node_ports = _free_ports(1 + len(nodes))
    lines = [
        "ClusterName=suanli-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/run/munge.socket",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "MailProg=/bin/true",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobContainerType=job_container/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SlurmdParameters=config_overrides",
        "DefMemPerCPU=256",
        "GresTypes=gpu",
        "TopologyPlugin=topology/tree",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "MinJobAge=3600",
        "SlurmdTimeout=5",
        "MessageTimeout=3",
        "SlurmctldTimeout=5",
        "KillWait=2",
        "InactiveLimit=0",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1",
    ]
    lines = [line for line in lines if line.split("=", 1)[0] not in settings]
    lines += [f"{k}={v}" for k, v in settings.items()]
    for node, port in zip(nodes, node_ports, strict=True):
        lines.append(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} "
                     f"RealMemory={memory_mib} Gres=gpu:h100:{gpus} State=UNKNOWN")  # fmt: skip
    half = nodes[: len(nodes) // 2]
    lines.append(f"PartitionName=gpu Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    lines.append(f"PartitionName=half Nodes={','.join(half)} MaxTime=INFINITE State=UP")
    (root / "slurm.conf").write_text("\n".join(lines) + "\n")
    gres = []
    for node in nodes:
        dev = root / "dev" / node
        dev.mkdir(parents=True)
        for i in range(gpus):
            (dev / f"nvidia{i}").symlink_to("/dev/null")
        gres.append(f"NodeName={node} Name=gpu Type=h100 File={dev}/nvidia[0-{gpus - 1}]")
    (root / "gres.conf").write_text("\n".join(gres) + "\n")
    leaves = [nodes[i : i + 2] for i in range(0, len(nodes), 2)]
    topo = [f"SwitchName=leaf{i + 1} Nodes={','.join(group)}" for i, group in enumerate(leaves)]
    topo.append(f"SwitchName=spine Switches={','.join(f'leaf{i + 1}' for i in range(len(leaves)))}")
    (root / "topology.conf").write_text("\n".join(topo) + "\n")
    return root / "slurm.conf"


@contextlib.contextmanager
def slurm_cluster(
    n_nodes: int = 4,
    gpus_per_node: int = 8,
    cpus: int = 8,
    memory_mib: int = 16384,
    settings: dict[str, str] | None = None,
    rest: bool = False,
) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and `n_nodes` slurmd (node1…), wait until every node is idle, yield, stop all.

    `settings` add to or replace slurm.conf lines (`{"SlurmdTimeout": "30"}`); `rest` starts slurmrestd as well."""
    root = Path(tempfile.mkdtemp(prefix="suanli-slurm-"))
    root.chmod(0o755)  # munged wants its socket's directories searchable by all
    for sub in ("run", "state", "log", "munge"):
        (root / sub).mkdir(mode=0o755 if sub != "munge" else 0o700)
    nodes = tuple(f"node{i + 1}" for i in range(n_nodes))
    for node in nodes:
        (root / "spool" / node).mkdir(parents=True)
    settings = dict(settings or {})
    if rest and jwt_unavailable_reason() is None:
        key = root / "jwt.key"
        key.write_bytes(os.urandom(32))
        key.chmod(0o600)
        settings.setdefault("AuthAltTypes", "auth/jwt")
        settings.setdefault("AuthAltParameters", f"jwt_key={key}")
    conf = _write_config(root, nodes, gpus_per_node, cpus, memory_mib, settings)
    cluster = SlurmCluster(root, conf, nodes, gpus_per_node)
    atexit.register(cluster.stop)
    try:
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = root / "run" / "munge.socket"
        cluster._daemons["munged"] = cluster._spawn("munged", [
            _program("munged"), "-F", f"--socket={sock}", f"--key-file={key}", f"--log-file={root}/log/munged.log",
            f"--pid-file={root}/run/munged.pid", f"--seed-file={root}/munge/munged.seed"], root)  # fmt: skip
        _wait(lambda: sock.exists(), cluster, "munged")
        cluster._daemons["slurmctld"] = cluster._spawn("slurmctld", [_program("slurmctld"), "-D", "-f", str(conf)],
                                                       root)  # fmt: skip
        _wait(lambda: cluster.run("scontrol", "ping", check=False).stdout.count("UP") > 0, cluster, "slurmctld")
        for node in nodes:
            cluster._start_slurmd(node)
        if rest:
            cluster.start_rest()
        cluster.wait_idle()
        yield cluster
    finally:
        cluster.stop()
        atexit.unregister(cluster.stop)
        if os.environ.get("SUANLI_KEEP_SLURM") != "1":
            shutil.rmtree(root, ignore_errors=True)


def _rest_answers(url: str, uds: str | None = None, headers: dict[str, str] | None = None) -> bool:
    """Whether slurmrestd answers a ping at `url` (over the unix socket `uds`) with slurmctld UP."""
    import httpx

    if uds is not None and not os.path.exists(uds):
        return False
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=uds), timeout=2.0, trust_env=False) as http:
            r = http.get(url, headers=headers)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and any(p.get("ping") == "UP" for p in r.json().get("pings", []))


def _wait(ready: Callable[[], bool], cluster: SlurmCluster, name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        proc = cluster._daemons[name]
        if proc.poll() is not None or time.monotonic() > deadline:
            log = (cluster.root / "log" / f"{name}.out").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} did not start (exit {proc.poll()}):\n{log}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def slurm_session() -> Iterator[SlurmCluster]:
    """The session's one-host Slurm cluster (4 nodes x 8 fake GPUs), with slurmrestd where it is installed (tests of
    the REST transport call `require_slurm(rest=True)`); skipped, or failed under SUANLI_REQUIRE_SLURM=1, when Slurm
    is not installed."""
    require_slurm()
    with slurm_cluster(rest=slurmrestd_unavailable_reason() is None) as cluster:
        yield cluster
