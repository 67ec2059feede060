"""Moving files in and out of a local volume's tree: uploads written to a partial copy beside the tree (resumable,
their sha256 checked before they replace anything), a tar stream unpacked beside it and merged in, files read a
range at a time, a directory streamed out as a tar. Everything goes through `storage.volumes`' descriptors: no link
in the tree is followed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from suanli.storage.archive import Limits, TooLarge, footprint, remove_tree, unpack
from suanli.storage.volume_room import Claim
from suanli.storage.volumes import (
    _DIR_FLAGS,
    CHUNK,
    MAX_WALK_DEPTH,
    OverSize,
    Paths,
    TooDeep,
    VolumeFileError,
    _key,
    _split,
    fwalk,
    give,
    load_state,
    open_dir,
    open_file,
    paths,
    walk,
)

SUMS = "sums"  # per path: [inode, size, mtime_ns, ctime_ns, sha256] of a file copied in (trusted while unchanged)


# ---- writing files in: resumable, checksummed ----------------------------------------------------------------------
def partial_path(p: Paths, rel: str) -> Path:
    return p.partial / hashlib.sha256(rel.encode()).hexdigest()


class Busy(VolumeFileError):
    """Another upload (or commit) of the same path is under way: they would share its partial copy."""


def _lock(f: BinaryIO, rel: str) -> None:
    """Hold the partial copy's lock for as long as `f` is open (two uploads of one path wrote one file, and the
    first to finish placed the other's bytes under its own checked hash)."""
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise Busy(f"{rel}: another upload of this path is under way; wait for it, or resume it later") from None


PARTIAL_TTL_S = 86400.0  # an upload broken off or held this long is dropped by the storage sweep


def waiting_bytes(p: Paths, but: Path | None = None) -> int:
    """What uploads under way, broken off or held take beside the tree (`partial/`; but the file `but`): they count
    nowhere else, so `Writer` keeps them within the volume's size."""
    total = 0
    with contextlib.suppress(OSError), os.scandir(p.partial) as it:
        for e in it:
            if e.name.endswith(".sum") or (but is not None and e.name == but.name):
                continue
            with contextlib.suppress(OSError):
                if e.is_file(follow_symlinks=False):
                    total += footprint(e.stat(follow_symlinks=False).st_size)
    return total


def expire_partial(p: Paths, now: float, ttl: float = PARTIAL_TTL_S) -> int:
    """Drop what has waited in `partial/` longer than `ttl` since its last byte (a file, its hash, a tar's scratch
    directory: by the newest thing in it); how many were dropped. An upload under way (its lock held) is never
    dropped. A client resuming later sends the file again."""
    dropped = 0
    with contextlib.suppress(OSError), os.scandir(p.partial) as it:
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if now - _newest(e.path, st.st_mtime) >= ttl:
                    remove_tree(Path(e.path))
                    dropped += 1
            elif now - st.st_mtime >= ttl and not _busy(e.path):
                Path(e.path).unlink(missing_ok=True)
                dropped += 1
    return dropped


def expire_partial_everywhere(volumes_dir: Path, now: float) -> int:
    """`expire_partial` in every volume under the server's volumes directory (`<org>/vols/<volume>`)."""
    dropped = 0
    with contextlib.suppress(OSError):
        for org in os.scandir(volumes_dir):
            vols = Path(org.path) / "vols"
            if org.is_dir(follow_symlinks=False) and vols.is_dir():
                for v in os.scandir(vols):
                    if v.is_dir(follow_symlinks=False):
                        dropped += expire_partial(paths(volumes_dir, org.name, v.name, None), now)  # removes only
    return dropped


def _newest(top: str, mtime: float) -> float:
    """The newest modification time in a tree (links not followed)."""
    for dirpath, dirs, names in os.walk(top):
        for name in (*dirs, *names):
            with contextlib.suppress(OSError):
                mtime = max(mtime, os.lstat(os.path.join(dirpath, name)).st_mtime)
    return mtime


def _busy(path: str) -> bool:
    """Whether an upload holds this partial copy's lock now."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def partial_size(p: Paths, rel: str) -> int:
    try:
        return partial_path(p, rel).stat().st_size
    except FileNotFoundError:
        return 0


def _held(p: Paths, rel: str) -> Path:
    return p.partial / (hashlib.sha256(rel.encode()).hexdigest() + ".sum")


def _sum_path(p: Paths, rel: str) -> Path:
    return p.root / SUMS / hashlib.sha256(rel.encode()).hexdigest()


def commit(p: Paths, rel: str, sha256: str, room: Claim) -> tuple[str, int, int]:
    """Move a held upload into the tree if the hash it was received with is `sha256` (else it is dropped: 422)
    and it fits in the `room` left now (else OverSize, the upload kept). Returns (sha256, bytes, bytes it
    replaced)."""
    src = partial_path(p, rel)
    try:
        f = open(src, "rb")  # noqa: SIM115 - closed below
    except OSError:
        raise VolumeFileError(f"{rel}: no whole upload is waiting; send it (again) with hold=true") from None
    _lock(f, rel)
    try:
        try:
            size_s, digest = _held(p, rel).read_text(encoding="ascii").split()
            size = int(size_s)
            have = os.fstat(f.fileno()).st_size
        except (OSError, ValueError):
            raise VolumeFileError(f"{rel}: no whole upload is waiting; send it (again) with hold=true") from None
        if have != size or digest != sha256:
            src.unlink(missing_ok=True)
            _held(p, rel).unlink(missing_ok=True)
            raise VolumeFileError(f"sha256: the file received hashes to {digest}, not {sha256}; send it again")
        room.take(footprint(size))
        replaced = _place(p, rel, digest)
        _held(p, rel).unlink(missing_ok=True)
        return digest, size, replaced
    finally:
        f.close()


def _place(p: Paths, rel: str, digest: str | None, src: Path | None = None) -> int:
    """Move a whole, checked partial copy (`src`, a file of `p.partial`; by default the path's resumable one) to
    `rel` in the tree; remember its hash (for reads, while it is unchanged; none is known for a same-host copy,
    which forgets any older one). Returns the bytes of the file it replaced."""
    src = src or partial_path(p, rel)
    parts = _split(rel)
    if p.owner is not None:
        os.chown(src, *p.owner)
    with open_dir(p.data, parts[:-1], create=True, owner=p.owner) as dfd:
        replaced = 0
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                src.unlink(missing_ok=True)
                raise VolumeFileError(f"{rel}: a directory is there")
            replaced = footprint(st.st_size)
        os.chmod(src, 0o644)
        pfd = os.open(p.partial, _DIR_FLAGS)
        try:
            os.replace(src.name, parts[-1], src_dir_fd=pfd, dst_dir_fd=dfd)
        finally:
            os.close(pfd)
        if digest is None:
            _sum_path(p, rel).unlink(missing_ok=True)
            return replaced
        with contextlib.suppress(OSError):
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            sums = p.root / SUMS
            sums.mkdir(exist_ok=True)
            _sum_path(p, rel).write_text(json.dumps([*_key(st), digest]), encoding="ascii")
    return replaced


class Writer:
    """One upload of a file at `offset` of its partial copy: bytes appended as they arrive, within the `room` left
    (what the volume holds and other copies in are writing); `finish` checks the whole file's sha256 and moves it
    into the tree."""

    def __init__(self, p: Paths, rel: str, offset: int, room: Claim) -> None:
        self.p, self.rel, self.room = p, rel, room
        path = partial_path(p, rel)
        # Opened without truncating and locked before anything is read or cut: another upload of the path may
        # be writing it (it then holds the lock, and this one is Busy without having touched its bytes).
        self.f = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600), "r+b")
        _lock(self.f, rel)
        try:
            have = os.fstat(self.f.fileno()).st_size
            if offset > have:
                raise VolumeFileError(f"offset {offset} is past the {have} bytes already received; resume from {have}")
            self.waiting = waiting_bytes(p, but=path)  # the other uploads waiting beside the tree
            self._open(offset)
        except BaseException:
            self.f.close()
            raise

    def _open(self, offset: int) -> None:
        self.f.truncate(offset)
        self.f.seek(0)
        self.hash = hashlib.sha256()
        while self.f.tell() < offset:  # a resumed upload: the received part is hashed again, from disk
            chunk = self.f.read(min(CHUNK, offset - self.f.tell()))
            if not chunk:
                break
            self.hash.update(chunk)
        self.f.seek(offset)
        self.written = offset
        _held(self.p, self.rel).unlink(missing_ok=True)  # a held upload written to again is no longer the one it hashed

    def _fits(self, total: int) -> None:
        if self.waiting + footprint(total) > self.room.size:
            raise OverSize(f"uploads waiting to be committed or resumed hold {self.waiting} bytes of the volume's "
                           f"{self.room.size}; commit them, or they are dropped a day after their last byte")  # fmt: skip

    def write(self, chunk: bytes) -> None:
        self._fits(self.written + len(chunk))
        self.room.take(footprint(self.written + len(chunk)))
        self.f.write(chunk)
        self.hash.update(chunk)
        self.written += len(chunk)

    def write_all(self, chunks: list[bytes]) -> None:
        """The chunks gathered (a few MiB), claimed against the room at once (one look at the claims)."""
        if not any(chunks):
            return
        self._fits(self.written + sum(len(c) for c in chunks))
        self.room.take(footprint(self.written + sum(len(c) for c in chunks)))
        for chunk in chunks:
            self.f.write(chunk)
            self.hash.update(chunk)
            self.written += len(chunk)

    def finish(self, sha256: str | None, hold: bool = False) -> tuple[str, int, int]:
        """(sha256, bytes, bytes it replaced) once the file is whole and in place; with `hold`, the whole file
        stays in its partial copy with its hash beside it until `commit` names the same hash (the client hashes
        while it sends, so it learns its own only at the end)."""
        self.f.flush()  # no fsync: on return the file is where `cp` leaves one (the page cache, written back as usual)
        try:  # still locked while it moves into place
            digest = self.hash.hexdigest()
            src = partial_path(self.p, self.rel)
            if sha256 is not None and sha256 != digest:
                src.unlink(missing_ok=True)
                raise VolumeFileError(f"sha256: the file received hashes to {digest}, not {sha256}; send it again")
            if hold:
                _held(self.p, self.rel).write_text(f"{self.written} {digest}", encoding="ascii")
                return digest, self.written, 0
            return digest, self.written, _place(self.p, self.rel, digest)
        finally:
            self.f.close()

    def abort(self) -> None:
        """Keep what arrived (the client resumes from it)."""
        with contextlib.suppress(OSError):
            self.f.close()


def put_tree(
    p: Paths, rel: str, source: BinaryIO, room: Claim, max_files: int, sha256: str | None = None
) -> tuple[int, int, str]:
    """Unpack a plain tar stream beside the tree, check the stream's sha256 (when given), then merge it into the
    directory `rel` (existing files it names are replaced) within `room` bytes. Returns (bytes, files, sha256)."""
    hashing = _Hashing(source)
    tmp = Path(tempfile.mkdtemp(prefix="tar-", dir=p.partial))
    try:
        waiting = waiting_bytes(p, but=tmp)  # held and broken-off uploads beside the tree count as `Writer` counts them
        left = max(room.left() - waiting, 0)
        try:
            got = unpack(hashing, tmp / "t", Limits(left, max_files), gzip=False)
        except TooLarge as e:
            if e.what == "bytes":
                raise OverSize(f"the tree unpacks to more than the {left} bytes left in the volume") from None
            raise
        room.take(got.bytes + waiting, "the tree unpacks to")  # what other copies wrote meanwhile counts too
        hashing.drain()
        digest = hashing.hash.hexdigest()
        if sha256 is not None and digest != sha256:
            raise VolumeFileError(f"sha256: the stream received hashes to {digest}, not {sha256}; send it again")
        try:  # what lands must stay within what a walk of the volume descends
            for _ in fwalk(tmp / "t", limit=MAX_WALK_DEPTH - len(_split(rel))):
                pass
        except TooDeep:
            raise VolumeFileError(f"the tree nests directories more than {MAX_WALK_DEPTH} levels below the "
                                  "volume's root") from None  # fmt: skip
        give(p, tmp / "t")
        with open_dir(p.data, _split(rel), create=True, owner=p.owner) as dfd:
            _merge(str(tmp / "t"), dfd)
        return got.bytes, got.files, digest
    finally:
        remove_tree(tmp)


class _Hashing:
    def __init__(self, raw: BinaryIO) -> None:
        self.raw, self.hash = raw, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        chunk = self.raw.read(n)
        self.hash.update(chunk)
        return chunk

    def drain(self) -> None:
        while self.read(CHUNK):
            pass


def _merge(src: str, dst_fd: int) -> None:
    """Move src's entries into the directory `dst_fd`: directories merged, anything else replaced (a loop holding
    a descriptor a level, not a recursion: the unpacked tree is as deep as its tar's names)."""
    stack: list[tuple[Iterator[os.DirEntry[str]], int]] = [(iter(list(os.scandir(src))), dst_fd)]
    try:
        while stack:
            entries, dfd = stack[-1]
            entry = next(entries, None)
            if entry is None:
                if len(stack) > 1:
                    os.close(dfd)
                stack.pop()
                continue
            try:
                st = os.stat(entry.name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if entry.is_dir(follow_symlinks=False):
                if st is not None and stat.S_ISDIR(st.st_mode):
                    sub = os.open(entry.name, _DIR_FLAGS, dir_fd=dfd)
                    stack.append((iter(list(os.scandir(entry.path))), sub))
                    continue
                if st is not None:
                    os.unlink(entry.name, dir_fd=dfd)
                os.rename(entry.path, entry.name, dst_dir_fd=dfd)
            else:
                if st is not None and stat.S_ISDIR(st.st_mode):
                    raise VolumeFileError(f"{entry.name}: a directory is there")
                os.replace(entry.path, entry.name, dst_dir_fd=dfd)
    finally:
        for _, dfd in stack[1:]:
            os.close(dfd)


# ---- reading files out ---------------------------------------------------------------------------------------------
def read_range(fd: int, start: int, length: int) -> Iterator[bytes]:
    """`length` bytes from `start` of an open file, a chunk at a time; closes it."""
    try:
        pos, end = start, start + length
        while pos < end:
            chunk = os.pread(fd, min(CHUNK, end - pos), pos)
            if not chunk:
                break
            pos += len(chunk)
            yield chunk
    finally:
        os.close(fd)


def file_sha256(p: Paths, rel: str) -> tuple[str, int]:
    """The sha256 and size of a file of the tree: the hash it was copied in with or last snapshotted with, while
    its inode, size, mtime and ctime are unchanged since; else read."""
    fd, st = open_file(p.data, rel)
    try:
        for cached in (_copied_sum(p, rel), load_state(p).get(rel)):
            if cached is not None and tuple(cached[:4]) == _key(st):
                return str(cached[4]), st.st_size
        h = hashlib.sha256()
        pos = 0
        while chunk := os.pread(fd, CHUNK, pos):
            h.update(chunk)
            pos += len(chunk)
        return h.hexdigest(), st.st_size
    finally:
        os.close(fd)


def _copied_sum(p: Paths, rel: str) -> list[object] | None:
    try:
        got = json.loads(_sum_path(p, rel).read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None
    return got if isinstance(got, list) and len(got) == 5 else None


def tar_tree(data: Path, rel: str) -> Iterator[bytes]:
    """A plain tar of the directory `rel` of the tree as it streams (regular files, directories, links as links),
    read through directory descriptors: a link a workload swaps in is stored as a link, never followed."""
    sink = _Sink()
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for path, name, dfd, st in walk(data, rel):
            info = tarfile.TarInfo(path)
            info.mtime, info.mode = int(st.st_mtime), st.st_mode & 0o777
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif stat.S_ISLNK(st.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dfd)
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
                except OSError:
                    continue
                with os.fdopen(fd, "rb") as f:
                    info.size = os.fstat(fd).st_size
                    tar.addfile(info, f)
            yield from sink.take()
    yield from sink.take()


class _Sink:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, b: bytes) -> int:
        self.parts.append(bytes(b))
        return len(b)

    def take(self) -> list[bytes]:
        out, self.parts = self.parts, []
        return out
