"""Same-host copies into and out of a local volume's tree, between open descriptors, in the kernel.

A tenant on the server's own host passes the server its open files (`storage.fd_channel`); these functions copy
them with copy_file_range, as `cp` does, instead of streaming the bytes through HTTP. What lands in the tree goes
the way an HTTP copy goes: a file through its partial copy and then renamed into place, a directory built beside
the tree and then merged in, within the room the volume has left; a tree is read through directory descriptors,
never through a link. No hash is taken in flight (no byte crosses a network): a file's sha256 is read when a
snapshot, a `stat --sha256` or an HTTP copy out asks for it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from suanli.storage import fd_channel
from suanli.storage.archive import footprint, remove_tree
from suanli.storage.volume_io import _merge, _place
from suanli.storage.volume_room import Claim
from suanli.storage.volumes import Paths, VolumeFileError, _split, give, open_dir, walk
from suanli.workloads.volumes import VolumeRuleError, clean_path

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def put_file(p: Paths, rel: str, src: int, room: Claim, step: Callable[[int], None] | None = None) -> tuple[int, int]:
    """Copy the open file `src` (checked by the caller) to `rel`: its size now is what is copied, refused past
    the `room` left. Returns (bytes, bytes of the file it replaced)."""
    size = os.fstat(src).st_size
    room.take(footprint(size))
    fd, name = tempfile.mkstemp(prefix="fd-", dir=p.partial)  # its own: two copies of one path (or an HTTP
    path = Path(name)  # upload of it) at once do not write one file, and each lands whole
    try:
        try:
            n = fd_channel.copy(src, fd, size, step=step)
        finally:
            os.close(fd)
        return n, _place(p, rel, None, path)
    finally:
        path.unlink(missing_ok=True)  # (gone once placed)


@dataclass
class TreeIn:
    """A directory arriving as batches of open files: each copied beside the tree as it comes, the whole merged
    into `rel` at `finish` (nothing of it is visible before), within the `room` left and `max_files` entries."""

    p: Paths
    rel: str
    room: Claim
    max_files: int
    bytes: int = 0
    entries: int = 0
    tmp: Path = field(init=False)
    dirs: set[str] = field(default_factory=lambda: {""})
    files: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="fds-", dir=self.p.partial))
        (self.tmp / "t").mkdir()

    def _count(self, size: int) -> None:
        """One more entry of `size` bytes: counted as the volume is measured (a directory is a block); claimed
        against the room a batch at a time (`add`)."""
        self.entries += 1
        if self.entries > self.max_files:
            raise VolumeFileError(f"the tree has more than {self.max_files} files and directories")
        self.bytes += footprint(size)

    def _dir(self, rel: str) -> None:
        parts = _split(rel)
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d in self.dirs:
                continue
            if d in self.files:
                raise VolumeFileError(f"{d}: named as a file and as a directory")
            os.mkdir(self.tmp / "t" / d, 0o755)
            self.dirs.add(d)
            self._count(0)

    def add(self, dirs: list[str], files: list[str], fds: list[int]) -> int:
        """Make `dirs` and copy each of `files` from its descriptor (one each, in order): all of the batch counted
        and claimed first, then copied. Returns the bytes."""
        if len(files) != len(fds):
            raise VolumeFileError(f"{len(files)} files named but {len(fds)} descriptors sent")
        for d in dirs:
            self._dir(_clean(d))
        todo: list[tuple[str, int, int]] = []
        for name, src in zip(files, fds, strict=True):
            rel = _clean(name)
            if not rel:
                raise VolumeFileError("a file must have a name inside the tree")
            try:
                size = fd_channel.check_fd(src, write=False).st_size
            except fd_channel.BadDescriptor as e:
                raise VolumeFileError(f"{rel}: {e}") from None
            self._dir(rel.rpartition("/")[0])
            if rel in self.files or rel in self.dirs:
                what = "named twice" if rel in self.files else "named as a file and as a directory"
                raise VolumeFileError(f"{rel}: {what}")
            self.files.add(rel)
            self._count(size)  # its size now: what is copied, never more
            todo.append((rel, src, size))
        self.room.take(self.bytes, "the tree holds")
        got = 0
        for rel, src, size in todo:
            out = os.open(self.tmp / "t" / rel, _NEW, 0o644)
            try:
                got += fd_channel.copy(src, out, size)
            finally:
                os.close(out)
        return got

    def finish(self) -> None:
        give(self.p, self.tmp / "t")
        with open_dir(self.p.data, _split(self.rel), create=True, owner=self.p.owner) as dfd:
            _merge(str(self.tmp / "t"), dfd)

    def close(self) -> None:
        remove_tree(self.tmp)


def _clean(rel: object) -> str:
    try:
        return clean_path(rel)
    except VolumeRuleError as e:
        raise VolumeFileError(f"{str(rel)[:200]!r}: {e}") from None


@dataclass
class OutBatch:
    """Part of a tree on its way out: directories and links to make, and files open for reading."""

    dirs: list[str] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    files: list[tuple[str, int, int]] = field(default_factory=list)  # (path, size, mode)
    fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        fd_channel.close_all(self.fds)


def tree_out(data: Path, rel: str, batch: int = 200) -> Iterator[OutBatch]:
    """The directory `rel` of the tree (`storage.volumes.walk`) in batches of at most `batch` entries, its files
    each open for reading. The caller closes each batch."""
    out = OutBatch()
    for path, name, dfd, st in walk(data, rel):
        if stat.S_ISDIR(st.st_mode):
            out.dirs.append(path)
        elif stat.S_ISLNK(st.st_mode):
            with contextlib.suppress(OSError):
                out.links.append((path, os.readlink(name, dir_fd=dfd)))
        elif stat.S_ISREG(st.st_mode):
            try:
                fd = os.open(name, _READ, dir_fd=dfd)
            except OSError:
                continue
            out.fds.append(fd)
            out.files.append((path, os.fstat(fd).st_size, st.st_mode & 0o777))
        if len(out.fds) + len(out.dirs) + len(out.links) >= batch:
            yield out
            out = OutBatch()
    yield out
