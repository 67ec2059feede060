"""A sandbox's own network namespace with a way out: `network: private`.

bwrap (`--unshare-net`) gives the sandbox a namespace with loopback only; pasta (Debian's `passt` package, the
user-mode network stack Podman uses) then connects it to the outside, without privilege, as the sandbox's uid.
What the job gets, and why:

- its own loopback: a torch TCPStore or NCCL bootstrap on 127.0.0.1 is seen by no other tenant, and the host's
  own loopback services (a PostgreSQL that trusts local connections, the server's metrics) are out of reach;
- outbound TCP and UDP (and DNS, through the host's resolver settings) as connections pasta makes on the host;
- no port forwarded in (`-t none -u none`), and `--no-map-gw` keeps the gateway address from meaning the host.

What it does not fence (docs/isolation.md): pasta connects to whatever address the job names, so a host service
listening on a wildcard address is reached through the host's other addresses (IPv6 link-local, secondary ones),
as from the host network; and a UDP flow keeps its source port, which pasta binds on the host for the replies.

bwrap runs the job in a user namespace nested in the one that owns the network namespace, so pasta is pointed at
the owner (NS_GET_USERNS), which a root supervisor binds onto a file in its private staging mount (pasta, as the
sandbox's uid, could not open the supervisor's /proc/PID/fd). pasta runs in the foreground as the supervisor's
child, as the sandbox's uid from exec on (a uid change would clear its parent-death signal), in the rank's cgroup:
it dies with its supervisor, even a supervisor killed with SIGKILL, and with the job's other processes at its end.

Standard library only: the rank supervisor imports it once per start.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable

from suanli.sandbox.syscalls import MNT_DETACH, MS_BIND, NS_GET_USERNS, PR_SET_PDEATHSIG, call

SETUP_TIMEOUT_S = 20.0
PASTA_ARGS = ("--config-net", "-t", "none", "-u", "none", "-T", "none", "-U", "none", "--no-map-gw", "--quiet")
TUN_HINT = "the sandbox's uid must be able to open /dev/net/tun: mode 0666, as Debian's udev makes it"
NO_PASTA = "network: private needs pasta on this node (Debian's passt package); it is not installed"


def pasta_path() -> str | None:
    return shutil.which("pasta")


def _owner_path(child: int, stage: str, fds: list[int]) -> str:
    """A path to the user namespace owning `child`'s network namespace that pasta, as the sandbox's uid, may open."""
    net = os.open(f"/proc/{child}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    fds.append(net)
    owner = fcntl.ioctl(net, NS_GET_USERNS)
    fds.append(owner)
    if os.geteuid() != 0:  # pasta runs as us: our own /proc entries are open to it
        return f"/proc/{os.getpid()}/fd/{owner}"
    path = os.path.join(stage, f"userns-{child}")
    open(path, "w").close()
    call("mount", f"/proc/self/fd/{owner}".encode(), path.encode(), None, MS_BIND, None)
    return path


ROUTE_TABLES = (("route", 0, 1), ("ipv6_route", -1, 0))  # /proc/PID/net file, interface column, header rows


def _routed(pid: object) -> set[str]:
    """The address families (route tables) with a route through an interface other than loopback in `pid`'s
    network namespace ("self": ours, the host's)."""
    out = set()
    for table, column, header in ROUTE_TABLES:
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii", errors="replace") as f:
                rows = [row.split() for row in f.read().splitlines()[header:]]
        except OSError:
            continue
        if any(row and row[column] != "lo" for row in rows):
            out.add(table)
    return out


def _prepare(uid: int | None, gid: int | None, join_cgroup: object) -> Callable[[], None]:
    def prepare() -> None:  # in pasta's process, before exec: the rank's cgroup, the sandbox's uid, then death
        if callable(join_cgroup):  # with the supervisor (set after the uid: a uid change clears it)
            join_cgroup()
        if gid is not None:
            os.setgroups([])
            os.setgid(gid)
        if uid is not None:
            os.setuid(uid)
        call("prctl", PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    return prepare


def attach(child: int, uid: int | None, gid: int | None, stage: str, join_cgroup: object = None) -> int:
    """Connect the network namespace of bwrap's child `child` to the outside with pasta; pasta's pid.

    pasta runs in the foreground as the supervisor's child, as the sandbox's uid from its start (so its
    parent-death signal holds: it dies with the supervisor, even one killed with SIGKILL), in the rank's cgroup
    (`join_cgroup` runs before exec). Returns once pasta has configured the namespace; raises OSError with pasta's
    own words when it cannot (pasta then gone). `stage` is a directory of a root supervisor's private mount
    namespace."""
    pasta = pasta_path()
    if pasta is None:
        raise OSError(NO_PASTA)
    fds: list[int] = []
    mounted = ""
    proc = None
    try:
        userns = _owner_path(child, stage, fds)
        mounted = userns if userns.startswith(stage) else ""
        # What pasta says goes to a file of the root supervisor's staging tmpfs (64 KiB in all: a chatty pasta
        # cannot grow it), or to memory for a supervisor that is not root.
        if mounted:
            log = os.open(os.path.join(stage, f"pasta-{child}.log"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        else:
            log = os.memfd_create("suanli-pasta", 0)
        fds.append(log)
        argv = [pasta, "--foreground", *PASTA_ARGS, "--netns", f"/proc/{child}/ns/net", "--userns", userns]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                    preexec_fn=_prepare(uid, gid, join_cgroup), env={"PATH": "/usr/bin:/bin"})  # fmt: skip
        except subprocess.SubprocessError as e:
            raise OSError(f"network: private: pasta could not start: {e}") from e
        # Configured: routes of every family the host routes (pasta sets addresses first, then routes).
        deadline, want = time.monotonic() + SETUP_TIMEOUT_S, _routed("self")
        while not want <= _routed(child):
            if proc.poll() is not None:
                os.lseek(log, 0, os.SEEK_SET)
                text = os.read(log, 64 << 10).decode(errors="replace")
                words = " ".join(x for x in text.splitlines() if "syslog" not in x)
                if "tun" in words:
                    words += f" ({TUN_HINT})"
                raise OSError(f"network: private: pasta failed: {words[:400] or proc.returncode}")
            if time.monotonic() > deadline:
                raise OSError(f"network: private: pasta did not set up the network in {SETUP_TIMEOUT_S:g} s")
            time.sleep(0.002)
        pid = proc.pid
        proc.returncode = 0  # the supervisor reaps it (`waitpid(-1)`), not Popen
        proc = None
        return pid
    finally:
        if proc is not None:  # started, then failed: it goes now
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                proc.wait(5)
        if mounted:
            with contextlib.suppress(OSError):
                call("umount2", mounted.encode(), MNT_DETACH)
            for path in (mounted, os.path.join(stage, f"pasta-{child}.log")):
                with contextlib.suppress(OSError):
                    os.unlink(path)
        for fd in fds:
            os.close(fd)


def connect_held(
    child: int, bwrap: int, release: int, uid: object, gid: object, stage: str, join_cgroup: object = None
) -> int:
    """Give a sandbox held on bwrap's `--block-fd` its way out, then let the job run (a byte on `release`); pasta's
    pid. On failure the sandbox goes and the caller hears why: the job never ran."""
    try:
        if not child:
            raise OSError("network: private: bwrap did not report its sandbox")
        uid_n = int(uid) if uid is not None else None  # type: ignore[call-overload]
        gid_n = int(gid) if gid is not None else None  # type: ignore[call-overload]
        pid = attach(child, uid_n, gid_n, stage, join_cgroup)
        os.write(release, b"x")
        return pid
    except (OSError, ValueError):
        # The held sandbox goes before `release` closes (an EOF there would let the job run): its init first (its
        # parent-death signal is not to be trusted while it waits), then bwrap's outer process.
        for pid in (child, bwrap):
            if pid:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.waitpid(bwrap, 0)
        raise
    finally:
        os.close(release)
