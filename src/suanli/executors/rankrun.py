"""Supervisor of one node-rank: runs the command, turns a stop into SIGTERM → grace → SIGKILL, records the exit code.

    python -P -m suanli.executors.rankrun RC_FILE STOP_FILE GRACE_S COMMAND [KEY=VALUE | KEY]...

The local executor starts this in a new session (so it outlives the server). The command runs under
`/bin/sh -c` in its own process group inside that session, so a forwarded SIGTERM reaches the job's
foreground processes but not the supervisor. `KEY=VALUE` items are set in the job's environment and bare
`KEY` items removed from it; the job never sees the server's own settings (`SUANLI_*`, PostgreSQL
credentials); the supervisor itself keeps the server's environment (a spec's PYTHONHOME must not break it). On Linux the supervisor is a child subreaper, so processes that leave the session
(torchrun starts its workers with setsid) stay its descendants and are killed with the rest.

The exit code goes to RC_FILE atomically, as `subprocess` reports it: negative for a signal. A STOP_FILE
that exists before the command starts means a stop raced the start: the command is not run.

Only the standard library is imported, and little of it: this runs once per rank start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

TICK_S = 0.1
_PR_SET_CHILD_SUBREAPER = 36


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, session id, start time in clock ticks) of a process; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        # The command name (field 2) may hold spaces and parentheses; fields after the last ')' are plain.
        rest = data[data.rindex(b")") + 2 :].split()
        return rest[0].decode(), int(rest[1]), int(rest[3]), int(rest[19])
    except (OSError, ValueError, IndexError):
        return None


def _all_stats() -> dict[int, tuple[str, int, int, int]]:
    stats: dict[int, tuple[str, int, int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return stats
    for name in names:
        if name.isdigit() and (st := proc_stat(int(name))) is not None:
            stats[int(name)] = st
    return stats


def session_members(sid: int) -> set[int]:
    """Processes whose session id is `sid`. Linux keeps a pid number allocated while it names a session."""
    return {pid for pid, st in _all_stats().items() if st[2] == sid and pid != sid}


def family(root: int) -> set[int]:
    """Processes of `root`'s session (as a session leader) and all its descendants, less `root` itself.

    Only for a live `root`: descendants of a recycled pid are strangers.
    """
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(st[1], []).append(pid)
    found = {pid for pid, st in stats.items() if st[2] == root}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    found.discard(root)
    return found


def kill_family(root: int, sig: int) -> int:
    """Send `sig` to `family(root)`; how many processes were signalled."""
    n = 0
    for pid in family(root):
        try:
            os.kill(pid, sig)
            n += 1
        except OSError:
            pass
    return n


def write_atomic(path: str, text: str) -> None:
    """Write a whole file or nothing: readers never see a partial exit code."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _say(msg: str) -> None:
    sys.stderr.write(f"[suanli] {msg}\n")
    sys.stderr.flush()


def _set_limits() -> None:
    """No core dumps of multi-GB training processes by default; the job may raise the soft limit again."""
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, OSError, ValueError):
        pass


def _become_subreaper() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _reap(child: int) -> int | None:
    """Reap every exited child (orphans are ours as a subreaper); the exit code of `child` once it exited."""
    code = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code
        if pid == 0:
            return code
        if pid == child:
            code = os.waitstatus_to_exitcode(status)


SERVER_ONLY = ("PGPASSWORD", "PGPASSFILE")  # and every SUANLI_* variable: the server's own settings


def _job_env(items: list[str]) -> dict[str, str]:
    """The server's environment without its own settings (an admin password, a database URL with credentials
    must never reach a tenant's job), then the items (the spec's env and the executor's variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUANLI_") and k not in SERVER_ONLY}
    for item in items:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
        else:
            env.pop(key, None)
    return env


def supervise(rc_file: str, stop_file: str, grace_s: float, command: str, env_items: list[str]) -> int:
    """Run the command to its end; the job's exit code (also written to `rc_file`)."""
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    _set_limits()
    _become_subreaper()
    if os.path.exists(stop_file) or received:
        _say("stop requested before the start; the command was not run")
        write_atomic(rc_file, f"{-signal.SIGTERM}\n")
        return -signal.SIGTERM
    try:
        child = os.posix_spawn(
            "/bin/sh",
            ["/bin/sh", "-c", command],
            _job_env(env_items),
            setpgroup=0,
            setsigmask=(),
            # Python ignores SIGPIPE and SIGXFSZ; shells and their pipelines expect the defaults.
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT, signal.SIGHUP),
        )
    except OSError as e:
        _say(f"cannot start /bin/sh: {e}")
        write_atomic(rc_file, "127\n")
        return 127
    code = None
    term_at: float | None = None
    killed = False
    try:
        while (code := _reap(child)) is None:
            if received and term_at is None:
                sig = received[0]
                _say(f"received {signal.Signals(sig).name}; passing it on, SIGKILL in {grace_s:g}s")
                with contextlib.suppress(OSError):
                    os.killpg(child, sig)
                term_at = time.monotonic()
            elif term_at is not None and not killed and time.monotonic() - term_at >= grace_s:
                _say("grace period over; sending SIGKILL")
                kill_family(os.getpid(), signal.SIGKILL)
                killed = True
            time.sleep(TICK_S)
    finally:
        # The job is over (or the supervisor is failing): whatever it left behind goes with it.
        if kill_family(os.getpid(), signal.SIGKILL):
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                _reap(child)
                if not family(os.getpid()):
                    break
                time.sleep(0.02)
    write_atomic(rc_file, f"{code}\n")
    return code


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        _say("usage: python -m suanli.executors.rankrun RC_FILE STOP_FILE GRACE_S COMMAND [KEY=VALUE | KEY]...")
        return 2
    rc_file, stop_file, grace, command, *env_items = argv
    supervise(rc_file, stop_file, float(grace), command, env_items)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
