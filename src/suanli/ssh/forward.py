"""Port forwards into an instance (`ssh -L`, `-D`): a relay process inside the sandbox, so that the connection comes
from the instance's uid and network namespace, never from the gateway's. It counts against the connection's limit
of open forwards while open."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import asyncssh

from suanli.ssh.session import PipeBridge

log = logging.getLogger("suanli.ssh")
# Inside the sandbox: connect to a loopback port and copy both ways (standard library only).
RELAY = (
    "import os,socket,sys,threading\n"
    "s=socket.create_connection(('127.0.0.1',int(sys.argv[1])))\n"
    "def up():\n"
    "    while b:=os.read(0,65536): s.sendall(b)\n"
    "    s.shutdown(socket.SHUT_WR)\n"
    "threading.Thread(target=up,daemon=True).start()\n"
    "while b:=s.recv(65536): sys.stdout.buffer.write(b); sys.stdout.buffer.flush()\n"
)


class Relay(asyncssh.SSHTCPSession[bytes]):
    """One forwarded connection: a relay process inside the sandbox (`RELAY`) and the channel, bridged."""

    def __init__(self, owner: Any, argv: list[str]) -> None:
        self.owner, self.argv = owner, argv
        self.bridge: PipeBridge | None = None
        owner.forwards += 1

    def connection_made(self, chan: Any) -> None:
        self.bridge = PipeBridge(chan, stderr=False)

    def session_started(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._start())  # held: the loop keeps weak references

    async def _start(self) -> None:
        assert self.bridge is not None
        try:
            await self.bridge.start(self.argv, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        except OSError as e:
            log.warning("ssh: relay failed to start: %s", e)
            self.bridge.chan.close()

    def data_received(self, data: bytes, datatype: Any) -> None:
        assert self.bridge is not None
        self.bridge.input(data)

    def eof_received(self) -> bool:
        assert self.bridge is not None
        self.bridge.input_eof()
        return True

    def pause_writing(self) -> None:
        assert self.bridge is not None
        self.bridge.pause_output(True)

    def resume_writing(self) -> None:
        assert self.bridge is not None
        self.bridge.pause_output(False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.forwards -= 1
        if self.bridge is not None:
            self.bridge.hangup()
