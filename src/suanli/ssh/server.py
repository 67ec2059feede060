"""The SSH gateway: an asyncssh server whose login name is an instance (`ssh -p 2222 my-box@host`).

Authentication is by public key only; the `Access` the control plane provides decides whether a key may enter
that instance (its user is a member of the instance's org). A session runs inside the instance's sandbox: a
command (`ssh host -- cmd`, exit status passed back), a shell on a pseudo-terminal with window resizes, or the
SFTP subsystem as OpenSSH's own `sftp-server` inside the sandbox (so `sftp` and `scp` see exactly what the
instance sees). Local port forwarding (`-L`, and the SOCKS `-D` VS Code uses) reaches only the instance's
loopback ports. Remote forwarding, agent and X11 forwarding are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import asyncssh

from suanli.ssh.forward import RELAY, Relay
from suanli.ssh.keys import fingerprint_of
from suanli.ssh.session import PipeBridge, PtyBridge

log = logging.getLogger("suanli.ssh")
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "ip6-localhost"})
SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/libexec/sftp-server")
KEEP_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "COLORTERM")  # of what the client sends (SendEnv), these pass in


@dataclass(frozen=True)
class Grant:
    """Who logged in (a user, by one of their keys) to which instance's node-rank."""

    user_id: str
    email: str
    workload_id: str
    name: str
    node_rank: int = 0
    fingerprint: str = ""  # the key it came in by: `Access.target` checks it is still theirs at each new session


class Refused(Exception):
    """The instance cannot be entered now; the message is shown to the client on stderr."""


@dataclass(frozen=True)
class Target:
    """A running instance, as the gateway enters it: `enter(argv)` is the argv that runs `argv` inside its
    sandbox (raises Refused when that is no longer possible)."""

    enter: Callable[[list[str]], list[str]]


class Access(Protocol):
    """What the control plane decides for the gateway."""

    async def authorize(self, username: str, fingerprint: str, public_key: str) -> Grant | None:
        """The grant when this key may enter the instance `username` names; None refuses (the client cannot tell
        an unknown instance from another org's)."""
        ...

    async def target(self, grant: Grant) -> Target:
        """The instance as it is now, for each new session or forward of a connection (which may outlive its key
        or its user's membership); raises Refused naming why it cannot be entered now."""
        ...

    async def revoked(self, grants: list[Grant]) -> dict[Grant, str]:
        """Of the grants open connections hold, those that no longer hold (the key removed, the user gone from the
        org, the instance deleted), each with why: the gateway closes those connections, shells and all."""
        ...


@dataclass(frozen=True)
class Limits:
    max_connections: int = 512  # the whole gateway
    max_waiting_per_address: int = 8  # connections of one address not yet logged in (OpenSSH's MaxStartups, per source)
    max_auth_tries: int = 6  # keys one connection may offer (OpenSSH's MaxAuthTries): each is a lookup
    max_connections_per_user: int = 32
    max_sessions_per_connection: int = 10  # shells, commands and SFTP at once
    max_forwards_per_connection: int = 64  # open port-forward channels at once
    login_timeout_s: float = 30.0
    recheck_s: float = 10.0  # open connections' grants are re-read this often (`Gateway.watch`), as the proxy's are


class Gateway:
    """Shared state of one listening gateway: the access decisions, limits and live connection counts."""

    def __init__(self, access: Access, limits: Limits | None = None) -> None:
        self.access, self.limits = access, limits or Limits()
        self.connections = 0
        self.waiting: dict[str, int] = {}  # address -> its connections not yet logged in
        self.per_user: dict[str, int] = {}
        self.setsid = shutil.which("setsid")
        self.shell = "/bin/bash" if shutil.which("bash") else "/bin/sh"  # the sandbox's /usr is this host's
        self.sftp_server = next((p for p in SFTP_SERVERS if os.path.exists(p)), None)
        self.open: set[_Connection] = set()

    async def recheck(self) -> int:
        """Close every open connection whose grant no longer holds; how many were closed. Its sessions' processes
        then get SIGHUP, as when the client goes away."""
        held: dict[Grant, list[_Connection]] = {}
        for c in self.open:
            if c.counted_user is not None and c.grant is not None:
                held.setdefault(c.grant, []).append(c)
        if not held:
            return 0
        gone = await self.access.revoked(list(held))
        closed = 0
        for grant, why in gone.items():
            for c in held.get(grant, ()):
                log.info("ssh: closing %s's connection to %s: %s", grant.email, grant.name, why)
                c.close(why)
                closed += 1
        return closed

    async def watch(self) -> None:
        """Re-check open connections every `recheck_s` until cancelled: a connection outlives the key it came in
        by, and a shell must not (a reset removes the keys of whoever held the account)."""
        while True:
            await asyncio.sleep(self.limits.recheck_s)
            try:
                await self.recheck()
            except Exception:  # the database is away for a moment: try again next time
                log.exception("ssh: re-checking open connections failed")


class _Connection(asyncssh.SSHServer):
    """One client connection: authenticates, then opens sessions and port forwards for its grant."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.conn: asyncssh.SSHServerConnection | None = None
        self.grant: Grant | None = None
        self.counted_user: str | None = None
        self.sessions: set[_Session] = set()  # open shells, commands and SFTP
        self.lost = False  # the connection ended: a forward still being decided must not connect after all
        self.forwards = 0
        self._checked: dict[tuple[str, str], Grant | None] = {}  # the client asks twice per key (query, signed)
        self.address: str | None = None  # while it waits to log in: its address, counted in `Gateway.waiting`

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        self.gw.connections += 1
        self.gw.open.add(self)
        peer = conn.get_extra_info("peername")
        self.address = str(peer[0]) if peer else "?"
        self.gw.waiting[self.address] = self.gw.waiting.get(self.address, 0) + 1
        if self.gw.waiting[self.address] > self.gw.limits.max_waiting_per_address:
            log.warning("ssh: refusing a connection from %s: %d waiting to log in", self.address,
                        self.gw.waiting[self.address] - 1)  # fmt: skip
            conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS, "too many connections from your address waiting to "
                            "log in; try later")  # fmt: skip
        elif self.gw.connections > self.gw.limits.max_connections:
            log.warning("ssh: refusing a connection: %d open", self.gw.connections - 1)
            conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS, "too many connections to the gateway; try later")

    def _logged_in_or_gone(self) -> None:
        if self.address is None:
            return
        left = self.gw.waiting.get(self.address, 1) - 1
        if left > 0:
            self.gw.waiting[self.address] = left
        else:
            self.gw.waiting.pop(self.address, None)
        self.address = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.gw.connections -= 1
        self.gw.open.discard(self)
        self._logged_in_or_gone()
        if self.counted_user is not None:
            left = self.gw.per_user.get(self.counted_user, 1) - 1
            if left > 0:
                self.gw.per_user[self.counted_user] = left
            else:
                self.gw.per_user.pop(self.counted_user, None)

    def begin_auth(self, username: str) -> bool:
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        public = " ".join(key.export_public_key("openssh").decode("ascii").split()[:2])
        fp = fingerprint_of(key)
        if (username, fp) not in self._checked and len(self._checked) >= self.gw.limits.max_auth_tries:
            assert self.conn is not None
            self.conn.disconnect(asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE, "too many keys offered")
            return False
        if (username, fp) not in self._checked:
            try:
                self._checked[(username, fp)] = await self.gw.access.authorize(username, fp, public)
            except Exception:
                log.exception("ssh: authorizing %s failed", username)
                self._checked[(username, fp)] = None
        grant = self._checked[(username, fp)]
        if grant is None:
            return False
        if self.gw.per_user.get(grant.user_id, 0) >= self.gw.limits.max_connections_per_user:
            log.warning("ssh: %s has %d connections open; refused", grant.email, self.gw.per_user[grant.user_id])
            return False
        self.grant = grant
        return True

    def auth_completed(self) -> None:
        assert self.grant is not None
        self._logged_in_or_gone()
        self.counted_user = self.grant.user_id
        self.gw.per_user[self.counted_user] = self.gw.per_user.get(self.counted_user, 0) + 1
        log.info("ssh: %s entered %s (%s)", self.grant.email, self.grant.name, self.grant.workload_id)

    # -- channels -------------------------------------------------------------------------------------------------
    def session_requested(self) -> Any:
        if len(self.sessions) >= self.gw.limits.max_sessions_per_connection:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_RESOURCE_SHORTAGE,
                                            f"at most {self.gw.limits.max_sessions_per_connection} sessions per "
                                            "connection")  # fmt: skip
        session = _Session(self)
        self.sessions.add(session)
        return session

    def session_closed(self, session: _Session) -> None:
        self.sessions.discard(session)

    def close(self, why: str) -> None:
        """End the connection, telling why on each session's stderr first: the client may exit on its channel's
        close before it reads the disconnect message that follows."""
        for session in list(self.sessions):
            session.tell(why)
        if self.conn is not None:
            self.conn.disconnect(asyncssh.DISC_BY_APPLICATION, why)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> Any:
        if dest_host.lower() not in LOOPBACK:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                                            f"only the instance's own ports (127.0.0.1:PORT) can be forwarded, "
                                            f"not {dest_host}")  # fmt: skip
        if self.forwards >= self.gw.limits.max_forwards_per_connection:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_RESOURCE_SHORTAGE,
                                            f"at most {self.gw.limits.max_forwards_per_connection} forwarded "
                                            "connections at once")  # fmt: skip
        return self._forward(dest_port)

    async def _forward(self, port: int) -> Any:
        assert self.grant is not None and self.conn is not None
        try:
            target = await self.gw.access.target(self.grant)
        except Refused as e:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, str(e)) from None
        if self.lost:  # closed while the grant was read: asyncssh would drop what we open now without closing it
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, "the connection was closed")
        # A relay inside the sandbox connects, whatever its network: as the instance's uid, from its own loopback.
        # On the host network the gateway could connect itself, but as the server's uid, and a service that fences
        # loopback callers by uid (an owner rule against the sandbox uids) would let any tenant in as the server.
        try:
            argv = target.enter(["python3", "-c", RELAY, str(port)])
        except Refused as e:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, str(e)) from None
        return Relay(self, argv)

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # remote forwarding (-R) would listen on the gateway's host

    def unix_connection_requested(self, dest_path: str) -> bool:
        return False


class _Session(asyncssh.SSHServerSession[bytes]):
    """A shell, a command, or SFTP, inside the instance's sandbox."""

    def __init__(self, owner: _Connection) -> None:
        self.owner = owner
        self.chan: Any = None
        self.term: tuple[str, tuple[int, int, int, int]] | None = None
        self.argv: list[str] | None = None
        self.bridge: PipeBridge | PtyBridge | None = None
        self.early: list[bytes] = []
        self.early_eof = False
        self.closed = False

    def connection_made(self, chan: Any) -> None:
        self.chan = chan

    def pty_requested(self, term_type: str, term_size: tuple[int, int, int, int], term_modes: Any) -> bool:
        self.term = (term_type or "xterm", term_size)
        return True

    def shell_requested(self) -> bool:
        self.argv = [self.owner.gw.shell]
        return True

    def exec_requested(self, command: str) -> bool:
        self.argv = [self.owner.gw.shell, "-c", command]
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        if subsystem != "sftp" or self.owner.gw.sftp_server is None:
            return False  # the client says "subsystem request failed"
        # The sandbox's /etc/passwd names its uid (sftp-server refuses a uid without a passwd entry).
        self.argv = [self.owner.gw.sftp_server]
        self.term = None  # a binary protocol: never on a terminal
        return True

    def session_started(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._start())  # held: the loop keeps weak references

    def _env(self) -> dict[str, str]:
        """The environment of the process that enters the sandbox; of it, only TERM, the locale and SSH_* pass in
        (`suanli.sandbox.join`), beside the instance's own environment."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        sent = self.chan.get_environment() or {}
        env.update({k: v for k, v in sent.items() if k in KEEP_ENV and isinstance(v, str) and len(v) < 256})
        conn = self.owner.conn
        peer = conn.get_extra_info("peername") if conn else None
        sock = conn.get_extra_info("sockname") if conn else None
        if peer and sock:
            env["SSH_CLIENT"] = f"{peer[0]} {peer[1]} {sock[1]}"
            env["SSH_CONNECTION"] = f"{peer[0]} {peer[1]} {sock[0]} {sock[1]}"
        if self.term:
            env["TERM"] = self.term[0]
        return env

    async def _start(self) -> None:
        grant = self.owner.grant
        assert grant is not None and self.argv is not None
        try:
            target = await self.owner.gw.access.target(grant)
            argv = target.enter(self.argv)
        except Refused as e:
            self._refuse(str(e))
            return
        except Exception:
            log.exception("ssh: entering %s failed", grant.workload_id)
            self._refuse(f"instance {grant.name}: the gateway could not enter it (see the server log)")
            return
        setsid = self.owner.gw.setsid
        bridge: PipeBridge | PtyBridge
        if self.term is not None:  # a controlling terminal, so Ctrl-C and job control work
            bridge, argv = PtyBridge(self.chan, self.term[1]), [setsid, "-w", "--ctty", *argv] if setsid else argv
        else:
            bridge = PipeBridge(self.chan)
        self.bridge = bridge  # input from now on goes to the bridge, which holds it until the process runs
        for data in self.early:
            bridge.input(data)
        if self.early_eof:
            bridge.input_eof()
        self.early.clear()
        try:
            await bridge.start(argv, self._env())
        except OSError as e:
            log.warning("ssh: starting %s in %s failed: %s", argv[:1], grant.workload_id, e)
            bridge.hangup()
            self._refuse(f"instance {grant.name}: could not start the session ({e.strerror})")
            return
        if self.closed:
            bridge.hangup()

    def _refuse(self, message: str) -> None:
        self.tell(message)
        with contextlib.suppress(Exception):
            self.chan.exit(1)

    def tell(self, message: str) -> None:
        """A line on the client's stderr (after a CR on a terminal)."""
        with contextlib.suppress(Exception):
            self.chan.write_stderr(f"{message}\r\n".encode() if self.term else f"{message}\n".encode())

    def data_received(self, data: bytes, datatype: Any) -> None:
        if self.bridge is None:
            self.early.append(data)
        else:
            self.bridge.input(data)

    def eof_received(self) -> bool:
        if self.bridge is None:
            self.early_eof = True
        else:
            self.bridge.input_eof()
        return True  # keep the channel open for the output and the exit status

    def pause_writing(self) -> None:
        if self.bridge is not None:
            self.bridge.pause_output(True)

    def resume_writing(self) -> None:
        if self.bridge is not None:
            self.bridge.pause_output(False)

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        if isinstance(self.bridge, PtyBridge):
            self.bridge.resize(width, height, pixwidth, pixheight)

    def signal_received(self, signal: str) -> None:
        if self.bridge is not None:
            self.bridge.signal(signal)

    def break_received(self, msec: int) -> bool:
        if self.bridge is not None:
            self.bridge.signal("INT")
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.owner.session_closed(self)
        if self.bridge is not None:
            self.bridge.hangup()


async def listen(gw: Gateway, host: str, port: int, host_key: Path) -> asyncssh.SSHAcceptor:
    """Start accepting connections; the acceptor's `close()` stops."""
    return await asyncssh.listen(
        host, port, server_factory=lambda: _Connection(gw), server_host_keys=[str(host_key)],
        encoding=None, login_timeout=gw.limits.login_timeout_s, agent_forwarding=False, x11_forwarding=False,
        allow_pty=True, reuse_address=True, server_version="suanli",
    )  # fmt: skip
