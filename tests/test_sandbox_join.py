"""`suanli.sandbox.join` runs a session's command so that it ends with the session: the command gets SIGHUP when
the process that entered the sandbox ends, however it ends, even in the instant between its fork and the command
being armed with that signal. Run on this host without a sandbox (`_run` is the part that forks)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import suanli

SRC = str(Path(suanli.__file__).resolve().parents[1])


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _join(
    tmp_path: Path, child_delay: float, parent_delay: float, hup: object = signal.SIG_DFL
) -> tuple[subprocess.Popen[bytes], Path]:
    """`_run` of a command that writes its pid and sleeps, with the fork's two sides held for the delays given."""
    pid_file = tmp_path / "pid"
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {SRC!r})
        from suanli.sandbox.join import _run
        os.register_at_fork(after_in_child=lambda: time.sleep({child_delay}),
                            after_in_parent=lambda: (open({str(pid_file)!r} + ".forked", "w").close(),
                                                     time.sleep({parent_delay})))
        sys.exit(_run(["sh", "-c", "echo $$ > {pid_file}; exec sleep 60"], dict(os.environ)))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], preexec_fn=lambda: signal.signal(signal.SIGHUP, hup))  # type: ignore[arg-type]
    deadline = time.monotonic() + 20
    while not Path(f"{pid_file}.forked").exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    return proc, pid_file


def _command_pid(pid_file: Path) -> int:
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return int(pid_file.read_text())


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGKILL])
def test_the_command_ends_when_join_ends_before_its_signal_handlers_exist(tmp_path: Path, sig: int) -> None:
    """A hangup (or SIGKILL, as asyncio's transport sends right after it) between fork and the handlers that pass
    signals on, while the child has not yet armed its parent-death signal: the command must not run on."""
    proc, pid_file = _join(tmp_path, child_delay=0.5, parent_delay=0.3)
    proc.send_signal(sig)
    proc.wait(10)
    time.sleep(1.5)  # past the child's delay: by now it has run the command, or ended instead
    if not pid_file.exists():
        return  # orphaned before it was armed, it ended rather than run the command
    pid = _command_pid(pid_file)
    try:
        assert _gone(pid, 5), f"the command {pid} runs on after join ended"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_hangup_after_the_handlers_reaches_the_command(tmp_path: Path) -> None:
    proc, pid_file = _join(tmp_path, child_delay=0.0, parent_delay=0.0)
    pid = _command_pid(pid_file)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(10) == -signal.SIGHUP  # join ends as its command did: by the hangup it passed on
    assert _gone(pid, 5)


def test_a_command_gets_its_hangup_where_the_server_ignores_hangups(tmp_path: Path) -> None:
    """A server started under `nohup` ignores SIGHUP, and an ignored signal stays ignored across fork and exec: the
    session's command ignored its hangup and ran on. It starts with SIGHUP as sshd gives it, the default."""
    proc, pid_file = _join(tmp_path, child_delay=0.0, parent_delay=0.0, hup=signal.SIG_IGN)
    pid = _command_pid(pid_file)
    proc.send_signal(signal.SIGHUP)  # (join itself passes it on; its own disposition is its handler)
    try:
        assert _gone(pid, 5), "the command ignored its hangup"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        proc.wait(10)
