"""Writing a tree copied out of a volume on the caller's machine, never following a link (the SDK's downloads).

A volume holds whatever links its workloads made. tarfile's "data" filter decides where an entry lands by resolving
its path, and CPython before 3.11.13 / 3.12.11 stops resolving a path past PATH_MAX and takes the rest as plain
names (CVE-2025-4517): a chain of links could pass that check and steer a later copy into the same place outside it.
Nothing is resolved here. Every directory on an entry's way is opened by descriptor with O_NOFOLLOW, so an entry is
written only where its own path says, never through a link (one the volume sent or one already there). A link is made
only when its target is relative, climbs no higher than its own directory's depth, and has no `..` after a name
(where `..` after a link lands depends on that link): then, link by link, every link stays inside the copy.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from types import TracebackType

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(ValueError):
    """An entry the copy will not write: a path out of the tree, or through something that is not a directory."""


def file_mode(mode: int) -> int:
    """The mode a copied file gets, as tarfile's "data" filter gives it: no setuid, setgid or sticky bit, no write
    for group or others, executable only if its owner could execute it, and always readable and writable by us."""
    mode &= 0o755
    if not mode & 0o100:
        mode &= ~0o111
    return mode | 0o600


def parts(rel: object) -> tuple[str, ...]:
    """The names of a relative path the server sent; Refused for an absolute path, `..`, NUL, or nothing."""
    if not isinstance(rel, str) or rel.startswith("/") or "\0" in rel:
        raise Refused(f"the server named a path outside the copy: {str(rel)[:200]!r}")
    names = tuple(p for p in rel.split("/") if p not in ("", "."))
    if not names or ".." in names:
        raise Refused(f"the server named a path outside the copy: {rel[:200]!r}")
    return names


def stays_inside(names: tuple[str, ...], target: str) -> bool:
    """Whether a link at `names` to `target` stays inside the copy whatever the copy's other links are."""
    if not target or target.startswith("/") or "\0" in target:
        return False
    steps = [p for p in target.split("/") if p not in ("", ".")]
    up = 0
    while up < len(steps) and steps[up] == "..":
        up += 1
    return up <= len(names) - 1 and ".." not in steps[up:]


class TreeWriter:
    """Directories, files and links under `dest` (made if missing; `dest` itself is the caller's choice and may be
    a link)."""

    def __init__(self, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        self._top = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._cached: tuple[tuple[str, ...], int] | None = None  # the last directory written into, open
        self.skipped: list[str] = []  # links left out: they would point outside the copy

    def __enter__(self) -> TreeWriter:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._cached is not None:
            os.close(self._cached[1])
            self._cached = None
        if self._top >= 0:
            os.close(self._top)
            self._top = -1

    def mkdir(self, rel: str) -> None:
        names = parts(rel)
        self._dir(names)

    def create(self, rel: str, mode: int) -> int:
        """A new, empty file at `rel` (what was there, a file or a link, removed; never written through), open for
        writing; the caller closes the descriptor."""
        names = parts(rel)
        parent = self._dir(names[:-1])
        self._clear(parent, names)
        fd = os.open(names[-1], _NEW, 0o600, dir_fd=parent)
        os.fchmod(fd, file_mode(mode))
        return fd

    def link(self, rel: str, target: str) -> bool:
        """A link at `rel` to `target` when it stays inside the copy (True); else nothing is made (False)."""
        names = parts(rel)
        if not stays_inside(names, target):
            self.skipped.append("/".join(names))
            return False
        parent = self._dir(names[:-1])
        self._clear(parent, names)
        os.symlink(target, names[-1], dir_fd=parent)
        return True

    def _clear(self, parent: int, names: tuple[str, ...]) -> None:
        try:
            st = os.stat(names[-1], dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            raise Refused(f"{'/'.join(names)[:200]} is a directory here")
        os.unlink(names[-1], dir_fd=parent)

    def _dir(self, names: tuple[str, ...]) -> int:
        """The directory at `names`, made where missing, opened name by name without following a link."""
        if not names:
            return self._top
        if self._cached is not None and self._cached[0] == names:
            return self._cached[1]
        fd = self._top
        try:
            for i, name in enumerate(names):
                try:
                    nxt = _open_or_make(fd, name)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise Refused(
                            f"{'/'.join(names[: i + 1])[:200]} is a link or a file here, not a directory"
                        ) from None
                    raise
                if fd != self._top:
                    os.close(fd)
                fd = nxt
        except BaseException:
            if fd != self._top:
                os.close(fd)
            raise
        if self._cached is not None:
            os.close(self._cached[1])
        self._cached = (names, fd)
        return fd


def _open_or_make(parent: int, name: str) -> int:
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):  # made meanwhile, or a link: the open says which
            os.mkdir(name, 0o777, dir_fd=parent)
        return os.open(name, _DIR, dir_fd=parent)
