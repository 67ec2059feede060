"""The SDK's side of same-host copies (`api.local_copy`): on the server's own host, `volume_upload` and
`volume_download` pass open files to the server over a Unix socket, and the server copies them in the kernel.

This process opens every local file itself (so only what its user may read is read, and files are created as
its user); it never opens a descriptor the server sends (the server sends none). It uses the socket only after the
server announced it over authenticated HTTP and the socket's peer is that very process (pid and uid from
SO_PEERCRED), so no other local user can pose as the server and be sent a token. Anything short of that, or a
busy server, and the copy goes over HTTP as before.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from suanli.client.tree_writer import Refused, TreeWriter
from suanli.storage import fd_channel as ch

BATCH = 200  # files a batch of a tree carries
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
Progress = Callable[[int], None]


class Busy(Exception):
    """The server took no copy (busy, or gone): copy over HTTP instead."""


@dataclass(frozen=True)
class Channel:
    socket: str
    pid: int
    uid: int
    token: str


def is_loopback(server: str) -> bool:
    return ch.loopback_host(urlparse(server).hostname or "")


def connect(c: Channel) -> socket.socket:
    """A connection to the announced socket whose peer is the announced process; `Busy` otherwise."""
    if not c.socket.startswith("@"):
        raise Busy("not an abstract socket")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.connect("\0" + c.socket[1:])
        pid, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except (OSError, AttributeError):  # (no abstract sockets or SO_PEERCRED off Linux: HTTP)
        s.close()
        raise Busy("no such socket here") from None
    if (pid, uid) != (c.pid, c.uid):
        s.close()
        raise Busy("the socket's peer is not the server that announced it")
    return s


def _ask(c: Channel, msg: dict[str, Any], fds: list[int]) -> socket.socket:
    s = connect(c)
    try:
        ch.send(s, {**msg, "token": c.token}, fds)
    except OSError:
        s.close()
        raise Busy("the server closed the connection") from None
    return s


def _reply(s: socket.socket, progress: Progress | None = None) -> dict[str, Any]:
    """Progress reports, then the reply: its fields, or an `ApiError` with the server's status and words."""
    seen = 0
    while True:
        msg = _next(s)
        if msg.get("op") != "progress":
            out = _answer(msg)
            if progress is not None and int(out.get("bytes", 0)) > seen:
                progress(int(out["bytes"]) - seen)
            return out
        n = int(msg.get("bytes", 0))
        if progress is not None and n > seen:
            progress(n - seen)
        seen = max(seen, n)


def _next(s: socket.socket) -> dict[str, Any]:
    try:
        return ch.recv(s, max_fds=0)[0]
    except (ch.ChannelError, OSError) as e:
        from suanli.client import ApiError

        raise ApiError(0, f"the same-host copy broke off ({e}); copy again") from None


def _answer(msg: dict[str, Any]) -> dict[str, Any]:
    if msg.get("ok") is True:
        return msg
    status = int(msg.get("status", 0))
    if status == 503:
        raise Busy(str(msg.get("detail")))
    from suanli.client import ApiError

    raise ApiError(status, str(msg.get("detail")))


def put_file(c: Channel, ref: str, org: str | None, path: str, src: Path, progress: Progress | None) -> dict[str, Any]:
    fd = os.open(src, _READ)
    try:
        s = _ask(c, {"op": "put-file", "volume": ref, "org": org, "path": path}, [fd])
    finally:
        os.close(fd)
    with s:
        return _reply(s, progress)


def get_file(c: Channel, ref: str, org: str | None, path: str, dest: Path, progress: Progress | None) -> dict[str, Any]:
    """Into `dest` + ".suanli-part" (created as this user), renamed to `dest` once whole."""
    part = dest.with_name(dest.name + ".suanli-part")
    fd = os.open(part, _WRITE, 0o644)
    try:
        s = _ask(c, {"op": "get-file", "volume": ref, "org": org, "path": path}, [fd])
    except BaseException:
        os.close(fd)
        part.unlink(missing_ok=True)
        raise
    os.close(fd)
    with s:
        try:
            out = _reply(s, progress)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
    os.replace(part, dest)
    return out


def _walk(top: Path) -> Iterator[tuple[list[str], list[str], list[int]]]:
    """Batches of (directories, files, descriptors) of a local tree; links and special files are skipped, as the
    HTTP path's tar skips them."""
    dirs_b: list[str] = []
    names: list[str] = []
    fds: list[int] = []
    try:
        for dirpath, dirs, files in os.walk(top):
            dirs.sort()
            rel = os.path.relpath(dirpath, top)
            base = "" if rel == "." else rel + "/"
            if base:
                dirs_b.append(rel)
            for name in sorted(files):
                try:
                    fd = os.open(os.path.join(dirpath, name), _READ)
                except OSError:
                    continue  # a link (O_NOFOLLOW), or gone
                if not _regular(fd):
                    os.close(fd)
                    continue
                fds.append(fd)
                names.append(base + name)
                if len(fds) >= BATCH or len(dirs_b) >= 1000:
                    yield dirs_b, names, fds
                    ch.close_all(fds)
                    dirs_b, names, fds = [], [], []
        yield dirs_b, names, fds
    finally:
        ch.close_all(fds)


def _regular(fd: int) -> bool:
    import stat

    return stat.S_ISREG(os.fstat(fd).st_mode)


def put_tree(c: Channel, ref: str, org: str | None, path: str, src: Path, progress: Progress | None) -> dict[str, Any]:
    s = _ask(c, {"op": "put-tree", "volume": ref, "org": org, "path": path}, [])
    with s:
        try:
            for dirs, names, fds in _walk(src):
                sizes = sum(os.fstat(fd).st_size for fd in fds)
                ch.send(s, {"op": "batch", "dirs": dirs, "files": names}, fds)
                if progress is not None:
                    progress(sizes)
            ch.send(s, {"op": "end"})
        except OSError:
            pass  # the server stopped reading: its reply says why
        return _reply(s)


def get_tree(c: Channel, ref: str, org: str | None, path: str, dest: Path, progress: Progress | None) -> dict[str, Any]:
    """Into the directory `dest`: directories made, links that stay inside it made (others skipped), files created
    as this user and filled by the server; never through a link (`client/tree_writer.py`)."""
    s = _ask(c, {"op": "get-tree", "volume": ref, "org": org, "path": path}, [])
    with s, TreeWriter(dest) as tree:
        while True:
            msg = _next(s)
            if msg.get("op") == "end":
                return _reply(s)
            if msg.get("op") != "batch":
                return _answer(msg)
            try:
                for d in msg.get("dirs", []):
                    tree.mkdir(d)
                for name, target in msg.get("links", []):
                    tree.link(name, str(target))
                fds: list[int] = []
                total = 0
                try:
                    for name, size, mode in msg.get("files", []):
                        fds.append(tree.create(name, int(mode)))
                        total += int(size)
                    if fds:
                        ch.send(s, {"op": "fds"}, fds)
                finally:
                    ch.close_all(fds)
            except Refused as e:
                from suanli.client import ApiError

                raise ApiError(0, f"{e}; the copy stopped there") from None
            if progress is not None and total:
                progress(total)
