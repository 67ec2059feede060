"""CPU, memory and process limits of one sandboxed rank: a cgroup when the host lets the server make one, else rlimits.

- cgroup v2: under the cgroup the operator delegated (`cgroup_parent`), or, for a root server on a cgroup2 host,
  under one `suanli` group at the hierarchy's root: `memory.max`, `cpu.max`, `pids.max`; an OOM kill shows in
  `memory.events`. Not under the server's own group: v2 lets a group hand cpu and memory to its children only while
  it holds no process itself, and the server's holds the server.
- cgroup v1 (hybrid hosts, root only): the memory, cpu and pids hierarchies, each under the server's own group.
- otherwise rlimits: RLIMIT_DATA for memory (what a process allocates; a process, not the rank, is bounded), no
  CPU cap (no rlimit says "N cores"); docs/isolation.md says so.

Standard library only: the rank supervisor imports this on every start.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time

CGROUP_ROOT = "/sys/fs/cgroup"
CPU_PERIOD_US = 100_000
DEFAULT_PIDS = 16_384
V1_CONTROLLERS = ("memory", "cpu", "pids")
V2_GROUP = "suanli"  # the root server's group of rank cgroups, at the cgroup2 hierarchy's root
# A rank's cgroup is empty only between its mkdir and the join that follows at once, and after its rank ended (when
# its supervisor removes it): one empty this long after it was made is a leftover (`sweep`).
LEFTOVER_S = 600.0
RANK_CGROUP = re.compile(r"[A-Za-z0-9_-]+-a[0-9]+-r[0-9]+-[0-9a-f]{8}")  # as `executors/sandboxing.py` names them


def _own_cgroup(controller: str) -> str | None:
    """The server's cgroup path in one cgroup v1 hierarchy."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controller in controllers.split(","):
                    return path
    except (OSError, ValueError):
        return None
    return None


def _is_cgroup2(path: str) -> bool:
    return os.path.exists(os.path.join(path, "cgroup.controllers"))


def plan(name: str, parent: str | None = None) -> dict[str, object]:
    """Where this rank's cgroup(s) go: {"mode": "v2"|"v1"|"rlimit", "paths": [...]} (nothing is created yet)."""
    if parent:
        if _is_cgroup2(parent) and os.access(parent, os.W_OK):
            return {"mode": "v2", "paths": [os.path.join(parent, name)]}
        return {"mode": "rlimit", "paths": [], "why": f"cgroup_parent {parent} is not a writable cgroup2 directory"}
    if os.geteuid() != 0:
        return {"mode": "rlimit", "paths": [], "why": "no cgroup delegated to the server (cgroup_parent)"}
    if _is_cgroup2(CGROUP_ROOT):
        return {"mode": "v2", "paths": [os.path.join(CGROUP_ROOT, V2_GROUP, name)]}
    paths = []
    for ctl in V1_CONTROLLERS:
        base = os.path.join(CGROUP_ROOT, ctl)
        own = _own_cgroup(ctl)
        if own is None or not os.path.isdir(base):
            return {"mode": "rlimit", "paths": [], "why": f"no cgroup v1 {ctl} hierarchy"}
        paths.append(os.path.join(base + own.rstrip("/"), "suanli", name))
    return {"mode": "v1", "paths": paths}


def view(cg: dict[str, object]) -> tuple[tuple[str, str], ...]:
    """What the sandbox's /sys/fs/cgroup shows: (host path, path inside) for the rank's own cgroup(s), at the root
    where container-aware code reads its limits (v2 `cpu.max`; v1 `cpu/cpu.cfs_quota_us`, `memory/...`, `pids/...`).
    The host's tree would name every rank on the host and show its usage."""
    paths = [str(p) for p in cg.get("paths", [])]  # type: ignore[union-attr]
    if cg.get("mode") == "v2":
        return ((paths[0], CGROUP_ROOT),)
    if cg.get("mode") == "v1":
        return tuple((p, os.path.join(CGROUP_ROOT, ctl)) for ctl, p in zip(V1_CONTROLLERS, paths, strict=True))
    return ()


def unbind(argv: list[str]) -> list[str]:
    """The bwrap argv without the binds of `view`: for a rank whose planned cgroup could not be made (a cgroup of that
    name already there is someone else's), so its sandbox's /sys/fs/cgroup stays empty."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--ro-bind-try" and i + 2 < len(argv) and (argv[i + 2] + "/").startswith(CGROUP_ROOT + "/"):
            i += 3
            continue
        out.append(argv[i])
        i += 1
    return out


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _enable_v2_controllers(leaf: str, needed: tuple[str, ...]) -> None:
    """Turn on cpu, memory and pids from the first missing level down to the leaf's parent; raise OSError naming
    the parent when one the limits need is still off there (a group that holds processes cannot hand them out)."""
    parent = os.path.dirname(leaf)
    chain = []
    p = parent
    while p.startswith(CGROUP_ROOT) and not os.path.isdir(p):
        chain.append(p)
        p = os.path.dirname(p)
    for d in reversed(chain):
        os.mkdir(d)
    d = p
    for level in [p, *reversed(chain)]:
        d = level
        with contextlib.suppress(OSError):
            _write(os.path.join(d, "cgroup.subtree_control"), "+cpu +memory +pids")
    try:
        with open(os.path.join(parent, "cgroup.subtree_control")) as f:
            enabled = {c.lstrip("+") for c in f.read().split()}
    except OSError as e:
        raise OSError(e.errno, f"cannot read {parent}/cgroup.subtree_control: {e.strerror}") from e
    if missing := [c for c in needed if c not in enabled]:
        raise OSError(errno.EACCES, f"cgroup v2 controllers {', '.join(missing)} not enabled in {parent} (a group "
                      "that holds processes cannot hand them to its children; delegate an empty one: cgroup_parent)")  # fmt: skip


def _make_leaf(path: str, made: list[str]) -> None:
    os.mkdir(path)  # FileExistsError when it is there already
    made.append(path)


def create(cg: dict[str, object], cpu_milli: int, memory_mib: int, pids: int = DEFAULT_PIDS) -> dict[str, object]:
    """Make the cgroup(s) with the limits set; on any failure fall back to rlimits (and say why). A leaf that is
    already there is never joined: it may be another rank's, whose processes would then count against, and be
    killed by, this one's limits."""
    mode = cg.get("mode")
    paths = [str(p) for p in cg.get("paths", [])]  # type: ignore[union-attr]
    made: list[str] = []
    try:
        if mode == "v2":
            leaf = paths[0]
            _enable_v2_controllers(leaf, tuple(c for c, on in (("cpu", cpu_milli), ("memory", memory_mib)) if on))
            _make_leaf(leaf, made)
            if memory_mib:
                _write(os.path.join(leaf, "memory.max"), str(memory_mib << 20))
                with contextlib.suppress(OSError):
                    _write(os.path.join(leaf, "memory.swap.max"), "0")
            if cpu_milli:
                _write(os.path.join(leaf, "cpu.max"), f"{cpu_milli * CPU_PERIOD_US // 1000} {CPU_PERIOD_US}")
            with contextlib.suppress(OSError):
                _write(os.path.join(leaf, "pids.max"), str(pids))
        elif mode == "v1":
            for p in paths:
                os.makedirs(os.path.dirname(p), exist_ok=True)
                _make_leaf(p, made)
            mem, cpu, pid = paths
            if memory_mib:
                _write(os.path.join(mem, "memory.limit_in_bytes"), str(memory_mib << 20))
                with contextlib.suppress(OSError):
                    _write(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(memory_mib << 20))
            if cpu_milli:
                _write(os.path.join(cpu, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
                _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(cpu_milli * CPU_PERIOD_US // 1000))
            _write(os.path.join(pid, "pids.max"), str(pids))
        return cg
    except OSError as e:
        remove({"paths": made}, wait_s=0)  # only what this call made: a leaf already there is someone else's
        return {"mode": "rlimit", "paths": [], "why": f"cgroup setup failed: {e}"}


def join(cg: dict[str, object]) -> None:
    """Move the calling process into the cgroup(s): called in the child between fork and exec."""
    for p in cg.get("paths", []):  # type: ignore[union-attr]
        _write(os.path.join(str(p), "cgroup.procs"), str(os.getpid()))


def set_rlimits(memory_mib: int) -> None:
    """The fallback: each process may allocate at most the memory limit. RLIMIT_DATA (heap and private writable
    maps, Linux >= 4.7), not RLIMIT_AS: address space reserved and never touched (CUDA reserves tens of GiB; a CUDA
    build of torch maps GiBs of libraries) is no memory, and at 2 GiB of AS `import torch` failed."""
    import resource

    if memory_mib:
        size = memory_mib << 20
        resource.setrlimit(resource.RLIMIT_DATA, (size, size))


def oom_killed(cg: dict[str, object]) -> bool:
    """Whether the kernel's OOM killer ended a process of this cgroup at its limit."""
    mode = cg.get("mode")
    paths = [str(p) for p in cg.get("paths", [])]  # type: ignore[union-attr]
    name = "memory.events" if mode == "v2" else "memory.oom_control" if mode == "v1" else None
    if name is None or not paths:
        return False
    try:
        with open(os.path.join(paths[0], name)) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
    except (OSError, ValueError):
        return False
    return False


def remove(cg: dict[str, object], wait_s: float = 2.0) -> None:
    """Delete the cgroup(s). A SIGKILLed process leaves its cgroup a moment after it is gone from /proc, and rmdir
    says EBUSY until then (seen on a loaded host): tried again every 10 ms for up to `wait_s`; what still will not go
    is left (harmless; `reap` tries again when its rank's executor finds the rank gone)."""
    deadline = time.monotonic() + wait_s
    for p in cg.get("paths", []):  # type: ignore[union-attr]
        while True:
            try:
                os.rmdir(str(p))
            except OSError as e:
                if e.errno == errno.EBUSY and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
            break


def reap(paths: list[str]) -> None:
    """A rank whose supervisor was SIGKILLed: kill what is left in its cgroup(s) and remove them (the supervisor would
    have). Only rank cgroups under the host's cgroup root are touched; ones already gone are skipped. v2's
    `cgroup.kill` kills every member at once; else each listed pid (a `0` is a member outside this pid namespace:
    kill(0) would be our own process group). Removal is tried briefly: the caller polls again, and `sweep` is there."""
    import signal

    root = os.path.realpath(CGROUP_ROOT) + os.sep
    mine = [p for p in paths if os.path.realpath(p).startswith(root) and RANK_CGROUP.fullmatch(os.path.basename(p))
            and os.path.isdir(p)]  # fmt: skip
    for p in mine:
        try:  # never created: a plain directory is no cgroup
            fd = os.open(os.path.join(p, "cgroup.kill"), os.O_WRONLY)
            try:
                os.write(fd, b"1")
            finally:
                os.close(fd)
            continue
        except OSError:
            pass
        with contextlib.suppress(OSError, ValueError), open(os.path.join(p, "cgroup.procs")) as f:
            for pid in (int(x) for x in f.read().split()):
                if pid > 0:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
    if mine:
        remove({"paths": mine}, wait_s=0.2)


def sweep(cg: dict[str, object], leftover_s: float = LEFTOVER_S) -> int:
    """Remove leftover rank cgroups beside this rank's: rank-named, empty, and made over `leftover_s` ago. A
    supervisor SIGKILLed with its node (Ray, Slurm) or by the OOM killer leaves its rank's cgroup where no executor
    polls; the next rank to start on that host clears them. Returns how many went; never raises."""
    removed = 0
    now = time.time()
    for parent in {os.path.dirname(str(p)) for p in cg.get("paths", [])}:  # type: ignore[union-attr]
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for e in entries:
            try:
                if not (RANK_CGROUP.fullmatch(e.name) and e.is_dir(follow_symlinks=False)):
                    continue
                if now - e.stat(follow_symlinks=False).st_mtime < leftover_s:
                    continue
                with open(os.path.join(e.path, "cgroup.procs")) as f:  # a plain directory has none: not a cgroup
                    if f.read().strip():
                        continue
                os.rmdir(e.path)
                removed += 1
            except OSError:
                continue
    return removed
