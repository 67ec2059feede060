"""The local volume backend: a volume is a directory tree on the server's disk (on a cluster, the operator's
shared filesystem); its versions are content-addressed (`storage.volume_versions`).

Layout under the volumes root (`volumes_dir`):

    <org>/blobs/ab/abcdef…        one file per distinct content (sha256), read-only, shared by every version of
                                  every volume of the org: unchanged files are stored once
    <org>/vols/<volume>/data/      the live tree, bound into sandboxes
    <org>/vols/<volume>/versions/<N>/manifest.json (and tree/, hard links to blobs, once a workload mounts it)
    <org>/vols/<volume>/state.json   path → (inode, size, mtime, ctime, sha): files not changed since the last
                                  snapshot are not read again
    <org>/vols/<volume>/partial/   uploads under way (resumable), outside what a workload sees

The live tree is written by tenants' workloads, so the server never follows a link in it: every path is opened a
component at a time relative to a directory descriptor, with O_NOFOLLOW, and walks use `fwalk` (as `os.fwalk`,
but a loop, not a recursion: a tree nested deeper than `MAX_WALK_DEPTH` directories is refused by name, `TooDeep`).
A link a workload made is kept as a link (in versions too) and never read through.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from suanli.storage.archive import footprint, remove_tree

CHUNK = 1 << 20
STATE = "state.json"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Directories below the top a walk descends (it holds one descriptor a level). A workload can nest its volume's
# directories deeper than any path names them; `os.fwalk` recursed a frame a level and raised RecursionError.
MAX_WALK_DEPTH = 1000


class VolumeFileError(ValueError):
    """A path that is not what the operation needs (missing, a link, a directory where a file is wanted)."""


class OverSize(ValueError):
    """A write would take the volume past its size."""


class TooDeep(ValueError):
    """A tree nested deeper than a walk descends (`MAX_WALK_DEPTH`): the caller's volume, refused by name."""

    def __init__(self, where: str) -> None:
        where = where if len(where) <= 100 else where[:100] + "…"
        super().__init__(f"volume: it holds directories nested more than {MAX_WALK_DEPTH} levels deep "
                         f"({where}); remove some levels")  # fmt: skip


@dataclass(frozen=True)
class Paths:
    root: Path  # the volume's own directory
    blobs: Path  # its org's blob store
    owner: tuple[int, int] | None = None  # a root server: the org's sandbox uid and gid own the live tree

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def versions(self) -> Path:
        return self.root / "versions"

    @property
    def partial(self) -> Path:
        return self.root / "partial"

    def version(self, n: int) -> Path:
        return self.versions / str(n)


def paths(volumes_dir: Path, org_id: str, volume_id: str, uid: int | None) -> Paths:
    """A volume's directories; `uid`: its org's sandbox uid, which owns the live tree when the server is root (None:
    the server's own user keeps it, and a sandbox cannot write it)."""
    owner = (uid, uid) if uid is not None and os.geteuid() == 0 else None
    return Paths(volumes_dir / org_id / "vols" / volume_id, volumes_dir / org_id / "blobs", owner)


def create(p: Paths) -> None:
    for d in (p.data, p.versions, p.partial, p.blobs):
        d.mkdir(parents=True, exist_ok=True)
    give(p, p.data)


def give(p: Paths, top: Path, dirs_only: bool = False) -> None:
    """Hand what the server wrote into the live tree to the sandbox's uid (a root server runs tenants as their own
    uid, which must be able to change it): `top` and everything under it (its directories only, `dirs_only`)."""
    if p.owner is None:
        return
    uid, gid = p.owner
    os.chown(top, uid, gid, follow_symlinks=False)
    for _, dirs, files, dfd in fwalk(top):
        for n in dirs if dirs_only else (*dirs, *files):
            os.chown(n, uid, gid, dir_fd=dfd, follow_symlinks=False)


# ---- safe paths ----------------------------------------------------------------------------------------------------
def _split(rel: str) -> list[str]:
    return [x for x in rel.split("/") if x]


@contextlib.contextmanager
def open_dir(base: Path, parts: list[str], create: bool = False, owner: tuple[int, int] | None = None) -> Iterator[int]:
    """A descriptor of base/parts…, every component opened with O_NOFOLLOW (made when `create`, owned by
    `owner`)."""
    fd = os.open(base, _DIR_FLAGS)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise VolumeFileError(f"{'/'.join(parts)}: no such directory") from None
            except (NotADirectoryError, OSError) as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise VolumeFileError(
                        f"{'/'.join(parts)}: {part} is not a directory (links are not followed)"
                    ) from None
                raise
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def fwalk(
    top: Path | str, dir_fd: int | None = None, limit: int = MAX_WALK_DEPTH
) -> Iterator[tuple[str, list[str], list[str], int]]:
    """`os.fwalk(top, dir_fd=dir_fd, follow_symlinks=False)` (top down, `dirs` pruned in place is honoured), as a
    loop: one descriptor a level is open, and a directory more than `MAX_WALK_DEPTH` below `top` raises `TooDeep`
    (more than `limit`, when given) instead of the recursion running out. A directory is only entered through O_NOFOLLOW (a link to one is listed
    in `dirs`, as os.fwalk lists it, and not entered); one that vanishes or cannot be opened is skipped."""
    stack: list[tuple[int, str, list[str], int]] = []  # (descriptor, its path, its dirs, how many entered)
    fd, path = os.open(top, _DIR_FLAGS, dir_fd=dir_fd), str(top)
    try:
        while True:
            dirs: list[str] = []
            files: list[str] = []
            stack.append((fd, path, dirs, 0))
            with os.scandir(fd) as it:
                for e in it:
                    try:
                        (dirs if e.is_dir() else files).append(e.name)
                    except OSError:
                        files.append(e.name)
            yield path, dirs, files, fd
            while stack:  # the next directory to enter: the deepest one with a subdirectory not yet entered
                pfd, ppath, pdirs, i = stack[-1]
                if i >= len(pdirs):
                    os.close(stack.pop()[0])
                    continue
                stack[-1] = (pfd, ppath, pdirs, i + 1)
                try:
                    fd = os.open(pdirs[i], _DIR_FLAGS, dir_fd=pfd)
                except OSError:  # gone, a link, not a directory any more
                    continue
                path = os.path.join(ppath, pdirs[i])
                if len(stack) > limit:
                    os.close(fd)
                    raise TooDeep(os.path.relpath(path, str(top)))
                break
            else:
                return
    finally:
        for entry in stack:
            os.close(entry[0])


def walk(data: Path, rel: str) -> Iterator[tuple[str, str, int, os.stat_result]]:
    """Every entry under the directory `rel` of the tree, by name within each directory, as (path under `rel`,
    name, its directory's descriptor, lstat): walked through directory descriptors, a link reported, never followed.
    Entries that vanish while walked are skipped."""
    with open_dir(data, _split(rel)) as top:
        for dirpath, dirs, files, dfd in fwalk(".", dir_fd=top):
            base = "" if dirpath == "." else dirpath[2:] + "/"
            dirs.sort()  # entered by name too
            for name in dirs + sorted(files):
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue
                yield base + name, name, dfd, st


def check_depth(data: Path, rel: str) -> None:
    """`TooDeep` if the directory `rel` of the tree holds directories nested deeper than a walk descends: checked
    before a stream of it starts, so that it is refused with a status rather than cut short."""
    with open_dir(data, _split(rel)) as top:
        for _ in fwalk(".", dir_fd=top):
            pass


def open_file(data: Path, rel: str) -> tuple[int, os.stat_result]:
    """A descriptor of a regular file of the tree (not through a link), and its stat."""
    parts = _split(rel)
    if not parts:
        raise VolumeFileError("name a file, not the volume's root")
    with open_dir(data, parts[:-1]) as dfd:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
        except FileNotFoundError:
            raise VolumeFileError(f"{rel}: no such file") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise VolumeFileError(f"{rel}: a link; links are not followed") from None
            raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise VolumeFileError(f"{rel}: {'a directory' if stat.S_ISDIR(st.st_mode) else 'not a regular file'}")
    return fd, st


def kind(data: Path, rel: str) -> str:
    """'dir', 'file', 'link', 'other' or 'missing' (of the entry itself, not what a link points at)."""
    parts = _split(rel)
    if not parts:
        return "dir"
    try:
        with open_dir(data, parts[:-1]) as dfd:
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
    except (VolumeFileError, FileNotFoundError):
        return "missing"
    return _kind(st.st_mode)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "link" if stat.S_ISLNK(mode) else "other"


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    size: int
    mtime_ns: int


def listdir(data: Path, rel: str, limit: int, after: str = "") -> list[Entry]:
    """Entries of a directory of the tree, by name, at most `limit` after `after`."""
    out: list[Entry] = []
    with open_dir(data, _split(rel)) as dfd:
        names = sorted(n for n in os.listdir(dfd) if n > after)
        for name in names[:limit]:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            out.append(Entry(name, _kind(st.st_mode), st.st_size if stat.S_ISREG(st.st_mode) else 0, st.st_mtime_ns))
    return out


def remove(data: Path, rel: str) -> None:
    parts = _split(rel)
    if not parts:
        raise VolumeFileError("the volume's root is removed with `volumes rm`")
    with open_dir(data, parts[:-1]) as dfd:
        try:
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            raise VolumeFileError(f"{rel}: no such file") from None
        if stat.S_ISDIR(st.st_mode):
            tmp = f".suanli-rm-{os.getpid()}-{st.st_ino}"
            os.rename(parts[-1], tmp, src_dir_fd=dfd, dst_dir_fd=dfd)
            remove_tree(Path(f"/proc/self/fd/{dfd}") / tmp)
        else:
            os.unlink(parts[-1], dir_fd=dfd)


# ---- usage ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Usage:
    bytes: int  # files in whole 4 KiB blocks, a block per directory or link (as workdirs are counted)
    files: int


def measure(top: Path) -> Usage:
    """What the tree holds (`TooDeep` when it is nested deeper than a walk descends)."""
    total = entries = 0
    for _, dirs, files, dfd in fwalk(top):
        entries += len(dirs) + len(files)
        total += footprint(0) * len(dirs)
        for name in files:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            total += footprint(st.st_size if stat.S_ISREG(st.st_mode) else 0)
    return Usage(total, entries)


def _key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def load_state(p: Paths) -> dict[str, list[object]]:
    """The snapshot cache: path -> [inode, size, mtime_ns, ctime_ns, sha256] of the live files last snapshotted."""
    try:
        doc = json.loads((p.root / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def save_state(p: Paths, state: dict[str, list[object]]) -> None:
    tmp = p.root / f".{STATE}.tmp"
    tmp.write_text(json.dumps(state), encoding="utf-8")
    os.replace(tmp, p.root / STATE)
