"""Same-host copies: a real server process, its abstract Unix socket, open files passed both ways.

The copies must land exactly as HTTP copies do, and every descriptor or message a hostile local tenant could send
must be refused by name (a FIFO that would block the server, a directory, a file opened the wrong way, paths out of
the tree, too many descriptors) without leaking a descriptor in the server.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from suanli.client import ApiError, Client
from suanli.client import local_copy as lc
from suanli.storage import fd_channel as ch
from tests.control_plane import live_server, signup


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("local-copy")
    with live_server(tmp / "home", f"sqlite+pysqlite:///{tmp / 'db'}") as s:
        with httpx.Client(base_url=s.url) as http:
            a, b = signup(http, "owner@example.com"), signup(http, "stranger@example.com")
        with Client(s.url, a.token) as c, Client(s.url, b.token) as other:
            c.volume_create("v", "64Mi")
            yield s, c, other


def info(c: Client) -> dict[str, Any]:
    return c.call("GET", "/storage/local-copy")


def ask(c: Client, msg: dict[str, Any], fds: list[int] = (), token: str | None = None) -> dict[str, Any]:  # type: ignore[assignment]
    """One raw request, as a hostile client would write it; the server's last message."""
    i = info(c)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + i["socket"][1:])
    with s:
        ch.send(s, {"token": c.token if token is None else token, "volume": "v", "path": "x", **msg}, fds)
        while True:
            got, more = ch.recv(s)
            ch.close_all(more)
            if got.get("op") != "progress":
                return got


def server_fds(srv: Any) -> int:
    return len(os.listdir(f"/proc/{srv.proc.pid}/fd"))


def settles_at(srv: Any, most: int) -> bool:
    """The server closes a connection just after its answer: give it a moment, then count its descriptors."""
    for _ in range(50):
        if server_fds(srv) <= most:
            return True
        time.sleep(0.05)
    return False


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_socket_is_announced_to_callers_and_its_peer_is_the_server(srv: Any) -> None:
    s, c, _ = srv
    i = info(c)
    assert i["socket"].startswith("@suanli-copy-") and i["pid"] == s.proc.pid and i["uid"] == os.geteuid()
    assert httpx.get(f"{s.url}/api/v1/storage/local-copy").status_code == 401


def test_files_and_trees_copy_both_ways_on_the_same_host(srv: Any, tmp_path: Path) -> None:
    _, c, _ = srv
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom((3 << 20) + 17))
    up = c.volume_upload("v", big, "d/big.bin")
    assert (up.via, up.bytes, up.files) == ("same-host", big.stat().st_size, 1)
    down = c.volume_download("v", "d/big.bin", tmp_path / "back.bin")
    assert down.via == "same-host" and (tmp_path / "back.bin").read_bytes() == big.read_bytes()
    assert not (tmp_path / "back.bin.suanli-part").exists()

    tree = tmp_path / "tree"
    for i in range(450):  # three batches
        (tree / f"s{i % 7}").mkdir(parents=True, exist_ok=True)
        (tree / f"s{i % 7}" / f"f{i}.txt").write_text(f"file {i}\n" * (i % 5))
    (tree / "empty").mkdir()
    os.symlink("/etc/passwd", tree / "link")  # links are not copied in (as the HTTP path's tar skips them)
    got = c.volume_upload("v", tree, "t")
    assert got.via == "same-host" and got.bytes == sum(p.stat().st_size for p in tree.rglob("*.txt"))
    assert {e.name for e in c.volume_ls("v", "t")} == {*(f"s{i}" for i in range(7)), "empty"}
    out = c.volume_download("v", "t", tmp_path / "tree-back")
    assert out.via == "same-host"
    back = tmp_path / "tree-back"
    assert sorted(p.relative_to(back).as_posix() for p in back.rglob("*")) == sorted(
        p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.name != "link"
    )
    assert all((back / p.relative_to(tree)).read_bytes() == p.read_bytes() for p in tree.rglob("*.txt"))


def test_a_file_overwritten_on_the_same_host_is_not_given_the_old_files_hash(srv: Any, tmp_path: Path) -> None:
    """An HTTP copy leaves the file's hash beside it; a same-host copy over it must forget that hash."""
    _, c, _ = srv
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"first version\n")
    b.write_bytes(b"second, longer version\n")
    assert c.volume_upload("v", a, "h.txt", same_host=False).via == "http"
    assert c.volume_stat("v", "h.txt", sha256=True)["sha256"] == sha(a)
    assert c.volume_upload("v", b, "h.txt").via == "same-host"
    assert c.volume_stat("v", "h.txt", sha256=True)["sha256"] == sha(b)
    # and an HTTP copy out of the same-host copy still checks its hash end to end
    assert c.volume_download("v", "h.txt", tmp_path / "h", same_host=False).sha256 == sha(b)


def test_a_volume_out_of_room_is_refused_before_a_byte_is_copied(srv: Any, tmp_path: Path) -> None:
    _, c, _ = srv
    huge = tmp_path / "huge"
    with open(huge, "wb") as f:
        f.truncate(80 << 20)  # sparse: larger than the 64 MiB volume
    with pytest.raises(ApiError) as e:
        c.volume_upload("v", huge, "huge")
    assert e.value.status == 507
    assert all(x.name != "huge" for x in c.volume_ls("v", ""))


@pytest.mark.parametrize("kind", ["fifo", "directory", "write-only", "socket"])
def test_a_descriptor_that_is_not_a_readable_regular_file_is_refused(srv: Any, tmp_path: Path, kind: str) -> None:
    """A FIFO nobody writes to would block the server's copy forever; it must be refused, not read."""
    s, c, _ = srv
    info(c)  # its HTTP connection stays open: counted in `before`
    before = server_fds(s)
    if kind == "fifo":
        os.mkfifo(tmp_path / "fifo")
        fd = os.open(tmp_path / "fifo", os.O_RDWR)
    elif kind == "directory":
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    elif kind == "write-only":
        fd = os.open(tmp_path / "w", os.O_WRONLY | os.O_CREAT)
    else:
        sock = socket.socket()
        fd = os.dup(sock.fileno())
        sock.close()
    try:
        got = ask(c, {"op": "put-file"}, [fd])
    finally:
        os.close(fd)
    assert got["ok"] is False and got["status"] == 422 and got["detail"].startswith("fd: ")
    assert settles_at(s, before)


@pytest.mark.parametrize("how", [os.O_RDONLY, os.O_WRONLY | os.O_APPEND])
def test_a_copy_out_needs_a_file_opened_for_writing_not_appending(srv: Any, tmp_path: Path, how: int) -> None:
    _, c, _ = srv
    (tmp_path / "src").write_bytes(b"x" * 10)
    c.volume_upload("v", tmp_path / "src", "x")
    fd = os.open(tmp_path / "dst", how | os.O_CREAT, 0o600)
    try:
        got = ask(c, {"op": "get-file"}, [fd])
    finally:
        os.close(fd)
    assert got["status"] == 422 and "writing" in got["detail"]
    assert (tmp_path / "dst").read_bytes() == b""


def test_tokens_and_tenants_are_checked_as_over_http(srv: Any, tmp_path: Path) -> None:
    _, c, other = srv
    (tmp_path / "f").write_bytes(b"secret")
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        assert ask(c, {"op": "put-file"}, [fd], token="")["status"] == 401
        assert ask(c, {"op": "put-file"}, [fd], token="sl_" + "0" * 40)["status"] == 401
        assert ask(other, {"op": "put-file"}, [fd])["status"] == 404  # the stranger's view of c's volume
        assert ask(c, {"op": "delete"}, [fd])["status"] == 422
        assert ask(c, {"op": "put-file", "path": 7}, [fd])["detail"].startswith("path")
    finally:
        os.close(fd)
    with pytest.raises(ApiError) as e:  # the SDK, over the stranger's token, the same 404 as over HTTP
        other.volume_download("v", "x", tmp_path / "o", same_host=True)
    assert e.value.status == 404


@pytest.mark.parametrize("name", ["../escape", "a/../../escape", ".suanli-state", "a\\b"])
def test_a_tree_naming_a_path_out_of_the_tree_is_refused(srv: Any, tmp_path: Path, name: str) -> None:
    s, c, _ = srv
    (tmp_path / "f").write_bytes(b"payload")
    i = info(c)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect("\0" + i["socket"][1:])
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    with sock:
        ch.send(sock, {"op": "put-tree", "token": c.token, "volume": "v", "path": "evil"})
        ch.send(sock, {"op": "batch", "dirs": [], "files": [name]}, [fd])
        os.close(fd)
        ch.send(sock, {"op": "end"})
        got, _ = ch.recv(sock)
    assert got["status"] == 422 and got["detail"].startswith("tree: ")
    assert not list(s.home.rglob("escape")) and all(e.name != "evil" for e in c.volume_ls("v", ""))


def test_more_descriptors_than_a_message_may_carry_drop_the_connection_and_leak_none(srv: Any, tmp_path: Path) -> None:
    s, c, _ = srv
    (tmp_path / "f").write_bytes(b"x")
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    i = info(c)
    before = server_fds(s)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect("\0" + i["socket"][1:])
    with sock:
        data = struct.pack("!I", 2) + b"{}"
        socket.send_fds(sock, [data], [fd] * 2)  # the first message may carry one file at most
        try:
            got = sock.recv(100)
        except ConnectionResetError:  # closed with our bytes unread
            got = b""
        assert got == b""  # dropped, no answer
    os.close(fd)
    assert settles_at(s, before)


def test_one_local_user_holds_at_most_two_copies_and_the_third_goes_over_http(srv: Any, tmp_path: Path) -> None:
    _, c, _ = srv
    i = info(c)
    held = []
    for _ in range(2):
        sk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sk.connect("\0" + i["socket"][1:])
        held.append(sk)
    try:
        third = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        third.connect("\0" + i["socket"][1:])
        with third:
            got, _ = ch.recv(third)
        assert got["status"] == 503
        (tmp_path / "f").write_bytes(b"while busy")
        assert c.volume_upload("v", tmp_path / "f", "busy.txt").via == "http"
    finally:
        for sk in held:
            sk.close()


def test_a_socket_whose_peer_is_not_the_announced_process_is_never_sent_a_token(srv: Any, tmp_path: Path) -> None:
    _, c, _ = srv
    i = info(c)
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.bind("\0suanli-copy-impostor-" + os.urandom(4).hex())
    impostor.listen(1)
    with impostor:
        name = impostor.getsockname()
        fake = lc.Channel("@" + name[1:].decode(), i["pid"], i["uid"], c.token or "")
        with pytest.raises(lc.Busy):  # our own pid is the peer here, not the server's
            lc.connect(fake)
        impostor.settimeout(0.2)
        conn, _ = impostor.accept()
        with conn:
            conn.settimeout(5)
            assert conn.recv(4096) == b""  # closed with nothing sent: no token


def test_links_in_the_volume_are_never_followed_on_the_way_out(srv: Any, tmp_path: Path) -> None:
    """A workload may plant links in its volume; the copy out reports them as links and the client makes only
    those that stay inside the copy."""
    s, c, _ = srv
    (tmp_path / "f").write_text("inside")
    c.volume_upload("v", tmp_path / "f", "linked/f.txt")
    data = next(s.home.glob("volumes/*/vols/*/data"))
    os.symlink("/etc", data / "linked" / "etc")
    os.symlink("f.txt", data / "linked" / "ok")
    got = c.volume_download("v", "linked", tmp_path / "out")
    assert got.via == "same-host"
    out = tmp_path / "out"
    assert os.readlink(out / "ok") == "f.txt" and (out / "ok").read_text() == "inside"
    assert not os.path.lexists(out / "etc")


def test_the_loopback_rule_keeps_remote_servers_on_http() -> None:
    assert (
        lc.is_loopback("http://127.0.0.1:8000")
        and lc.is_loopback("http://localhost")
        and lc.is_loopback("http://[::1]:9")
    )
    assert not lc.is_loopback("https://gpu.example.com") and not lc.is_loopback("http://10.0.0.5:8000")
    c = Client("https://gpu.example.com", "sl_x")
    assert c._same_host(None) is None  # never even asks such a server


def test_a_server_with_same_host_copies_off_says_404_and_copies_go_over_http(tmp_path: Path) -> None:
    with live_server(tmp_path / "home", f"sqlite+pysqlite:///{tmp_path / 'db'}", env={"SUANLI_LOCAL_COPY": "0"}) as s:
        with httpx.Client(base_url=s.url) as http:
            t = signup(http, "off@example.com")
        with Client(s.url, t.token) as c:
            c.volume_create("v", "8Mi")
            with pytest.raises(ApiError) as e:
                info(c)
            assert e.value.status == 404
            (tmp_path / "f").write_bytes(b"over http")
            assert c.volume_upload("v", tmp_path / "f", "f").via == "http"
            with pytest.raises(ApiError):
                c.volume_upload("v", tmp_path / "f", "g", same_host=True)


def test_verify_compares_both_sides_hashes_after_a_same_host_copy(srv: Any, tmp_path: Path, monkeypatch: Any) -> None:
    _, c, _ = srv
    f = tmp_path / "v.bin"
    f.write_bytes(os.urandom(1 << 20))
    up = c.volume_upload("v", f, "verified.bin", verify=True)
    assert (up.via, up.sha256) == ("same-host", sha(f))
    down = c.volume_download("v", "verified.bin", tmp_path / "back", verify=True)
    assert (down.via, down.sha256) == ("same-host", sha(f))
    assert c.volume_upload("v", f, "unverified.bin").sha256 == ""  # no hash unless asked
    real = c.volume_stat
    monkeypatch.setattr(c, "volume_stat", lambda *a, **k: {**real(*a, **k), "sha256": "0" * 64})
    with pytest.raises(ApiError, match="hashes to"):  # a disagreement is an error, not a silent pass
        c.volume_upload("v", f, "verified.bin", verify=True)


def test_a_caller_from_another_host_is_not_told_the_socket_or_the_servers_pid_and_uid(
    tmp_path: Path, cheap_password_hashing: None
) -> None:
    """Review: the announcement told any remote caller the server's pid and uid (whether it runs as root)."""
    from fastapi.testclient import TestClient

    from suanli.api.app import create_app
    from tests.control_plane import settings

    for where, status in ((("203.0.113.9", 50000), 404), (("127.0.0.1", 50000), 200)):
        home = tmp_path / str(status)
        app = create_app(settings(home / "home", f"sqlite+pysqlite:///{home}.db"))
        with TestClient(app, client=where) as api:
            t = signup(api, f"caller-{status}@example.com")
            r = api.get("/api/v1/storage/local-copy", headers=t.headers)
            assert r.status_code == status, r.text
            assert ("pid" in r.json()) is (status == 200)


def test_a_server_that_cannot_open_the_socket_still_starts_and_copies_over_http(
    tmp_path: Path, cheap_password_hashing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from suanli.api import local_copy
    from suanli.api.app import create_app
    from tests.control_plane import settings

    def no_socket(self: object, srv: object) -> None:
        raise PermissionError(13, "abstract sockets are not allowed here")

    monkeypatch.setattr(local_copy.LocalCopyServer, "__init__", no_socket)
    app = create_app(settings(tmp_path / "home", f"sqlite+pysqlite:///{tmp_path / 'db'}"))
    with TestClient(app, client=("127.0.0.1", 50000)) as api:
        t = signup(api, "nosocket@example.com")
        assert api.get("/api/v1/storage/local-copy", headers=t.headers).status_code == 404


def _op(token: str, op: str, volume: str, path: str, tmp_path: Path, org: str | None = None, **q: Any) -> dict:
    """One socket request of `op` as the holder of `token` (a file passed where the op takes one)."""
    c = q.pop("c")
    fds: list[int] = []
    if op == "put-file":
        (tmp_path / "payload").write_bytes(b"theirs now")
        fds = [os.open(tmp_path / "payload", os.O_RDONLY)]
    elif op == "get-file":
        fds = [os.open(tmp_path / "stolen", os.O_WRONLY | os.O_CREAT, 0o600)]
    try:
        return ask(c, {"op": op, "volume": volume, "path": path, "org": org}, fds, token=token)
    finally:
        ch.close_all(fds)


@pytest.mark.parametrize("op", ["put-file", "get-file", "put-tree", "get-tree"])
def test_a_stranger_gets_404_from_every_op_and_nothing_of_the_volume(srv: Any, tmp_path: Path, op: str) -> None:
    _, c, other = srv
    (tmp_path / "secret").write_bytes(b"owner's secret")
    c.volume_upload("v", tmp_path / "secret", "dir/secret.txt")
    for ref, org in (("v", None), ("v", c.volume("v").org_id), (c.volume("v").id, None)):
        got = _op(other.token, op, ref, "dir/secret.txt" if op.endswith("file") else "dir", tmp_path, org, c=c)
        assert got["ok"] is False and got["status"] == 404, got
    assert not (tmp_path / "stolen").exists() or (tmp_path / "stolen").read_bytes() == b""
    assert c.volume_stat("v", "dir/secret.txt", sha256=True)["sha256"] == sha(tmp_path / "secret")


def test_a_team_viewer_reads_but_never_writes_and_a_read_only_volume_takes_nothing(srv: Any, tmp_path: Path) -> None:
    from tests.control_plane import admin_token, bearer, join

    s, c, _ = srv
    with httpx.Client(base_url=s.url) as http:
        owner, viewer = signup(http, "lab-owner@example.com"), signup(http, "lab-viewer@example.com")
        team = http.post("/api/v1/orgs", json={"name": "lab-local"}, headers=owner.headers).json()["id"]
        join(http, owner, team, viewer, "viewer")
        r = http.post(f"/api/v1/admin/orgs/{team}/transactions", json={"kind": "topup", "amount": "10"},
                      headers=bearer(admin_token(http)))  # fmt: skip
        assert r.status_code == 201, r.text
    with Client(s.url, owner.token) as o, Client(s.url, viewer.token) as v:
        o.volume_create("shared", "8Mi", org=team)
        (tmp_path / "a").write_bytes(b"the team's")
        assert o.volume_upload("shared", tmp_path / "a", "a.txt", org=team).via == "same-host"
        got = v.volume_download("shared", "a.txt", tmp_path / "read", org=team)
        assert got.via == "same-host" and (tmp_path / "read").read_bytes() == b"the team's"
        for op in ("put-file", "put-tree"):
            got = _op(viewer.token, op, "shared", "b.txt" if op == "put-file" else "t", tmp_path, team, c=c)
            assert got["status"] == 403 and "viewer" in got["detail"], got
        from sqlalchemy import create_engine, text

        engine = create_engine(f"sqlite+pysqlite:///{s.home.parent / 'db'}")
        with engine.begin() as db:  # the org's balance ran out past the grace: the sweep made it read-only
            db.execute(text("UPDATE volumes SET state = 'read-only' WHERE name = 'shared'"))
        engine.dispose()
        got = _op(owner.token, "put-file", "shared", "c.txt", tmp_path, team, c=c)
        assert got["status"] == 402 and "read-only" in got["detail"], got
        assert [e.name for e in o.volume_ls("shared", "", org=team)] == ["a.txt"]
