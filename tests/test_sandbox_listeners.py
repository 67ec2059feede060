"""Which loopback listener is a sandbox's (`sandbox/listeners.owned_listener`, what the instance proxy's `ports:` and
the serving gateway trust): a port is the sandbox's only while its processes hold every socket listening there.

Found by a hostile review: vLLM binds with SO_REUSEPORT, so another process of the same uid (a server run as an
ordinary user runs every org's sandboxes as that one user) could bind the same 127.0.0.1 port and get a share of the
gateway's connections, and the port still counted as the replica's because one listener on it was."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from suanli.sandbox.listeners import owned_listener

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(who: str, port: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", SERVER, who, str(port)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "up"
    return p


def _ask(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as c:
        c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := c.recv(4096):
            data += chunk
    return data.split(b"\r\n\r\n", 1)[1].decode()


def test_a_port_shared_with_a_process_outside_the_sandbox_is_not_owned(tmp_path: Path) -> None:
    port = _free_port()
    replica = _start("replica", port)  # stands for the replica's vLLM (its sandbox's only process here)
    attacker = None
    try:
        box = tmp_path / "sandbox.json"
        box.write_text(json.dumps({"init_pid": replica.pid, "bwrap_pids": [replica.pid]}))
        assert owned_listener(box, port) == "127.0.0.1"  # the replica alone: ready, rightly
        attacker = _start("attacker", port)  # another tenant's process, same uid, joins the port
        answers = {_ask(port) for _ in range(40)}
        assert "attacker" in answers, answers  # the kernel hands it some of the gateway's connections
        # SAFE: once a listener on the port is not the sandbox's, the port is not the replica's (not ready)
        assert owned_listener(box, port) is None, (
            f"owned_listener still vouches for port {port} while a process outside the sandbox answers "
            f"{sorted(answers)} on it"
        )
    finally:
        for p in (replica, attacker):
            if p is not None:
                p.kill()
                p.wait()


def test_a_port_the_sandbox_holds_twice_is_its_own(tmp_path: Path) -> None:
    """Two listeners on one port, both the sandbox's (its server and a worker it forked, as uvicorn's do): owned."""
    port = _free_port()
    replica = _start("replica", port)
    worker = _start("worker", port)
    try:
        box = tmp_path / "sandbox.json"
        box.write_text(json.dumps({"init_pid": replica.pid, "bwrap_pids": [replica.pid, worker.pid]}))
        assert owned_listener(box, port) == "127.0.0.1"
        box.write_text(json.dumps({"init_pid": replica.pid, "bwrap_pids": [replica.pid]}))
        assert owned_listener(box, port) is None
    finally:
        for p in (replica, worker):
            p.kill()
            p.wait()
