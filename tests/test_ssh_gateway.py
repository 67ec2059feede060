"""The SSH gateway's protocol side with the real OpenSSH client: commands and their exit status, a terminal that
resizes, scp and sftp in and out, local port forwards only to loopback, refused keys, and the per-connection
limits. A stand-in `Access` runs the sessions on this host (`test_ssh_e2e.py` enters real sandboxes)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import select
import socket
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from suanli.ssh.hostkey import ensure_host_key
from suanli.ssh.keys import parse
from suanli.ssh.server import Gateway, Grant, Limits, Refused, Target, listen
from tests.control_plane import free_port
from tests.ssh_helpers import SFTP_SERVER, keygen, options, require_openssh, scp, ssh


@dataclass
class StandIn:
    """Lets `key` into "box" (running), "parked" (stopped), "doomed" (running until a test revokes it) and "slow"
    (whose grant takes half a second to read again); "box.1" is node-rank 1."""

    fingerprint: str
    entered: list[list[str]] = field(default_factory=list)
    revoke: dict[str, str] = field(default_factory=dict)  # instance name -> why its grants no longer hold

    async def authorize(self, username: str, fingerprint: str, public_key: str) -> Grant | None:
        name, _, rank = username.partition(".")
        if fingerprint != self.fingerprint or name not in ("box", "parked", "doomed", "slow"):
            return None
        return Grant("usr_1", "me@example.com", f"wl_{name}", name, int(rank or 0))

    async def revoked(self, grants: list[Grant]) -> dict[Grant, str]:
        return {g: self.revoke[g.name] for g in grants if g.name in self.revoke}

    async def target(self, grant: Grant) -> Target:
        if grant.name == "slow":
            await asyncio.sleep(0.5)
        if grant.name == "parked":
            raise Refused("instance parked is stopped; `suanli start parked`")

        def enter(argv: list[str]) -> list[str]:
            self.entered.append(argv)
            return ["env", f"RANK_SEEN={grant.node_rank}", *argv]

        return Target(enter)


@dataclass
class Running:
    port: int
    key: Path
    other_key: Path
    access: StandIn


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    require_openssh()
    tmp = tmp_path_factory.mktemp("gw")
    key, other = keygen(tmp / "id_ed25519"), keygen(tmp / "other")
    access = StandIn(parse((tmp / "id_ed25519.pub").read_text()).fingerprint)
    port = free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    acceptor: list[Any] = []

    async def start() -> None:
        limits = Limits(max_sessions_per_connection=2, max_connections_per_user=50, recheck_s=0.2)
        gw = Gateway(access, limits)
        acceptor.append(await listen(gw, "127.0.0.1", port, ensure_host_key(tmp / "home")))
        acceptor.append(loop.create_task(gw.watch()))
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(30)
    yield Running(port, key, other, access)
    loop.call_soon_threadsafe(acceptor[0].close)
    loop.call_soon_threadsafe(acceptor[1].cancel)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_commands_run_and_their_exit_status_comes_back(gateway: Running) -> None:
    p = ssh(gateway.key, gateway.port, "box", "echo hi; echo oops >&2")
    assert (p.returncode, p.stdout, p.stderr.strip().splitlines()[-1]) == (0, "hi\n", "oops")
    assert ssh(gateway.key, gateway.port, "box", "exit 3").returncode == 3
    assert ssh(gateway.key, gateway.port, "box.1", "echo $RANK_SEEN").stdout == "1\n"
    p = ssh(gateway.key, gateway.port, "box", "wc -c", stdin="x" * 300_000)  # input and its EOF reach the command
    assert p.stdout.strip() == "300000"
    big = ssh(gateway.key, gateway.port, "box", "head -c 20000000 /dev/zero | tr '\\0' x")  # output fully flushed
    assert len(big.stdout) == 20_000_000 and big.returncode == 0
    killed = ssh(gateway.key, gateway.port, "box", "kill -TERM $$")
    assert killed.returncode == 255  # OpenSSH reports a remote killed by a signal as 255


def test_a_stopped_instance_answers_with_its_state(gateway: Running) -> None:
    p = ssh(gateway.key, gateway.port, "parked", "echo hi")
    assert p.returncode == 1 and p.stdout == ""
    assert "instance parked is stopped; `suanli start parked`" in p.stderr


def test_an_open_connection_whose_grant_is_revoked_is_closed_and_its_processes_hung_up(
    gateway: Running, tmp_path: Path
) -> None:
    """A shell already running when its key is removed (or its user leaves the org, or the instance is deleted)
    does not go on: the gateway re-reads the grants of its open connections and closes those no longer held."""
    pid_file = tmp_path / "pid"
    argv = ["ssh", *options(gateway.key, gateway.port), "doomed@127.0.0.1", f"echo $$ > {pid_file}; exec sleep 300"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        remote = int(pid_file.read_text())
        time.sleep(0.6)  # several re-checks while the grant still holds: the connection stays
        assert proc.poll() is None and os.path.exists(f"/proc/{remote}")
        gateway.access.revoke["doomed"] = "your key was removed (or a new password set by a reset); connect again"
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        gateway.access.revoke.clear()
    assert proc.returncode == 255 and "your key was removed" in err, err
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{remote}") and time.monotonic() < deadline:  # SIGHUP ends it, as under sshd
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{remote}")
    assert ssh(gateway.key, gateway.port, "box", "echo still").stdout == "still\n"  # other grants are untouched


def test_unknown_instances_and_unknown_keys_are_refused_alike(gateway: Running) -> None:
    for key, login in ((gateway.other_key, "box"), (gateway.key, "nobody"), (gateway.key, "../etc")):
        p = ssh(key, gateway.port, login, "echo hi")
        assert p.returncode == 255 and "Permission denied (publickey)" in p.stderr, (login, p.stderr)
    p = subprocess.run(["ssh", *options(gateway.key, gateway.port), "-o", "PubkeyAuthentication=no",
                        "-o", "PasswordAuthentication=yes", "box@127.0.0.1", "true"],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert p.returncode == 255 and "publickey" in p.stderr  # no passwords


def _pty_session(gateway: Running, script: list[tuple[bytes, float]], size: tuple[int, int]) -> tuple[bytes, int]:
    """Drive `ssh -tt` on a terminal of our own: write each input, read for its seconds, return all output."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.execvp("ssh", ["ssh", *options(gateway.key, gateway.port), "-tt", "box@127.0.0.1"])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
    out = b""

    def read(seconds: float) -> None:
        nonlocal out
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if select.select([fd], [], [], 0.05)[0]:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    return

    read(1.5)
    for data, seconds in script:
        if data == b"RESIZE":
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 132, 0, 0))  # ssh notices on SIGWINCH
        else:
            os.write(fd, data)
        read(seconds)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return out, os.waitstatus_to_exitcode(status)


def test_a_terminal_session_resizes_takes_ctrl_c_and_exits_with_the_shells_status(gateway: Running) -> None:
    script = [(b"stty size; tty\n", 1.0), (b"RESIZE", 0.5), (b"stty size\n", 1.0), (b"sleep 30\n", 0.5),
              (b"\x03", 0.5), (b"echo after-interrupt\n", 1.0), (b"exit 7\n", 1.5)]  # fmt: skip
    out, code = _pty_session(gateway, script, (30, 100))
    text = out.decode(errors="replace")
    assert "30 100" in text and "50 132" in text, text
    assert "/dev/pts/" in text  # a real terminal
    assert "after-interrupt" in text  # Ctrl-C stopped the sleep, not the shell
    assert code == 7


def test_scp_and_sftp_copy_both_ways(gateway: Running, tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    remote = tmp_path / "remote.bin"
    p = scp(gateway.key, gateway.port, str(src), f"box@127.0.0.1:{remote}")
    assert p.returncode == 0, p.stderr
    assert remote.read_bytes() == data
    back = tmp_path / "back.bin"
    p = scp(gateway.key, gateway.port, f"box@127.0.0.1:{remote}", str(back))
    assert p.returncode == 0 and back.read_bytes() == data, p.stderr
    assert any(argv[-1] == SFTP_SERVER for argv in gateway.access.entered)  # scp speaks SFTP, run in the target
    batch = f"put {src} {tmp_path}/via-sftp.bin\nls {tmp_path}\n"
    p = subprocess.run(["sftp", *[o if o != "-p" else "-P" for o in options(gateway.key, gateway.port)], "-b", "-",
                        "box@127.0.0.1"], input=batch, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0 and "via-sftp.bin" in p.stdout, p.stderr
    assert (tmp_path / "via-sftp.bin").read_bytes() == data


def _serve_once(port: int, reply: bytes) -> threading.Thread:
    srv = socket.create_server(("127.0.0.1", port))

    def run() -> None:
        with srv:
            conn, _ = srv.accept()
            with conn:
                conn.recv(100)
                conn.sendall(reply)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _connect(port: int, deadline: float) -> socket.socket:
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Counting:
    """A loopback server that counts the connections it accepted and those whose other end closed."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = self.closed = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            self.accepted += 1
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    def _drain(self, conn: socket.socket) -> None:
        with conn:
            while conn.recv(4096):
                pass
        self.closed += 1


def test_a_forward_whose_connection_ends_while_it_is_checked_leaves_no_socket_open(gateway: Running) -> None:
    """The client goes away (or the re-check closes its connection) while the gateway reads the grant again for a
    new forward: the gateway must not connect to the instance after all, or each such forward would leave a socket
    open in the gateway for good (a tenant could spend its file descriptors)."""
    server, local = Counting(), free_port()
    for _ in range(3):
        fwd = subprocess.Popen(["ssh", *options(gateway.key, gateway.port), "-N", "-L",
                                f"{local}:127.0.0.1:{server.port}", "slow@127.0.0.1"], stderr=subprocess.PIPE)  # fmt: skip
        try:
            c = _connect(local, time.monotonic() + 20)
            time.sleep(0.2)  # the gateway is reading the grant (0.5 s)
        finally:
            fwd.kill()
            fwd.wait(10)
        c.close()
    deadline = time.monotonic() + 5
    while server.closed < server.accepted and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.accepted == server.closed, (server.accepted, server.closed)


def test_local_port_forwarding_reaches_loopback_ports_only(gateway: Running) -> None:
    target, local, refused_local = free_port(), free_port(), free_port()
    _serve_once(target, b"hello through the tunnel")
    forwards = ["-L", f"{local}:127.0.0.1:{target}", "-L", f"{refused_local}:192.0.2.1:80"]
    proc = subprocess.Popen(["ssh", "-o", "LogLevel=INFO", *options(gateway.key, gateway.port), "-N", *forwards,
                             "box@127.0.0.1"],
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        with _connect(local, time.monotonic() + 20) as c:
            c.sendall(b"hi")
            assert c.recv(100) == b"hello through the tunnel"
        with _connect(refused_local, time.monotonic() + 20) as c:
            assert c.recv(100) == b""  # the gateway refused the channel: the client closes the connection
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # ssh waits for a forwarded connection the far end has not closed yet
            proc.kill()
            _, err = proc.communicate(timeout=10)
    assert b"only the instance's own ports" in err


def test_remote_forwarding_and_extra_sessions_are_refused(gateway: Running) -> None:
    p = subprocess.run(["ssh", *options(gateway.key, gateway.port), "-o", "ExitOnForwardFailure=yes",
                        "-R", f"{free_port()}:127.0.0.1:22", "box@127.0.0.1", "true"],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert p.returncode == 255 and "forwarding failed" in p.stderr.lower(), p.stderr
    # Three sessions on one connection (ControlMaster multiplexing) where the limit is two: the third is refused.
    sock = Path(f"/tmp/suanli-ssh-test-{os.getpid()}.sock")
    master = ["ssh", *options(gateway.key, gateway.port), "-o", f"ControlPath={sock}", "box@127.0.0.1"]
    holder = subprocess.Popen([*master[:1], "-M", *master[1:], "sleep 20"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        second = subprocess.Popen([*master, "sleep 20"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        third = subprocess.run([*master, "echo third"], capture_output=True, text=True, timeout=30)
        assert "Session open refused by peer" in third.stderr, third  # (ssh then falls back to a connection of its own)
        second.kill()
    finally:
        holder.kill()
        sock.unlink(missing_ok=True)
