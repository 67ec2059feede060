"""Which loopback listener is a sandbox's (`sandbox/listeners.owned_listener`, what the instance proxy's `ports:` and
the serving gateway trust): a port is the sandbox's only while its processes hold every socket listening there.

Found by a hostile review: vLLM binds with SO_REUSEPORT, so another process of the same uid (a server run as an
ordinary user runs every org's sandboxes as that one user) could bind the same 127.0.0.1 port and get a share of the
gateway's connections, and the port still counted as the replica's because one listener on it was."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

from suanli.sandbox.listeners import owned_listener
from tests.listener_helpers import free_port, start, start_boxed, stop


def _ask(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as c:
        c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := c.recv(4096):
            data += chunk
    return data.split(b"\r\n\r\n", 1)[1].decode()


def test_a_port_shared_with_a_process_outside_the_sandbox_is_not_owned(tmp_path: Path) -> None:
    port = free_port()
    bwrap, replica = start_boxed("replica", port)  # stands for the replica's vLLM (its sandbox's only process here)
    attacker = None
    try:
        box = tmp_path / "sandbox.json"
        box.write_text(json.dumps({"init_pid": replica, "bwrap_pids": [bwrap.pid]}))
        assert owned_listener(box, port) == "127.0.0.1"  # the replica alone: ready, rightly
        attacker = start("attacker", port)  # another tenant's process, same uid, joins the port
        answers = {_ask(port) for _ in range(40)}
        assert "attacker" in answers, answers  # the kernel hands it some of the gateway's connections
        # SAFE: once a listener on the port is not the sandbox's, the port is not the replica's (not ready)
        assert owned_listener(box, port) is None, (
            f"owned_listener still vouches for port {port} while a process outside the sandbox answers "
            f"{sorted(answers)} on it"
        )
    finally:
        stop(bwrap, attacker)


def test_a_port_the_sandbox_holds_twice_is_its_own(tmp_path: Path) -> None:
    """Two listeners on one port, both the sandbox's (its server and a worker it forked, as uvicorn's do): owned."""
    port = free_port()
    bwrap, replica = start_boxed("replica", port)
    worker = start("worker", port)
    try:
        box = tmp_path / "sandbox.json"
        box.write_text(json.dumps({"init_pid": replica, "bwrap_pids": [bwrap.pid, worker.pid]}))
        assert owned_listener(box, port) == "127.0.0.1"
        box.write_text(json.dumps({"init_pid": replica, "bwrap_pids": [bwrap.pid]}))
        assert owned_listener(box, port) is None
    finally:
        stop(bwrap, worker)


def test_a_recycled_init_pid_is_no_sandbox(tmp_path: Path) -> None:
    """The sandbox ended and its init's pid went to another process before the server marked it stopped: that
    process is not the sandbox's init (its parent is not the recorded bwrap), so its listener is nobody's port.
    Found by a hostile review: the check took the pid on trust, where `sandbox.join` already refused it."""
    gone = subprocess.Popen(["true"])
    gone.wait(10)  # the sandbox's bwrap, exited
    port = free_port()
    stranger = start("stranger", port)  # now holds the pid recorded as the init
    try:
        box = tmp_path / "sandbox.json"
        box.write_text(json.dumps({"init_pid": stranger.pid, "bwrap_pids": [gone.pid]}))
        assert owned_listener(box, port) is None
        box.write_text(json.dumps({"init_pid": stranger.pid, "bwrap_pids": [os.getpid()]}))
        assert owned_listener(box, port) == "127.0.0.1"  # the same process, as the child of the recorded bwrap
    finally:
        stop(stranger)
