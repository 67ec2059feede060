"""Run a command inside a live sandbox: its cgroup, its uid, its namespaces, its root.

    python -P -m suanli.sandbox.join SANDBOX_FILE -- COMMAND...

SANDBOX_FILE is what the rank supervisor recorded: the host pid of the sandbox's init (bwrap's pid 1), the
cgroup, the uid/gid. The command gets the job's environment (read from the sandbox's init) with the caller's
TERM and locale, and /workspace as its cwd. As the sandbox's uid it owns the sandbox's user namespaces, so it may
join them without privilege; it execs as a non-zero uid inside with `no_new_privs`, so it holds no capability there.

Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys

from suanli.sandbox.record import running
from suanli.sandbox.syscalls import (
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    NS_GET_USERNS,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
)
from suanli.sandbox.syscalls import call as _libc_call

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
KEEP_FROM_CALLER = ("TERM", "LANG", "LC_ALL", "COLORTERM", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY")


def _fail(msg: str) -> int:
    sys.stderr.write(f"suanli: {msg}\n")
    return 255


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    env = {}
    for item in items:
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        return _fail("usage: python -m suanli.sandbox.join SANDBOX_FILE -- COMMAND...")
    found = running(argv[0])  # the init must still be bwrap's child: a recycled pid is somebody else's namespaces
    if found is None:
        return _fail("the sandbox is not running")
    box, init, _ = found
    # The job's environment: the init's is bwrap's, which bwrap hands to the job unchanged.
    children = _children(init)
    env = _environ(children[0]) if children else {}
    env = env or _environ(init)
    env.update({k: v for k, v in os.environ.items() if k in KEEP_FROM_CALLER})
    from suanli.sandbox import limits

    cg = box.get("cgroup") or {}
    try:
        limits.join(cg)
        if cg.get("mode") == "rlimit":
            limits.set_rlimits(int(box.get("memory_mib") or 0))
        if box.get("gid") is not None:
            os.setgroups([])
            os.setgid(int(box["gid"]))
        if box.get("uid") is not None:
            os.setuid(int(box["uid"]))
    except OSError as e:
        return _fail(f"cannot join the sandbox: {e}")
    try:
        _enter(init, box.get("network", "host") != "host")
    except OSError as e:
        return _fail(f"cannot enter the sandbox: {e}")
    return _run(argv[2:], env)


def _enter(init: int, net: bool) -> None:
    """Join the sandbox's namespaces. bwrap makes them under one user namespace and runs the job in a nested one,
    so: the owning user namespace first (found with NS_GET_USERNS), then IPC, UTS, network, PID, mount and cgroup,
    then the nested user namespace; then the sandbox's root (bwrap pivoted into it) and its workspace. Every file is opened
    before the first join: once in the sandbox's mount namespace, /proc is the sandbox's."""
    kinds = [("ipc", CLONE_NEWIPC), ("uts", CLONE_NEWUTS), ("pid", CLONE_NEWPID), ("mnt", CLONE_NEWNS)]
    if net:
        kinds.insert(2, ("net", CLONE_NEWNET))
    # Its cgroup namespace (after the cgroup itself was joined), so /proc/self/cgroup shows "/" as the job's does,
    # not the host's path to it; unless bwrap could not make one (then it is ours, and joining it would be refused).
    if os.stat(f"/proc/{init}/ns/cgroup").st_ino != os.stat("/proc/self/ns/cgroup").st_ino:
        kinds.append(("cgroup", CLONE_NEWCGROUP))
    fds = {name: os.open(f"/proc/{init}/ns/{name}", os.O_RDONLY) for name, _ in [*kinds, ("user", 0)]}
    root = os.open(f"/proc/{init}/root", os.O_RDONLY | os.O_DIRECTORY)
    try:
        owner = fcntl.ioctl(fds["mnt"], NS_GET_USERNS)
        try:
            _libc_call("setns", owner, CLONE_NEWUSER)
        finally:
            os.close(owner)
        for name, kind in kinds:
            _libc_call("setns", fds[name], kind)
        _libc_call("setns", fds["user"], CLONE_NEWUSER)
        os.fchdir(root)
        os.chroot(".")
    finally:
        for fd in [*fds.values(), root]:
            os.close(fd)
    try:
        os.chdir("/workspace")
    except OSError:
        os.chdir("/")
    _libc_call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _run(argv: list[str], env: dict[str, str]) -> int:
    """Fork (joining a PID namespace counts for children only) and exec; pass signals on; exit as the child did.
    The child gets SIGHUP when we end however we end (SIGKILL included, which passes nothing on): a session the
    gateway closes, or whose client went away, leaves no command running on in the sandbox. Signals wait (blocked)
    from before the fork until they can be passed on, and a child orphaned before it armed its parent-death signal
    ends at once."""
    parent = os.getpid()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # until the handlers below exist to pass them on
    pid = os.fork()
    if pid == 0:
        try:
            _libc_call("prctl", PR_SET_PDEATHSIG, signal.SIGHUP, 0, 0, 0)
            if os.getppid() not in (parent, 0):  # we were orphaned before that (0: a parent outside our PID namespace)
                os._exit(128 + signal.SIGHUP)
            for sig in FORWARDED:  # as sshd gives a session: a server started under nohup ignores SIGHUP, and an
                signal.signal(sig, signal.SIG_DFL)  # ignored signal stays ignored across exec
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            sys.stderr.write(f"suanli: {argv[0]}: {e.strerror}\n")
            os._exit(127)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _f: os.kill(pid, signum))
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
