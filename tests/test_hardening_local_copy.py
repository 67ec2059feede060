"""Attacks on same-host copies (`api.local_copy`) a hostile local user or tenant could make: each is refused by
name or the connection dropped, never an unhandled exception in the server, a descriptor it reads or writes with
its own rights, or room taken past the volume's size."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from tests import test_volumes_local_copy as base
from tests.test_volumes_local_copy import ask, info

srv = base.srv  # a live server of this module's own


def raw(c: Any) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + info(c)["socket"][1:])
    return s


def no_traceback(s: Any) -> bool:
    """No connection thread of the server died of an exception (its log shows each one's traceback)."""
    time.sleep(0.3)
    return "Traceback" not in s.log.read_text(errors="replace")


def dropped(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:  # closed with our bytes unread
        return True


BOMB = b'{"op":' + b"[" * 200_000 + b"]" * 200_000 + b"}"


@pytest.mark.parametrize("field", ["bomb", "path", "volume", "org", "token"])
def test_a_message_nested_too_deeply_or_naming_a_lone_surrogate_is_dropped_not_raised(
    srv: Any, tmp_path: Path, field: str
) -> None:
    """JSON parses "\\udcff" to a string no database or path can encode: it raised in the connection's thread (as
    did a nesting deeper than the parser recurses) instead of being refused."""
    s, c, _ = srv
    (tmp_path / "f").write_bytes(b"x")
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    msg = {"op": "put-file", "volume": "v", "path": "x", "token": c.token, field: "\udcff"}
    body = BOMB if field == "bomb" else json.dumps(msg).encode()  # "\udcff" in the JSON text
    try:
        with raw(c) as sock:
            socket.send_fds(sock, [struct.pack("!I", len(body)) + body], [fd])
            assert dropped(sock)
    finally:
        os.close(fd)
    assert no_traceback(s)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        pair = ask(c, {"op": "put-file", "path": "\U0001f600.txt"}, [fd])
    finally:
        os.close(fd)
    assert pair["ok"] is True  # a surrogate pair (an emoji, as json.dumps escapes it) is text


@pytest.mark.parametrize("how", ["O_PATH", "O_DIRECT"])
def test_a_descriptor_opened_with_o_path_or_o_direct_is_refused_by_name(srv: Any, tmp_path: Path, how: str) -> None:
    """Both passed the checks and then failed the kernel copy (EBADF, EINVAL): a 500 in the reply, not a 422."""
    _, c, _ = srv
    (tmp_path / "f").write_bytes(b"x" * 100)
    fd = os.open(tmp_path / "f", getattr(os, how) | os.O_RDONLY)
    try:
        got = ask(c, {"op": "put-file"}, [fd])
    finally:
        os.close(fd)
    assert got["status"] == 422 and got["detail"].startswith("fd: ") and how in got["detail"], got
