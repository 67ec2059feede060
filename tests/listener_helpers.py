"""Stand-ins for a sandbox's listeners (`sandbox/listeners.owned_listener`): a server as the init of a stand-in
bwrap, whose child it is as a real sandbox's init is bwrap's, and plain servers outside any sandbox."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

SERVER = r"""
import socket, sys
who, port = sys.argv[1], int(sys.argv[2])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)   # what vLLM's create_server_socket does
s.bind(("127.0.0.1", port))
s.listen(64)
print("up", flush=True)
while True:
    c, _ = s.accept()
    c.recv(4096)
    body = who.encode()
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    c.close()
"""
BWRAP = "import subprocess, sys\np = subprocess.Popen(sys.argv[1:])\nprint(p.pid, flush=True)\np.wait()\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(who: str, port: int) -> subprocess.Popen:
    """A server answering every request with `who`, outside any sandbox."""
    p = subprocess.Popen([sys.executable, "-c", SERVER, who, str(port)], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline().strip() == "up"
    return p


def start_boxed(who: str, port: int, code: str = SERVER) -> tuple[subprocess.Popen, int]:
    """A server (`code`, which prints "up" once it listens) as the init of a stand-in sandbox: (its bwrap, the
    init's pid)."""
    argv = [sys.executable, "-c", BWRAP, sys.executable, "-c", code, who, str(port)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout is not None
    init = int(p.stdout.readline())
    assert p.stdout.readline().strip() == "up"
    return p, init


def sandbox_file(path: Path, bwrap: subprocess.Popen, init: int) -> Path:
    """The record a sandbox leaves (`rank-N.sandbox.json`), naming the stand-in's bwrap and init."""
    path.write_text(json.dumps({"init_pid": init, "bwrap_pids": [bwrap.pid]}))
    return path


def stop(*procs: subprocess.Popen | None) -> None:
    """Kill each process with whatever it started."""
    for p in procs:
        if p is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
