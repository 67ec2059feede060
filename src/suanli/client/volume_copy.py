"""The SDK's copying of files in and out of a volume: over HTTP, streamed (never read whole into memory),
resumable and checked by sha256; on the server's own host, open files passed to the server (`client.local_copy`).
A mixin of `suanli.client.Client`, through `VolumeCalls`."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from suanli.client.models import load
from suanli.client.requests import _seg
from suanli.client.tree_writer import Refused, TreeWriter

if TYPE_CHECKING:
    import httpx

CHUNK = 1 << 20  # a read or write of one chunk
PART = ".suanli-part"  # a download under way, beside its destination: resumed from its size
# An upload's answer comes once the server has the whole body and has committed it (hashed, moved into the tree),
# which may take minutes for a large one: the wait for it is bounded, but long. Downloads wait between reads as long as
# the client's own timeout says (the server sends as it reads). No call waits for good: a stalled server held
# `suanli volumes cp` for ever.
UPLOAD_TIMEOUT_S = {"connect": 30.0, "read": 600.0, "write": 300.0, "pool": 30.0}
Progress = Callable[[int], None]  # called with each number of bytes moved


@dataclass(frozen=True)
class Copied:
    path: str
    bytes: int
    files: int
    sha256: str  # "" for a same-host copy (a kernel copy: no byte crossed a network) and for a tree out
    resumed_from: int = 0
    via: str = "http"  # or "same-host": open files passed to the server over its Unix socket


def _q(org: str | None, **more: Any) -> dict[str, Any]:
    return {k: v for k, v in {"org": org, **more}.items() if v is not None}


def file_sha256(path: Path, upto: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = upto
        while chunk := f.read(CHUNK if left is None else min(CHUNK, left)):
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
                if left <= 0:
                    break
    return h.hexdigest()


def tar_stream(top: Path) -> Iterator[bytes]:
    """A plain tar of a local directory (files and directories; links are skipped: a volume takes none)."""
    buf = _Buffer()
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for dirpath, dirs, files in os.walk(top):
            dirs.sort()
            rel = os.path.relpath(dirpath, top)
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                info = tar.gettarinfo(path, name if rel == "." else f"{rel}/{name}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(path, "rb") as f:
                    tar.addfile(info, f)
                yield from buf.take()
            for name in dirs:
                if not os.path.islink(os.path.join(dirpath, name)) and not os.listdir(os.path.join(dirpath, name)):
                    info = tarfile.TarInfo(name if rel == "." else f"{rel}/{name}")
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
    yield from buf.take()


class _Buffer(io.RawIOBase):
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.parts.append(bytes(b))
        return len(b)

    def take(self) -> list[bytes]:
        out, self.parts = self.parts, []
        return out


def _counted(chunks: Iterator[bytes], progress: Progress | None) -> Iterator[bytes]:
    for c in chunks:
        if progress is not None:
            progress(len(c))
        yield c


def _file_chunks(path: Path, offset: int) -> Iterator[bytes]:
    with open(path, "rb") as f:
        f.seek(offset)
        while chunk := f.read(CHUNK):
            yield chunk


class VolumeCopyCalls:
    if TYPE_CHECKING:  # provided by `Client` and `VolumeCalls`
        token: str | None
        server: str
        _http: httpx.Client

        def call(self, method: str, path: str, body: Any = None, *, params: Any = None, auth: bool = True) -> Any: ...
        def volume_stat(self, ref: str, path: str, org: str | None = None, sha256: bool = False) -> dict[str, Any]: ...

    def _stream(self, method: str, path: str, params: dict[str, Any], content: Any = None,
                more: dict[str, str] | None = None) -> httpx.Response:  # fmt: skip
        from suanli.client.client import API, _error

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        headers.update(more or {})
        if content is not None:
            headers["Content-Type"] = "application/octet-stream"
        r = self._http.request(method, f"{API}{path}", params=params, content=content, headers=headers,
                               timeout=_upload_timeout())  # fmt: skip
        if r.is_error:
            raise _error(r)
        return r

    def _same_host(self, same_host: bool | None) -> Any:
        """The server's same-host copy channel when this process may use it (`same_host` None: when the server's
        address is a loopback one and the server offers it; True: required; False: never)."""
        from suanli.client import ApiError
        from suanli.client import local_copy as lc

        if same_host is False or (same_host is None and not lc.is_loopback(self.server)) or not self.token:
            return None
        cached = self.__dict__.get("_local_copy")
        if cached is None:
            try:
                got = self.call("GET", "/storage/local-copy")
                cached = lc.Channel(str(got["socket"]), int(got["pid"]), int(got["uid"]), self.token)
            except ApiError as e:
                if e.status != 404:
                    raise
                cached = False
            self.__dict__["_local_copy"] = cached
        if cached is False and same_host:
            raise ApiError(404, "this server offers no same-host copies (local_copy is off)")
        return cached or None

    def _copy_same_host(self, same_host: bool | None, verify: bool, fn: Callable[..., dict[str, Any]], ref: str,
                        org: str | None, path: str, local: Path, progress: Progress | None) -> Copied | None:  # fmt: skip
        """The copy through the same-host channel; None where there is none, or the server is busy (then HTTP).
        With `verify`, a file's sha256 is read on both sides afterwards and must agree."""
        from suanli.client import ApiError
        from suanli.client import local_copy as lc

        chan = self._same_host(same_host)
        if chan is None:
            return None
        try:
            out = fn(chan, ref, org, path, local, progress)
        except lc.Busy as e:
            if same_host:
                raise ApiError(503, f"no same-host copy: {e}") from None
            return None
        digest = ""
        if verify and int(out["files"]) == 1 and local.is_file():
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1) as pool:
                theirs = pool.submit(self.volume_stat, ref, path, org, True)  # both hashed at once
                digest = file_sha256(local)
                want = theirs.result()["sha256"]
            if digest != want:
                raise ApiError(0, f"{path}: the copy hashes to {digest}, the volume's file to {want}; copy again")
        return Copied(str(out["path"]), int(out["bytes"]), int(out["files"]), digest, 0, "same-host")

    def volume_upload(self, ref: str, local: str | Path, path: str, org: str | None = None,
                      progress: Progress | None = None, resume: bool = True,
                      same_host: bool | None = None, verify: bool = False) -> Copied:  # fmt: skip
        """Copy a local file (or directory: one tar stream, its sha256 checked before anything is moved in) to
        `path` in the volume. A file resumes where an interrupted upload of the same path stopped; its sha256 is
        checked before it replaces anything. On the server's own host (`same_host`, see `_same_host`) the open
        files are passed to the server instead, which copies them in the kernel as `cp` would (no hash in flight:
        `verify` reads a file's sha256 on both sides afterwards)."""
        from suanli.client import local_copy as lc

        src = Path(local)
        fast = self._copy_same_host(same_host, verify, lc.put_tree if src.is_dir() else lc.put_file, ref, org, path,
                                    src, progress)  # fmt: skip
        if fast is not None:
            return fast
        if src.is_dir():
            digest = hashlib.sha256()
            for chunk in tar_stream(src):
                digest.update(chunk)
            body = _counted(tar_stream(src), progress)
            r = self._stream("PUT", f"/volumes/{_seg(ref)}/tree", _q(org, path=path, sha256=digest.hexdigest()), body)
            return load(Copied, r.json())
        size = src.stat().st_size
        offset = 0
        if resume:
            got = self.call("GET", f"/volumes/{_seg(ref)}/partial", params=_q(org, path=path))
            offset = int(got["offset"]) if 0 < int(got["offset"]) <= size else 0
        if progress is not None and offset:
            progress(offset)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            mine = pool.submit(file_sha256, src)  # hashed beside the send (hashlib lets go of the GIL)
            params = _q(org, path=path, offset=offset, hold="true")
            body = _counted(_file_chunks(src, offset), progress)
            headers = {"Content-Length": str(size - offset)}
            theirs = self._stream("PUT", f"/volumes/{_seg(ref)}/files", params, body, headers).json()
            sha = mine.result()
        del theirs  # the server compares its hash with ours at the commit (422 naming both, the copy dropped)
        r = self.call("POST", f"/volumes/{_seg(ref)}/commit", params=_q(org, path=path, sha256=sha))
        return load(Copied, {**r, "resumed_from": offset})

    def volume_download(self, ref: str, path: str, local: str | Path, org: str | None = None,
                        progress: Progress | None = None, same_host: bool | None = None,
                        verify: bool = False) -> Copied:  # fmt: skip
        """Copy a file (or a directory, as a tar unpacked here) of the volume to `local`. A file is written to
        `local` + ".suanli-part" first, resumed from its size after a break, hashed as it arrives, and its sha256
        checked against the server's (asked for at the same time) before it takes `local`'s name. On the server's
        own host the files are created here and passed to the server, which fills them in the kernel."""
        from suanli.client import local_copy as lc

        info = self.volume_stat(ref, path, org)
        dest = Path(local)
        if info["kind"] in ("dir", "file"):
            fast = self._copy_same_host(same_host, verify, lc.get_tree if info["kind"] == "dir" else lc.get_file, ref,
                                        org, path, dest, progress)  # fmt: skip
            if fast is not None:
                return fast
        if info["kind"] == "dir":
            dest.mkdir(parents=True, exist_ok=True)
            with self._http.stream("GET", f"/api/v1/volumes/{_seg(ref)}/tree", params=_q(org, path=path),
                                   headers={"Authorization": f"Bearer {self.token}"}) as r:  # fmt: skip
                if r.is_error:
                    from suanli.client.client import _error

                    r.read()
                    raise _error(r)
                raw = _Reader(_counted(r.iter_raw(CHUNK), progress))
                n = 0
                with tarfile.open(fileobj=raw, mode="r|") as tar, TreeWriter(dest) as tree:  # type: ignore[call-overload]
                    for m in tar:
                        n += _write_entry(tree, tar, m)
            return Copied(path, raw.count, n, "")
        if info["kind"] != "file":
            from suanli.client import ApiError

            raise ApiError(422, f"path: {path} is a {info['kind']}, not a file or directory")
        from concurrent.futures import ThreadPoolExecutor

        part = dest.with_name(dest.name + PART)
        have = _part_size(part)
        if have > info["size"]:
            part.unlink()
            have = 0
        with ThreadPoolExecutor(1) as pool:
            theirs = pool.submit(self.volume_stat, ref, path, org, True)  # the server hashes while it sends
            h = hashlib.sha256()
            if have:
                with os.fdopen(_open_part(part, os.O_RDONLY), "rb") as f:
                    while chunk := f.read(CHUNK):
                        h.update(chunk)
                if progress is not None:
                    progress(have)
            headers = {"Authorization": f"Bearer {self.token}"}
            if have:
                headers["Range"] = f"bytes={have}-"
            if have < info["size"] or not have:  # all of it here already (a range from the end is 416): hash only
                h = self._fetch(ref, path, org, headers, part, h, progress, info["size"], have)
            want = theirs.result()["sha256"]
        got = h.hexdigest()
        if got != want:
            part.unlink()
            from suanli.client import ApiError

            raise ApiError(0, f"{path}: the copy hashes to {got}, the volume's file to {want}; copy again")
        os.replace(part, dest)
        return Copied(path, info["size"], 1, got, have)

    def _fetch(self, ref: str, path: str, org: str | None, headers: dict[str, str], part: Path, h: Any,
               progress: Progress | None, size: int, have: int) -> Any:  # fmt: skip
        """GET the file (from the range in `headers`) onto `part`, hashing it with `h`; the hash of the whole file
        (a new one where the server sent all of it rather than the range). No more bytes than the `size` the server
        announced are written: an endless answer would fill the disk."""
        from suanli.client import ApiError

        with self._http.stream("GET", f"/api/v1/volumes/{_seg(ref)}/files", params=_q(org, path=path),
                               headers=headers) as r:  # fmt: skip
            if r.is_error:
                from suanli.client.client import _error

                r.read()
                raise _error(r)
            ranged = r.status_code == 206
            if not ranged:
                h = hashlib.sha256()
            most = size - have if ranged else size
            hashing = _Hasher(h)  # beside the writes: hashlib lets go of the GIL
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if ranged else os.O_TRUNC)
            try:
                with os.fdopen(_open_part(part, flags), "wb") as out:
                    for chunk in r.iter_raw():  # as read: re-chunking would copy
                        most -= len(chunk)
                        if most < 0:
                            raise ApiError(0, f"{path}: the server sent more than the {size} bytes it announced")
                        out.write(chunk)
                        hashing.add(chunk)
                        if progress is not None:
                            progress(len(chunk))
            finally:
                hashing.close()
        return h


def _upload_timeout() -> Any:
    import httpx

    return httpx.Timeout(**UPLOAD_TIMEOUT_S)


def _part_size(part: Path) -> int:
    """The bytes a download under way has: 0 if none. Only a regular file of our own with one name counts; anything
    else there (a link another local user planted beside the destination, to have the download written through it
    into a file of the caller's) stops the copy."""
    try:
        st = os.lstat(part)
    except FileNotFoundError:
        return 0
    _check_part(part, st)
    return st.st_size


def _open_part(part: Path, flags: int) -> int:
    fd = os.open(part, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _check_part(part, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_part(part: Path, st: os.stat_result) -> None:
    import stat as stat_mod

    from suanli.client import ApiError

    if not stat_mod.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
        raise ApiError(0, f"{part}: not a download of ours (a link, or not a file of yours); remove it and copy again")


def _write_entry(tree: TreeWriter, tar: tarfile.TarFile, m: tarfile.TarInfo) -> int:
    """One entry of a downloaded tree, written without following a link (`client/tree_writer.py`, not tarfile's
    own extraction); 1 when something was made. A link out of the copy is left out; an entry whose way is blocked
    by a link or a file stops the copy, naming it."""
    from suanli.client import ApiError

    try:
        if m.isdir():
            tree.mkdir(m.name)
        elif m.issym():
            return int(tree.link(m.name, m.linkname))
        elif m.isreg():
            src = tar.extractfile(m)
            assert src is not None
            with os.fdopen(tree.create(m.name, m.mode), "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)
                os.utime(out.fileno(), (m.mtime, m.mtime))
        else:
            return 0  # the server sends only directories, files and links
    except Refused as e:
        raise ApiError(0, f"{e}; the copy stopped there") from None
    return 1


class _Reader(io.RawIOBase):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.cur, self.pos, self.count = chunks, memoryview(b""), 0, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while self.pos >= len(self.cur):
            try:
                self.cur, self.pos = memoryview(next(self.chunks)), 0
            except StopIteration:
                return 0
            self.count += len(self.cur)
        n = min(len(b), len(self.cur) - self.pos)
        b[:n] = self.cur[self.pos : self.pos + n]
        self.pos += n
        return n


class _Hasher:
    """Feeds a hash from a thread of its own, a few MiB at a time, so hashing overlaps receiving and writing."""

    def __init__(self, h: Any) -> None:
        import queue
        import threading

        self.h, self.batch, self.held = h, [], 0
        self.q: queue.Queue[list[bytes] | None] = queue.Queue(maxsize=4)  # bounded: memory stays a few batches
        self.t = threading.Thread(target=self._run, name="sha256", daemon=True)
        self.t.start()

    def _run(self) -> None:
        while (batch := self.q.get()) is not None:
            for chunk in batch:
                self.h.update(chunk)

    def add(self, chunk: bytes) -> None:
        self.batch.append(chunk)
        self.held += len(chunk)
        if self.held >= 4 * CHUNK:
            self.q.put(self.batch)
            self.batch, self.held = [], 0

    def close(self) -> None:
        """Hash what is left and wait for the thread (the hash is whole on return)."""
        self.q.put(self.batch)
        self.q.put(None)
        self.t.join()
