"""Supervisor of one node-rank: runs the command, turns a stop into SIGTERM → grace → SIGKILL, records the exit code.

    python -P -m suanli.executors.rankrun LAUNCH_FILE

LAUNCH_FILE is JSON of mode 0600 written by the executor and deleted here at once: the rc, stop, sandbox and reason
file paths, the grace period, the command, its env (so no env value ever shows in a process's argv) and the
sandbox (bwrap's command line, limits, uid). The local executor starts this in a new session (so it outlives the
server). Unsandboxed, the command runs under `/bin/sh -c` in its own process group, so a forwarded SIGTERM reaches
the job's foreground processes but not the supervisor. Sandboxed, it runs under bwrap (`suanli.sandbox`): its cgroup
joined and the sandbox's uid taken between fork and exec, a forwarded signal goes to every job process but bwrap's
own. The job never sees the server's own settings (`SUANLI_*`, PostgreSQL credentials), and a sandboxed job nothing
of the server's environment but the locale; the supervisor itself keeps the server's environment (a spec's
PYTHONHOME must not break it). On Linux the supervisor is a child subreaper, so processes that leave the session
(torchrun starts its workers with setsid) stay its descendants and are killed with the rest.

The exit code goes to the rc file atomically, as `subprocess` reports it: negative for a signal. A stop file
that exists before the command starts means a stop raced the start: the command is not run. An OOM kill at the
cgroup's limit is written, in words, to the reason file.

Only the standard library is imported, and little of it (`proctree` is standard library only too): this runs once
per rank start.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

from suanli.executors.proctree import family, family_top_down, kill_family, write_atomic

TICK_S = 0.1


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
    from suanli.sandbox.syscalls import PR_SET_CHILD_SUBREAPER, call

    with contextlib.suppress(OSError, AttributeError):
        call("prctl", PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


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


SANDBOX_BASE_ENV = ("LANG", "LC_ALL", "TZ")  # all a sandboxed job inherits from the server's environment


def _job_env(items: dict[str, str | None], sandboxed: bool) -> dict[str, str]:
    """The job's environment: the server's without its own settings (an admin password, a database URL with
    credentials must never reach a tenant's job) — or, in a sandbox, nothing of the server's but the locale —
    then the items (the spec's env and the executor's variables; None removes a variable)."""
    if sandboxed:
        env = {k: v for k, v in os.environ.items() if k in SANDBOX_BASE_ENV}
        env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    else:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SUANLI_") and k not in SERVER_ONLY}
    for key, value in items.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


ENV_FILE = "/run/suanli-env"


PRIVATE_BINDS = ("--bind", "--ro-bind")  # the workdir, environments, mounts: the -try forms are system paths
STAGE = "/run/suanli-binds"


def _stage_binds(argv: list[str]) -> list[str]:
    """A root server runs bwrap as the sandbox's uid, which may not traverse the server's data directory (and must
    not: it is not for tenants). So the supervisor, still root, takes a private mount namespace of its own, mounts
    a tmpfs at STAGE and binds each private source there; bwrap (its child) binds from those paths. Nothing shows
    on the host; the mounts go when the supervisor and its job are gone."""
    if os.geteuid() != 0 or not any(op in PRIVATE_BINDS for op in argv):
        return argv
    from suanli.sandbox.syscalls import CLONE_NEWNS, MS_BIND, MS_PRIVATE, MS_REC, call

    os.makedirs(STAGE, mode=0o755, exist_ok=True)
    call("unshare", CLONE_NEWNS)
    call("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)
    call("mount", b"tmpfs", STAGE.encode(), b"tmpfs", 0, b"mode=0755,size=64k")
    out = list(argv)
    for i, op in enumerate(argv[:-2]):
        if op in PRIVATE_BINDS and not argv[i + 1].startswith(STAGE):
            src = argv[i + 1]
            staged = os.path.join(STAGE, str(i))
            if os.path.isdir(src):
                os.mkdir(staged)
            else:
                open(staged, "w").close()
            call("mount", src.encode(), staged.encode(), None, MS_BIND | MS_REC, None)
            out[i + 1] = staged
    return out


SANDBOX_USER = "tenant"


def _user_files(sandbox: dict, uid: object, gid: object) -> dict[str, int]:
    """/etc/passwd and /etc/group naming the sandbox's uid and gid (`tenant`, home /workspace): sftp-server,
    `whoami`, ssh and editors' remote servers ask for the user's name. Built from the sandbox's own /etc (the
    host's, or a root filesystem's) and bound over it read-only."""
    uid = int(uid) if uid is not None else os.getuid()  # type: ignore[call-overload]
    gid = int(gid) if gid is not None else os.getgid()  # type: ignore[call-overload]
    etc = sandbox.get("etc") or "/etc"
    fds: dict[str, int] = {}
    for name, line, index in (
        ("passwd", f"{SANDBOX_USER}:x:{uid}:{gid}:suanli tenant:/workspace:/bin/sh\n", uid),
        ("group", f"{SANDBOX_USER}:x:{gid}:\n", gid),
    ):
        try:
            with open(os.path.join(etc, name), encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
        except OSError:
            continue  # nothing to bind over (a root filesystem without one)
        if any(_field(x, 2) == str(index) for x in lines):
            continue  # already named there (a non-root server's own user)
        text = "".join(x if x.endswith("\n") else x + "\n" for x in lines) + line
        fd = os.memfd_create(f"suanli-{name}", 0)
        os.write(fd, text.encode())
        os.lseek(fd, 0, os.SEEK_SET)
        fds[name] = fd
    return fds


def _field(line: str, i: int) -> str:
    parts = line.split(":")
    return parts[i] if len(parts) > i else ""


def _user_args(fds: dict[str, int]) -> list[str]:
    return [x for name, fd in fds.items() for x in ("--perms", "0644", "--ro-bind-data", str(fd), f"/etc/{name}")]


def _env_script(env: dict[str, str]) -> str:
    """`export KEY='value'` lines for /bin/sh; names that are not shell names are left out."""
    import re
    import shlex

    key = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items() if key.fullmatch(k))


def _sandboxed_pids(info: dict[str, object]) -> set[int]:
    """bwrap's own processes (the outer one and the sandbox's init) and pasta's: signals go past them to the job."""
    helpers = [info["pasta_pid"]] if info.get("pasta_pid") else []  # network: private's way out
    return {int(p) for p in [*info.get("bwrap_pids", []), *helpers]}  # type: ignore[union-attr,misc]


def _spawn(command: str, env: dict[str, str], sandbox: dict | None) -> tuple[int, dict]:
    """Start the job: plain `/bin/sh -c`, or inside bwrap with its cgroup joined, rlimits set and the sandbox's uid
    taken between fork and exec. Returns the pid and what the sandbox reported (its init's host pid)."""
    sigdef = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    if sandbox is None:
        # Python ignores SIGPIPE and SIGXFSZ; shells and their pipelines expect the defaults.
        pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", command], env, setpgroup=0, setsigmask=(), setsigdef=sigdef)
        return pid, {}
    from suanli.sandbox import limits

    cg = sandbox["cgroup"]
    uid, gid = sandbox.get("uid"), sandbox.get("gid")
    memory_mib = int(sandbox.get("memory_mib") or 0)
    r, w = os.pipe()

    def in_child() -> None:
        for sig in sigdef:
            signal.signal(sig, signal.SIG_DFL)
        limits.join(cg)
        if cg.get("mode") == "rlimit":
            limits.set_rlimits(memory_mib)
        if gid is not None:
            os.setgroups([])
            os.setgid(int(gid))
        if uid is not None:
            os.setuid(int(uid))

    import subprocess

    # bwrap itself runs on the host's filesystem: it gets a clean environment (a tenant's LD_PRELOAD must never
    # reach it), and the job's variables travel in a file bwrap writes inside the sandbox, which the shell sources.
    env_fd = os.memfd_create("suanli-env", 0)
    os.write(env_fd, _env_script(env).encode())
    os.lseek(env_fd, 0, os.SEEK_SET)
    user_fds = _user_files(sandbox, uid, gid)
    # network: private: the job waits on `block` until pasta has connected its namespace (`suanli.sandbox.netns`)
    block = os.pipe() if sandbox.get("network") == "private" else None
    held = ["--block-fd", str(block[0])] if block else []
    argv = [*_stage_binds(sandbox["bwrap"]), *_user_args(user_fds), "--perms", "0400", "--file", str(env_fd), ENV_FILE, "--info-fd", str(w), *held, "--",
            "/bin/sh", "-c", f'. {ENV_FILE} && exec /bin/sh -c "$0"', command]  # fmt: skip
    clean = {k: env[k] for k in (*SANDBOX_BASE_ENV, "PATH") if k in env}
    fds = (w, env_fd, *user_fds.values(), *(block[:1] if block else ()))
    try:
        proc = subprocess.Popen(argv, env=clean, process_group=0, pass_fds=fds, preexec_fn=in_child)
    except subprocess.SubprocessError as e:  # `in_child` failed (joining the cgroup, the uid): as the caller expects
        if block:
            os.close(block[1])
        raise OSError(f"the sandbox's setup failed: {e}") from e
    finally:
        for fd in fds:
            os.close(fd)
    info: dict = {"bwrap_pids": [proc.pid]}
    data = b""
    import select

    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        ready, _, _ = select.select([r], [], [], 0.5)
        if ready:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            data += chunk
            if b"}" in data:
                break
        elif proc.poll() is not None:
            break
    os.close(r)
    try:
        import json

        child = int(json.loads(data.decode())["child-pid"])
        info["bwrap_pids"].append(child)
        info["init_pid"] = child
    except (ValueError, KeyError, TypeError):
        child = 0
    proc.returncode = 0  # reaped by `_reap` below, not by Popen
    if block:
        from suanli.sandbox import netns

        info["pasta_pid"] = netns.connect_held(child, proc.pid, block[1], uid, gid, STAGE, lambda: limits.join(cg))
    return proc.pid, info


def _exit_code(code: int, sandboxed: bool) -> int:
    """bwrap reports a job killed by signal N as 128+N; the supervisor reports signals as negative codes."""
    if sandboxed and 128 < code <= 128 + 64:
        return -(code - 128)
    return code


def supervise(config: dict) -> int:
    """Run the command to its end; the job's exit code (also written to the rc file)."""
    rc_file, stop_file, grace_s = config["rc_file"], config["stop_file"], float(config["grace_s"])
    command, sandbox = config["command"], config.get("sandbox")
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
    cg: dict = {}
    if sandbox is not None:
        from suanli.sandbox import limits

        cg = limits.create(sandbox["cgroup"], int(sandbox.get("cpu_milli") or 0), int(sandbox.get("memory_mib") or 0))
        sandbox = {**sandbox, "cgroup": cg}
        if cg.get("why"):
            _say(f"limits by rlimit: {cg['why']}")
            sandbox["bwrap"] = limits.unbind(sandbox["bwrap"])  # its view would be the planned, foreign cgroup
        limits.sweep(cg)  # leftovers of ranks whose supervisor was SIGKILLed on this host
    try:
        child, info = _spawn(command, _job_env(config["env"], sandbox is not None), sandbox)
    except (OSError, ValueError) as e:  # `_spawn` turns a failure in the child before exec into an OSError; text no
        # argv takes (a NUL, a lone surrogate) is a ValueError: the job cannot start, which is its own failure
        _say(f"cannot start the job: {e}")
        kill_family(os.getpid(), signal.SIGKILL)  # whatever the start left (a helper such as pasta)
        if cg:
            from suanli.sandbox import limits

            limits.remove(cg)
        write_atomic(rc_file, "127\n")
        return 127
    if sandbox is not None and config.get("sandbox_file"):
        record = {**info, "cgroup": cg, "uid": sandbox.get("uid"), "gid": sandbox.get("gid"),
                  "network": sandbox.get("network", "host"), "memory_mib": sandbox.get("memory_mib"),
                  "cpu_milli": sandbox.get("cpu_milli")}  # fmt: skip
        write_atomic(config["sandbox_file"], json.dumps(record))
    skip = _sandboxed_pids(info)
    code = None
    term_at: float | None = None
    killed = False
    try:
        while (code := _reap(child)) is None:
            if received and term_at is None:
                sig = received[0]
                _say(f"received {signal.Signals(sig).name}; passing it on, SIGKILL in {grace_s:g}s")
                if sandbox is None:
                    with contextlib.suppress(OSError):
                        os.killpg(child, sig)
                else:  # to the job's processes, not to bwrap's (the outer one would die and take the exit code),
                    # parents first: a shell whose child died first may leave its `wait` and exit, its trap unrun
                    for pid in family_top_down(os.getpid()):
                        if pid not in skip:
                            with contextlib.suppress(OSError):
                                os.kill(pid, sig)
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
    code = _exit_code(code, sandbox is not None)
    if sandbox is not None:
        from suanli.sandbox import limits

        if code == -signal.SIGKILL and limits.oom_killed(cg) and config.get("reason_file"):
            write_atomic(
                config["reason_file"], f"out of memory: killed at its memory limit of {sandbox['memory_mib']} MiB\n"
            )
        limits.remove(cg)
    write_atomic(rc_file, f"{code}\n")
    return code


def main(argv: list[str]) -> int:
    """One argument: a JSON launch file (mode 0600, read and deleted here), so that env values never show in argv."""
    if len(argv) != 1:
        _say("usage: python -m suanli.executors.rankrun LAUNCH_FILE")
        return 2
    with open(argv[0], encoding="utf-8") as f:
        config = json.load(f)
    with contextlib.suppress(OSError):
        os.unlink(argv[0])
    supervise(config)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
