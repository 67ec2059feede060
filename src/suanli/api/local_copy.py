"""Same-host copies: a Unix socket beside the HTTP server through which a tenant on this host passes open files.

`suanli volumes cp` on the server's own host would otherwise push every byte through HTTP on loopback and hash
it twice (a fifth of `cp`'s speed for one large file). Here the tenant's process opens its own files (its own
permissions decide what it can read or create) and passes the descriptors (`storage.fd_channel`); the server
checks the caller's token and role exactly as the HTTP routes do (`control.storage.volume_files`) and copies in
the kernel (`storage.volume_local`). The server never hands a descriptor of its own to a tenant.

The socket is in the abstract namespace under a random name, one per server process, announced only to
authenticated callers (`GET /storage/local-copy`, with the process's pid and uid, which the client checks against
the socket's peer credentials before it sends a token). A connection serves one copy. At most `SLOTS` copies run
at once, `PER_UID` for one local user; each message is bounded (`fd_channel`) and a silent peer is dropped after
`IDLE_S`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import secrets
import socket
import struct
import threading
import time
from typing import Any

from suanli.api.deps import Server
from suanli.control.accounts import accounts
from suanli.control.accounts.accounts import Principal
from suanli.control.errors import Invalid, ServiceError, Unauthorized
from suanli.control.ids import utcnow
from suanli.control.storage import volume_files as files
from suanli.control.storage import volumes
from suanli.storage import fd_channel as ch
from suanli.storage import volume_local as local
from suanli.storage import volumes as store

log = logging.getLogger("suanli.local_copy")
SLOTS = 8
PER_UID = 2
IDLE_S = 60.0
# Descriptors one copy may hold at once: a batch received (up to MAX_FDS + 3 before it is refused), a batch going
# out (200), the directories a walk has open (one a level, at most store.MAX_WALK_DEPTH + 1), its own.
FDS_PER_COPY = 2 * (ch.MAX_FDS + 3) + store.MAX_WALK_DEPTH + 100
ACCEPT_BACKOFF_S = 0.1  # a failed accept waits this long before the next
MAX_DIRS = 10_000  # directories one batch of a tree may name
OPS = ("put-file", "get-file", "put-tree", "get-tree")


class LocalCopyServer:
    def __init__(self, srv: Server) -> None:
        self.srv = srv
        self.name = "suanli-copy-" + secrets.token_hex(16)
        _add_descriptors(SLOTS * FDS_PER_COPY)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.bind("\0" + self.name)
        self.sock.listen(64)
        self.slots = threading.BoundedSemaphore(SLOTS)
        self.lock = threading.Lock()
        self.by_uid: dict[int, int] = {}
        self.closed = False
        self.thread = threading.Thread(target=self._accept, name="local-copy", daemon=True)
        self.thread.start()

    def info(self) -> dict[str, Any]:
        return {"socket": "@" + self.name, "pid": os.getpid(), "uid": os.geteuid()}

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(timeout=5)

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                if self.closed:
                    return
                time.sleep(ACCEPT_BACKOFF_S)  # out of descriptors (EMFILE) fails at once: no spinning on it
                continue
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
            if not self._take(uid):
                with contextlib.suppress(OSError):
                    ch.send(conn, {"ok": False, "status": 503, "detail": "busy: too many same-host copies; use HTTP"})
                conn.close()
                continue
            try:
                threading.Thread(target=self._serve, args=(conn, uid), name="local-copy-conn", daemon=True).start()
            except RuntimeError:  # no thread to be had: this copy goes over HTTP, the loop and the slot stay
                self._give(uid)
                conn.close()

    def _take(self, uid: int) -> bool:
        with self.lock:
            if self.by_uid.get(uid, 0) >= PER_UID or not self.slots.acquire(blocking=False):
                return False
            self.by_uid[uid] = self.by_uid.get(uid, 0) + 1
            return True

    def _give(self, uid: int) -> None:
        with self.lock:
            self.by_uid[uid] -= 1
            if not self.by_uid[uid]:
                del self.by_uid[uid]
            self.slots.release()

    def _serve(self, conn: socket.socket, uid: int) -> None:
        with conn:
            self._answer(conn, uid)

    def _answer(self, conn: socket.socket, uid: int) -> None:
        fds: list[int] = []
        try:
            conn.settimeout(IDLE_S)
            msg, fds = ch.recv(conn, max_fds=1)
            reply: dict[str, Any] = {"ok": True, **Copy(self.srv, conn, msg, fds).run()}
        except ServiceError as e:
            reply = {"ok": False, "status": e.status, "detail": e.message}
        except (ch.ChannelError, TimeoutError, ConnectionError):
            return
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                log.warning("same-host copy failed: %s", e)
                reply = {"ok": False, "status": 500, "detail": "the copy failed on the server"}
            else:
                reply = {"ok": False, "status": 507, "detail": "the server's disk is full"}
        finally:
            ch.close_all(fds)
            self._give(uid)
        with contextlib.suppress(OSError):
            ch.send(conn, reply)


def _add_descriptors(n: int) -> None:
    """Raise this process's soft limit on open files by `n` (up to its hard limit): the copies' descriptors come on
    top of what the HTTP server uses, so that copies held open cannot leave it none to accept or answer with."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = soft + n if hard == resource.RLIM_INFINITY else min(hard, soft + n)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if hard != resource.RLIM_INFINITY and hard < n + 1024:  # not room for the copies and a small server beside them
        log.warning("same-host copies may hold %d descriptors; the hard limit on open files is %d", n, hard)


def _text(msg: dict[str, Any], key: str, most: int, optional: bool = False) -> str | None:
    v = msg.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, str) or len(v) > most or "\0" in v:
        raise Invalid(f"{key}: must be a string of at most {most} characters")
    return v


class Copy:
    """One copy a connection asked for; `run` returns what the reply says."""

    def __init__(self, srv: Server, conn: socket.socket, msg: dict[str, Any], fds: list[int]) -> None:
        self.srv, self.conn, self.msg, self.fds = srv, conn, msg, fds
        self.now = utcnow()
        self.lim = volumes.Limits.of(srv.settings)

    def run(self) -> dict[str, Any]:
        op = self.msg.get("op")
        if op not in OPS:
            raise Invalid(f"op: must be one of {', '.join(OPS)}")
        who = self._who()
        ref = _text(self.msg, "volume", 300)
        org = _text(self.msg, "org", 300, optional=True)
        path = _text(self.msg, "path", 4096)
        assert ref is not None and path is not None
        if op in ("put-file", "get-file") and len(self.fds) != 1:
            raise Invalid("fd: send exactly one open file with this request")
        if op in ("put-tree", "get-tree") and self.fds:
            raise Invalid("fd: this request takes no file; the tree's come in batches")
        try:
            if op == "put-file":
                return self._put_file(who, ref, org, path)
            if op == "get-file":
                return self._get_file(who, ref, org, path)
            if op == "put-tree":
                return self._put_tree(who, ref, org, path)
            return self._get_tree(who, ref, org, path)
        except ch.BadDescriptor as e:
            raise Invalid(f"fd: {e}") from None
        except store.TooDeep as e:  # a workload may nest directories deeper than a walk descends
            raise Invalid(str(e)) from None

    def _who(self) -> Principal:
        token = self.msg.get("token")
        if not isinstance(token, str) or not token or len(token) > 512:
            raise Unauthorized("token: send the API token this copy runs as")
        accounts.check_token_format(token)
        with self.srv.db.read() as s:
            return accounts.authenticate(s, token, self.now)

    def _progress(self, n: int) -> None:
        ch.send(self.conn, {"op": "progress", "bytes": n})

    def _put_file(self, who: Principal, ref: str, org: str | None, path: str) -> dict[str, Any]:
        rel = files.clean(path, allow_root=False)
        ch.check_fd(self.fds[0], write=False)
        t = files.for_write(self.srv.db, who, ref, org, self.lim, self.now)
        assert t.claim is not None
        try:
            n, _ = local.put_file(t.paths, rel, self.fds[0], t.claim, self._progress)
        except store.OverSize as e:
            raise files.room_error(t, e) from None
        except store.VolumeFileError as e:
            raise Invalid(f"path: {e}") from None
        finally:
            files.done(t)  # its claim on the room ends
        files.wrote(self.srv.db, t, self.now)
        return {"path": rel, "bytes": n, "files": 1}

    def _get_file(self, who: Principal, ref: str, org: str | None, path: str) -> dict[str, Any]:
        rel = files.clean(path, allow_root=False)
        ch.check_fd(self.fds[0], write=True)
        t = files.for_read(self.srv.db, who, ref, org, self.lim)
        try:
            src, st = store.open_file(t.paths.data, rel)
        except store.VolumeFileError as e:
            raise Invalid(f"path: {e}") from None
        try:
            n = ch.copy(src, self.fds[0], st.st_size, step=self._progress)
            if os.fstat(self.fds[0]).st_size > n:  # a file that was longer: cut to the copy. Not emptied first:
                os.ftruncate(self.fds[0], n)  # ext4 flushes a file emptied by truncate when it is closed
        finally:
            os.close(src)
        return {"path": rel, "bytes": n, "files": 1}

    def _put_tree(self, who: Principal, ref: str, org: str | None, path: str) -> dict[str, Any]:
        rel = files.clean(path)
        t = files.for_write(self.srv.db, who, ref, org, self.lim, self.now)
        assert t.claim is not None
        try:
            tree = local.TreeIn(t.paths, rel, t.claim, self.lim.max_files)
        except BaseException:
            files.done(t)
            raise
        n = 0
        try:
            while True:
                msg, fds = ch.recv(self.conn)
                try:
                    if msg.get("op") == "end":
                        break
                    dirs, names = msg.get("dirs", []), msg.get("files", [])
                    if msg.get("op") != "batch" or not _strings(dirs, MAX_DIRS) or not _strings(names, ch.MAX_FDS):
                        raise Invalid("batch: must be {op: batch, dirs: [path…], files: [path…]} with a file each")
                    n += tree.add(dirs, names, fds)
                finally:
                    ch.close_all(fds)
            tree.finish()
        except store.OverSize as e:
            raise files.room_error(t, e) from None
        except store.VolumeFileError as e:
            raise Invalid(f"tree: {e}") from None
        finally:
            tree.close()
            files.done(t)  # merged or not: its claim on the room ends
        files.remeasure(self.srv.db, t, self.now)
        return {"path": rel, "bytes": n, "files": tree.entries}

    def _get_tree(self, who: Principal, ref: str, org: str | None, path: str) -> dict[str, Any]:
        rel = files.clean(path)
        t = files.for_read(self.srv.db, who, ref, org, self.lim)
        if store.kind(t.paths.data, rel) != "dir":
            raise Invalid(f"path: {rel or '/'} is not a directory")
        n = count = 0
        for b in local.tree_out(t.paths.data, rel):
            try:
                ch.send(self.conn, {"op": "batch", "dirs": b.dirs, "links": b.links, "files": b.files})
                count += len(b.dirs) + len(b.links)
                if not b.files:
                    continue
                msg, fds = ch.recv(self.conn)
                try:
                    if msg.get("op") != "fds" or len(fds) != len(b.files):
                        raise Invalid("fds: send one open file for each file of the batch, in its order")
                    for src, (_, size, _), dst in zip(b.fds, b.files, fds, strict=True):
                        ch.check_fd(dst, write=True)
                        n += ch.copy(src, dst, size)
                        count += 1
                finally:
                    ch.close_all(fds)
            finally:
                b.close()
        ch.send(self.conn, {"op": "end"})
        return {"path": rel, "bytes": n, "files": count}


def _strings(v: object, most: int) -> bool:
    return isinstance(v, list) and len(v) <= most and all(isinstance(x, str) for x in v)
