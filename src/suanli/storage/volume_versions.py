"""Versions of a local volume: content-addressed, so unchanged files are stored once.

A version is a manifest (`versions/<N>/manifest.json`: path → [sha256, size], directories and links too); each
distinct content is one read-only file in its org's blob store (`<org>/blobs/ab/abcdef…`), shared by every version
of every volume of the org and by clones. A snapshot reads only files changed since the last one (the cache in
`state.json`: same inode, size, mtime and ctime) and copies only content the store lacks. A version's tree of hard
links into the store is made when a workload first mounts `name@N` (`tree`), not at every snapshot. Blobs no
manifest of the org names are removed when a volume is removed (`gc`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from suanli.storage.archive import footprint, remove_tree
from suanli.storage.volumes import CHUNK, OverSize, Paths, Usage, _key, fwalk, load_state, measure, save_state

LINK = "symlink:"  # a manifest entry of a link: [LINK + target, 0]
DIR = "dir"  # a manifest entry of a directory: [DIR, 0]
LOCK = ".lock"  # in the blob store: snapshots hold it shared, `gc` exclusive (a blob stored before its manifest)
SNAPSHOTS = ".snapshots.lock"  # beside the blob store: held by each snapshot of the org from its check to its count


class VersionError(ValueError):
    """A version that is not on disk."""


@dataclass(frozen=True)
class Snapshot:
    bytes: int
    files: int  # regular files
    added_bytes: int  # content none of the volume's earlier versions named (what this one adds to its bill)


def blob(p: Paths, sha: str) -> Path:
    return p.blobs / sha[:2] / sha


def snapshot(p: Paths, number: int, most: int | None = None) -> Snapshot:
    """Record the live tree as version `number`. A mounted volume may be written meanwhile: each file is captured
    as it was when read (consistent per file, not across files). OverSize once the version would add more than
    `most` bytes of content (a file that landed after the room was checked); what it stored goes again."""
    try:
        with _locked(p, exclusive=False):
            return _snapshot(p, number, most)
    except OverSize:
        gc(p)
        raise


@contextlib.contextmanager
def one_at_a_time(p: Paths) -> Iterator[None]:
    """Snapshots of one org, one after the other (every server process of the host): each checks the room its
    org's versions have left, copies, and counts what it added, before the next checks. Checked in one transaction
    and counted in another, snapshots sent together each saw the whole room."""
    p.blobs.mkdir(parents=True, exist_ok=True)
    fd = os.open(p.blobs.parent / SNAPSHOTS, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


HELD = "held.json"  # the content (sha256s) this volume's versions name: what they have paid for


def _held(p: Paths) -> set[str]:
    """The content this volume's versions name; read from their manifests once where the record is missing."""
    try:
        return set(json.loads((p.root / HELD).read_text(encoding="ascii")))
    except (OSError, ValueError):
        pass
    held: set[str] = set()
    with contextlib.suppress(OSError):
        for d in p.versions.iterdir():
            if d.name.isdigit():
                with contextlib.suppress(VersionError, ValueError):
                    held.update(
                        sha for sha, _ in manifest(p, int(d.name)).values() if sha != DIR and not sha.startswith(LINK)
                    )
    return held


def _snapshot(p: Paths, number: int, most: int | None = None) -> Snapshot:
    old = load_state(p)
    blobs = str(p.blobs)
    held = _held(p)
    state: dict[str, list[object]] = {}
    entries: dict[str, list[object]] = {}
    total = added = files = 0
    for dirpath, dirs, names, dfd in fwalk(p.data):
        rel = os.path.relpath(dirpath, p.data)
        base = "" if rel == "." else rel + "/"
        for name in dirs:
            entries[base + name] = [DIR, 0]
        for name in names:
            path = base + name
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                entries[path] = [LINK + os.readlink(name, dir_fd=dfd), 0]
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            cached = old.get(path)
            sha = str(cached[4]) if cached is not None and tuple(cached[:4]) == _key(st) else None
            size = st.st_size
            if sha is None or not os.path.exists(f"{blobs}/{sha[:2]}/{sha}"):  # (a str: pathlib costs more here)
                if sha not in held:  # before copying: a file past the room left is refused without being read
                    _within(added + size, most)
                # At most the size read above: a file a job keeps appending to is taken as it was then, and what
                # the version adds is counted by what was copied (else it held more than its count and its cap).
                sha, _, size = _store(p, name, dfd, size)
            if sha not in held:  # this volume's versions pay for content once, whichever volume stored it first
                held.add(sha)
                added += size
                _within(added, most)
            state[path] = [*_key(st), sha]
            entries[path] = [sha, size]
            total += size
            files += 1
    dest = p.version(number)
    tmp = p.versions / f".{number}.tmp"
    remove_tree(tmp)
    p.versions.mkdir(exist_ok=True)  # not its parents: a volume removed meanwhile is not made again
    tmp.mkdir()
    (tmp / "manifest.json").write_text(json.dumps(entries, sort_keys=True), encoding="utf-8")
    os.rename(tmp, dest)
    save_state(p, state)
    (p.root / f".{HELD}.tmp").write_text(json.dumps(sorted(held)), encoding="ascii")
    os.replace(p.root / f".{HELD}.tmp", p.root / HELD)
    return Snapshot(total, files, added)


def _within(added: int, most: int | None) -> None:
    if most is not None and added > most:
        raise OverSize(f"this version would add more than the {most} bytes its organisation's versions have left")


def _store(p: Paths, name: str, dfd: int, most: int) -> tuple[str, int, int]:
    """Copy at most `most` bytes of a file into the blob store while hashing them; (sha256, bytes new to the
    store, bytes copied)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as src, tempfile.NamedTemporaryFile(dir=p.blobs, prefix=".in-", delete=False) as out:
        while (left := most - out.tell()) > 0 and (chunk := src.read(min(CHUNK, left))):
            h.update(chunk)
            out.write(chunk)
        size = out.tell()
    sha = h.hexdigest()
    target = blob(p, sha)
    if target.exists():
        os.unlink(out.name)
        return sha, 0, size
    target.parent.mkdir(exist_ok=True)
    os.chmod(out.name, 0o444)
    os.replace(out.name, target)
    return sha, size, size


def manifest(p: Paths, number: int) -> dict[str, tuple[str, int]]:
    """Path → (sha256, size) of a version's entries (directories as ("dir", 0), links as ("symlink:…", 0))."""
    try:
        doc = json.loads((p.version(number) / "manifest.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise VersionError(f"version {number} is not on disk") from None
    return {k: (str(v[0]), int(v[1])) for k, v in doc.items()}


def blocks_of(m: dict[str, tuple[str, int]]) -> int:
    """What a version's tree takes once materialised, as `measure` counts a live tree: whole blocks per file, one
    per directory and link."""
    return sum(footprint(size if sha != DIR and not sha.startswith(LINK) else 0) for sha, size in m.values())


def files_of(m: dict[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
    """A manifest's files and links (what a diff compares), without its directories."""
    return {k: v for k, v in m.items() if v[0] != DIR}


def tree(p: Paths, number: int) -> Path:
    """A read-only tree of version `number` (hard links into the blob store), made the first time it is asked for."""
    out = p.version(number) / "tree"
    if out.is_dir():
        return out
    entries = manifest(p, number)
    tmp = p.version(number) / f".tree.{os.getpid()}"
    remove_tree(tmp)
    tmp.mkdir()
    for path, (sha, _) in sorted(entries.items()):
        dest = tmp / path
        if sha == DIR:
            dest.mkdir(parents=True, exist_ok=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        if sha.startswith(LINK):
            os.symlink(sha[len(LINK) :], dest)
        else:
            _link(blob(p, sha), dest)
    for _, _, _, dfd in fwalk(tmp):
        os.chmod(dfd, 0o555)
    try:
        os.rename(tmp, out)
    except OSError:  # made meanwhile by another launch
        remove_tree(tmp)
    return out


def _link(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError as e:
        if e.errno != errno.EMLINK:  # the filesystem's most links to one inode: this one is a copy
            raise
        shutil.copyfile(src, dest)
        os.chmod(dest, 0o444)


def materialise(src: Paths, number: int, dest: Paths, limit: int | None = None) -> Usage:
    """Make `dest`'s live tree a writable copy of `src`'s version `number` (restore: dest is src; clone: a new
    volume of the same org); `OverSize` where the version takes more than `limit` bytes. The old live tree goes
    once the new one is in place. One at a time per volume (under its `restore.lock`), each in a scratch directory
    of its own: two at once shared one, and left a tree of both versions."""
    entries = manifest(src, number)
    if limit is not None and (need := blocks_of(entries)) > limit:
        raise OverSize(f"version {number} takes {need} bytes, more than the volume's {limit}")
    fd = os.open(dest.root / "restore.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with _locked(dest, exclusive=False):  # a removal of the volume (`destroy`) waits, then takes all of it
            return _materialise(src, entries, dest)
    finally:
        os.close(fd)


def _materialise(src: Paths, entries: dict[str, tuple[str, int]], dest: Paths) -> Usage:
    for left in dest.root.glob(".restore*"):  # what a restore killed on its way left (none runs now: the lock)
        remove_tree(left)
    tmp = Path(tempfile.mkdtemp(prefix=".restore-", dir=dest.root))
    state: dict[str, list[object]] = {}
    for path, (sha, _) in sorted(entries.items()):
        out = tmp / path
        if sha == DIR:
            out.mkdir(parents=True, exist_ok=True)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        if sha.startswith(LINK):
            os.symlink(sha[len(LINK) :], out)
            continue
        shutil.copyfile(blob(src, sha), out)
        os.chmod(out, 0o644)
        if dest.owner is not None:
            os.chown(out, *dest.owner)
        state[path] = [*_key(os.stat(out)), sha]
    if dest.owner is not None:
        for _, dirs, _, dfd in fwalk(tmp):
            for name in dirs:
                os.chown(name, *dest.owner, dir_fd=dfd, follow_symlinks=False)
        os.chown(tmp, *dest.owner)
    old = Path(tempfile.mkdtemp(prefix=".restore-old-", dir=dest.root))
    old.rmdir()  # (a fresh name for the tree it replaces)
    if dest.data.exists():
        os.rename(dest.data, old)
    os.rename(tmp, dest.data)
    remove_tree(old)
    save_state(dest, state)
    return measure(dest.data)


@contextlib.contextmanager
def _locked(p: Paths, exclusive: bool) -> Iterator[None]:
    p.blobs.mkdir(parents=True, exist_ok=True)
    fd = os.open(p.blobs / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def gc(p: Paths) -> int:
    """Remove the org's blobs no manifest of any of its volumes names (no snapshot of the org is under way: they
    hold the store's lock shared). Returns bytes freed."""
    with _locked(p, exclusive=True):
        return _gc(p)


def _gc(p: Paths) -> int:
    vols = p.root.parent
    named: set[str] = set()
    for manifest_file in vols.glob("*/versions/*/manifest.json"):
        try:
            doc = json.loads(manifest_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return 0  # a manifest being written or unreadable: remove nothing this time
        named.update(str(v[0]) for v in doc.values())
    freed = 0
    for _, _, names, dfd in fwalk(p.blobs):
        for name in names:
            if name in named or name == LOCK:
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                os.unlink(name, dir_fd=dfd)
                freed += st.st_size
            except OSError:
                continue
    return freed


def destroy(p: Paths) -> None:
    """Remove the volume and every version, then the blobs nothing else names: after any snapshot of the org under
    way (it holds the store's lock shared), so none writes a manifest into the removed tree."""
    with _locked(p, exclusive=True):
        remove_tree(p.root)
        _gc(p)
