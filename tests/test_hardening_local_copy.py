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

from suanli.storage import fd_channel as ch
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


@pytest.mark.parametrize("field", ["bomb", "path", "volume", "org", "token", "utf-8"])
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
    if field == "utf-8":  # the surrogate's own bytes, which json.loads lets through ("surrogatepass")
        body = json.dumps({**msg, "path": "@", field: ""}).encode().replace(b'"@"', b'"\xed\xb3\xbf"')
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


@pytest.mark.parametrize("where", ["/proc/self/status", "/sys/kernel/mm/transparent_hugepage/enabled"])
def test_a_file_of_a_kernel_filesystem_is_never_read_by_the_server(srv: Any, where: str) -> None:
    """Some of their files check the reader's capabilities as they are read: a root server would read with its
    own what the tenant's process only opened."""
    _, c, _ = srv
    if not os.path.exists(where):
        pytest.skip(f"{where} is not on this host")
    fd = os.open(where, os.O_RDONLY)
    try:
        got = ask(c, {"op": "put-file", "path": "kernel.txt"}, [fd])
    finally:
        os.close(fd)
    assert got["status"] == 422 and got["detail"].startswith("fd: ") and "kernel" in got["detail"], got
    assert all(e.name != "kernel.txt" for e in c.volume_ls("v", ""))


def test_a_copy_out_never_writes_into_a_kernel_file(srv: Any, tmp_path: Path) -> None:
    """Writes such as a lower /proc/PID/oom_score_adj check the writer's capabilities as they are written."""
    _, c, _ = srv
    (tmp_path / "src").write_bytes(b"pwned")
    c.volume_upload("v", tmp_path / "src", "comm.txt")
    before = Path("/proc/self/comm").read_text()
    fd = os.open("/proc/self/comm", os.O_WRONLY)
    try:
        got = ask(c, {"op": "get-file", "path": "comm.txt"}, [fd])
    finally:
        os.close(fd)
    assert got["status"] == 422 and got["detail"].startswith("fd: ") and "kernel" in got["detail"], got
    assert Path("/proc/self/comm").read_text() == before


def test_the_directories_of_a_tree_count_against_the_volumes_room(srv: Any) -> None:
    """As over HTTP (a directory is a 4 KiB block, as the volume is measured): a tree of empty directories cannot
    outgrow the volume; they were not counted, and a 1 MiB volume took a thousand."""
    _, c, _ = srv
    c.volume_create("tiny", "1Mi")  # 256 blocks
    with raw(c) as sock:
        ch.send(sock, {"op": "put-tree", "token": c.token, "volume": "tiny", "path": "d"})
        ch.send(sock, {"op": "batch", "dirs": [f"d{i}" for i in range(1000)], "files": []})
        ch.send(sock, {"op": "end"})
        got, _ = ch.recv(sock)
    assert got["ok"] is False and got["status"] == 507, got
    assert c.volume_ls("tiny", "") == []


def test_a_skip_list_longer_than_its_batch_is_refused_at_once(srv: Any, tmp_path: Path) -> None:
    """skip was made a set again for each file of a batch: a million entries cost seconds of CPU in the HTTP
    server's process, batch after batch."""
    _, c, _ = srv
    (tmp_path / "f").write_bytes(b"x")
    c.volume_upload("v", tmp_path / "f", "sk/a")
    c.volume_upload("v", tmp_path / "f", "sk/b")
    with raw(c) as sock:
        ch.send(sock, {"op": "get-tree", "token": c.token, "volume": "v", "path": "sk"})
        batch, _ = ch.recv(sock)
        assert [f[0] for f in batch["files"]] == ["a", "b"]
        fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o600)
        ch.send(sock, {"op": "fds", "skip": [0] * 1_000_000}, [fd])
        os.close(fd)
        got, _ = ch.recv(sock)
    assert got["status"] == 422 and got["detail"].startswith("fds: "), got


def test_a_peer_trickling_a_message_is_dropped_when_the_message_is_late_not_when_it_falls_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The idle timeout was per read: a byte every IDLE_S - 1 seconds held a slot (of 8) for ever, before any
    token was shown. A whole message must now come within IDLE_S."""
    from suanli.api import local_copy

    monkeypatch.setattr(local_copy, "IDLE_S", 1.0)
    server = local_copy.LocalCopyServer(None)  # type: ignore[arg-type] # dropped before a copy needs the server
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect("\0" + server.name)
            body = b'{"op":"put-file"}'
            data = struct.pack("!I", len(body)) + body
            start = time.monotonic()
            try:
                for b in data:  # one byte every 0.3 s: never a second of silence
                    sock.sendall(bytes([b]))
                    time.sleep(0.3)
            except OSError:  # dropped: what is asked
                pass
            assert dropped(sock) and time.monotonic() - start < 3
        assert not server.by_uid  # its slot is back
    finally:
        server.close()


class _Failing:
    """A listening socket whose accept fails as it does when the process is out of descriptors."""

    def __init__(self) -> None:
        self.calls = 0

    def accept(self) -> Any:
        self.calls += 1
        raise OSError(24, "Too many open files")


def test_the_accept_thread_backs_off_when_out_of_descriptors_instead_of_spinning() -> None:
    """EMFILE made the accept loop retry at once, for ever: a core of CPU (and the GIL) taken from the HTTP server
    while the process was short of descriptors, which a few local users holding copies open can bring about."""
    from suanli.api import local_copy

    server = local_copy.LocalCopyServer(None)  # type: ignore[arg-type] # accepts, never copies
    real, fake = server.sock, _Failing()
    try:
        server.sock = fake  # type: ignore[assignment]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect("\0" + server.name)  # the loop's pending accept returns; its next ones fail
            time.sleep(1.0)
        assert 1 <= fake.calls <= 20, fake.calls
    finally:
        server.closed = True
        server.sock = real
        server.close()


@pytest.mark.parametrize(("soft", "hard"), [(1024, 524_288), (1024, 4096)])
def test_the_copies_descriptors_are_added_to_the_process_limit_not_taken_from_the_http_servers(
    monkeypatch: pytest.MonkeyPatch, soft: int, hard: int
) -> None:
    """A copy holds up to a batch received, a batch going out and a walk's open directories at once: under the
    usual soft limit of 1024 two local users' copies left the HTTP server no descriptor to accept or answer with."""
    import resource

    from suanli.api import local_copy

    set_to: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: (soft, hard))
    monkeypatch.setattr(resource, "setrlimit", lambda which, lim: set_to.append(lim))
    server = local_copy.LocalCopyServer(None)  # type: ignore[arg-type]
    server.close()
    want = min(hard, soft + local_copy.SLOTS * local_copy.FDS_PER_COPY)
    assert set_to == [(want, hard)] and local_copy.FDS_PER_COPY > 2 * (ch.MAX_FDS + 3)


def chain(top: Path, depth: int) -> None:
    """`depth` directories named d, one in the other, under `top` (made through descriptors: deeper than a path)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)


def unchain(top: Path) -> None:
    """Remove what `chain` made, bottom up (shutil.rmtree, and pytest's own clean-up, recurse a level a frame)."""
    fds = [os.open(top, os.O_RDONLY | os.O_DIRECTORY)]
    while True:
        try:
            fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
        except OSError:
            break
    os.close(fds.pop())
    while fds:
        os.rmdir("d", dir_fd=fds[-1])
        os.close(fds.pop())


def test_a_tree_nested_deeper_than_a_walk_recurses_is_refused_by_name(srv: Any, tmp_path: Path) -> None:
    """A workload can nest directories a thousand deep in its volume; the walks (os.fwalk recurses a level a
    frame) raised RecursionError in the connection thread, on a copy out of the tree and on any copy in (which
    measures the volume first): no answer, a traceback. The walks are loops now, bounded at 1000 levels."""
    s, c, _ = srv
    vol = c.volume_create("deep", "8Mi")
    data = next(s.home.glob(f"volumes/*/vols/{vol.id}/data"))
    chain(data, 1200)
    try:
        (tmp_path / "f").write_bytes(b"x")
        fd = os.open(tmp_path / "f", os.O_RDONLY)
        try:
            put = ask(c, {"op": "put-file", "volume": "deep", "path": "f"}, [fd])
        finally:
            os.close(fd)
        with raw(c) as sock:  # batches of directories (no files: nothing to answer), then the reply
            ch.send(sock, {"op": "get-tree", "token": c.token, "volume": "deep", "path": ""})
            while (out := ch.recv(sock)[0]).get("op") == "batch":
                pass
    finally:
        unchain(data)
    for got in (put, out):
        assert got["ok"] is False and got["status"] == 422 and got["detail"].startswith("volume: "), got
        assert "nested more than 1000 levels deep" in got["detail"], got
    assert no_traceback(s)


def test_two_copies_of_one_path_at_once_each_land_whole(srv: Any, tmp_path: Path) -> None:
    """Both wrote the same partial file (truncating each other's) and the second to finish found it gone: a 500,
    or a file of both copies' bytes. Each now lands whole, the last one renamed into place stays."""
    import threading

    _, c, _ = srv
    srcs = [tmp_path / "a", tmp_path / "b"]
    for i, p in enumerate(srcs):
        p.write_bytes(bytes([65 + i]) * (8 << 20))
    got: list[dict[str, Any]] = []

    def one(p: Path) -> None:
        fd = os.open(p, os.O_RDONLY)
        try:
            got.append(ask(c, {"op": "put-file", "path": "race.bin"}, [fd]))
        finally:
            os.close(fd)

    for _ in range(4):
        ts = [threading.Thread(target=one, args=(p,)) for p in srcs]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        c.volume_download("v", "race.bin", tmp_path / "back", same_host=False)
        assert (tmp_path / "back").read_bytes() in (srcs[0].read_bytes(), srcs[1].read_bytes())
    assert all(g["ok"] is True for g in got), got


def test_every_descriptor_of_a_tree_copy_broken_off_midway_is_closed(srv: Any, tmp_path: Path) -> None:
    """A copy in refused at its second batch, a copy out answered with the wrong number of files and one whose
    peer leaves mid-tree: the server's descriptors (received, opened in the volume, the walk's) all closed."""
    s, c, _ = srv
    for i in range(300):  # two batches out
        (tmp_path / "src" / f"s{i % 3}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / f"s{i % 3}" / f"f{i}").write_bytes(b"x")
    assert c.volume_upload("v", tmp_path / "src", "many").via == "same-host"
    info(c)
    before = base.server_fds(s)
    fds = [os.open(p, os.O_RDONLY) for p in sorted((tmp_path / "src" / "s0").iterdir())[:50]]
    try:
        with raw(c) as sock:
            ch.send(sock, {"op": "put-tree", "token": c.token, "volume": "v", "path": "in"})
            ch.send(sock, {"op": "batch", "dirs": [], "files": [f"ok{i}" for i in range(50)]}, fds)
            ch.send(sock, {"op": "batch", "dirs": [], "files": [f"../x{i}" for i in range(50)]}, fds)
            assert ch.recv(sock)[0]["status"] == 422
        out = os.open(tmp_path / "o", os.O_WRONLY | os.O_CREAT, 0o600)
        for answer in ([out] * 3, None):  # too few files; then no answer at all (the peer leaves)
            with raw(c) as sock:
                ch.send(sock, {"op": "get-tree", "token": c.token, "volume": "v", "path": "many"})
                while not (b := ch.recv(sock)[0])["files"]:
                    pass
                assert len(b["files"]) > 3
                if answer is None:
                    continue
                ch.send(sock, {"op": "fds", "skip": []}, answer)
                assert ch.recv(sock)[0]["status"] == 422
        os.close(out)
    finally:
        ch.close_all(fds)
    assert base.settles_at(s, before)


def test_a_sealed_memfd_to_copy_out_into_is_refused_by_name(srv: Any, tmp_path: Path) -> None:
    """A memfd sealed against writing passed the checks (a regular file opened for writing) and failed the copy
    with EPERM: a 500 in the reply and a warning in the server's log, as often as a tenant liked."""
    import fcntl

    _, c, _ = srv
    (tmp_path / "src").write_bytes(b"y" * 10)
    c.volume_upload("v", tmp_path / "src", "seal.txt")
    fd = os.memfd_create("sealed", os.MFD_ALLOW_SEALING)
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
        got = ask(c, {"op": "get-file", "path": "seal.txt"}, [fd])
    finally:
        os.close(fd)
    assert got["status"] == 422 and got["detail"].startswith("fd: ") and "sealed" in got["detail"], got
