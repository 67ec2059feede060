"""Unpacking an uploaded workdir (a .tar.gz from a tenant) into a fresh directory, safely.

Every bound is enforced while the stream is read, not taken from the headers' word: the bytes written and the
entries made are counted as they are made, and unpacking stops at the first one over. Only regular files and
directories are unpacked; absolute paths, `..`, links (symbolic or hard), sparse files, devices and FIFOs are
refused naming the entry, as are names given twice. The gzip layer is inflated a few KiB at a time and tarfile
never reads an extended header (a long name, pax records) of more than `MAX_HEADER_BYTES`, so memory stays small
however the archive was made. A refused archive leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

BLOCK = 4096  # what the disk holds: every file rounded up to whole blocks, every entry at least one
MAX_HEADER_BYTES = 64 << 10  # a long name or pax record this big is already absurd
_EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
             tarfile.SOLARIS_XHDTYPE)  # fmt: skip
_KINDS = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a character device",
          tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a FIFO"}  # fmt: skip
_CHUNK = 64 << 10


class ArchiveError(ValueError):
    """The archive is refused; the message names the entry where there is one."""


class TooLarge(ArchiveError):
    """Over a limit: `what` is "bytes" or "entries", `limit` the bound that was hit."""

    def __init__(self, message: str, what: str, limit: int) -> None:
        super().__init__(message)
        self.what, self.limit = what, limit


class NoSpace(OSError):
    """The server's own disk (or its quota) is full: not the archive's fault."""


@dataclass(frozen=True)
class Limits:
    bytes: int  # on disk, counted as `footprint` counts it
    entries: int  # files and directories


@dataclass(frozen=True)
class Unpacked:
    bytes: int  # on disk: each file rounded up to 4 KiB blocks, each directory one block
    files: int  # files and directories


# What one uploaded workdir may unpack to unless the operator says otherwise (settings `workdir_max_bytes`,
# `workdir_max_files`).
DEFAULT_LIMITS = Limits(256 << 20, 100_000)


def packed_bound(limits: Limits) -> int:
    """The most bytes a .tar.gz of a tree within `limits` can take: its bytes, a 512-byte header and up to 511
    bytes of padding an entry, the end blocks, and gzip's few bytes of framing for what does not compress."""
    return limits.bytes + limits.bytes // 1000 + 1024 * limits.entries + (1 << 20)


def footprint(size: int) -> int:
    """Bytes of disk an entry of `size` bytes is counted for: whole 4 KiB blocks, at least one."""
    return max(1, -(-size // BLOCK)) * BLOCK


def unpack(source: bytes | BinaryIO, dest: Path, limits: Limits | None = None, *, gzip: bool = True) -> Unpacked:
    """Unpack a .tar.gz (bytes or a binary file) into `dest`, which must not exist yet; a plain tar when not
    `gzip` (a volume's `cp` of a directory: its files are mostly compressed already)."""
    limits = limits or DEFAULT_LIMITS
    if dest.exists() or dest.is_symlink():
        raise ArchiveError(f"{dest.name} exists already")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))  # fresh: nothing planted is reused
    try:
        raw = _Bytes(source) if isinstance(source, bytes | bytearray | memoryview) else source
        try:
            stream = _Gunzip(raw) if gzip else raw
            with tarfile.open(fileobj=stream, mode="r|", tarinfo=_Header) as tar:  # type: ignore[call-overload]
                got = _Extraction(tmp, limits).run(tar)
        except ArchiveError:
            raise
        except NoSpace:
            raise
        except (tarfile.TarError, EOFError, zlib.error, RecursionError) as e:
            raise ArchiveError(f"not a valid .tar.gz ({_why(e)})") from None
        os.rename(tmp, dest)
        return got
    except BaseException:
        remove_tree(tmp)
        raise


def remove_tree(path: Path) -> None:
    """Remove a directory tree whatever its modes (a job may leave directories it made unwritable)."""

    def fix(func: object, p: str, exc: object) -> None:
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
        except OSError:
            pass

    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        try:
            _rmtree(path, fix)
        except RecursionError:  # shutil.rmtree recurses a frame a level: a job may nest directories deeper
            _flatten(path)
            with contextlib.suppress(RecursionError):  # a deep part behind a directory its owner cannot open: left
                _rmtree(path, fix)


def _rmtree(path: Path, fix: Any) -> None:
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=fix)
    else:
        shutil.rmtree(path, onerror=fix)


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _flatten(path: Path) -> None:
    """Move every entry below the directories of `path` up into `path` itself, each once, under a new name (a
    loop over renames through descriptors: no recursion, no link followed), so that what is left is one level
    deep whatever the nesting was."""
    top = os.open(path, _DIR)
    n = 0
    try:
        todo = os.listdir(top)
        while todo:
            name = todo.pop()
            sub = _open_dir(top, name)
            if sub is None:
                continue
            try:
                for inner in os.listdir(sub):
                    n += 1
                    new = f".rm-{os.getpid()}-{n}"
                    try:
                        os.rename(inner, new, src_dir_fd=sub, dst_dir_fd=top)
                    except PermissionError:
                        os.chmod(sub, 0o700)
                        os.rename(inner, new, src_dir_fd=sub, dst_dir_fd=top)
                    todo.append(new)
            except OSError:
                continue
            finally:
                os.close(sub)
    finally:
        os.close(top)


def _open_dir(parent: int, name: str) -> int | None:
    """A descriptor of the directory `name` (not a link), made readable first if it was not; None if not one."""
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except PermissionError:
        pass
    except OSError:
        return None
    try:
        pin = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return None
    try:
        os.chmod(f"/proc/self/fd/{pin}", 0o700)  # this very directory, never what a link names
        return os.open(name, _DIR, dir_fd=parent)
    except OSError:
        return None
    finally:
        os.close(pin)


def _why(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "extended headers nested too deeply"
    return str(e).split("\n")[0][:200] or type(e).__name__


def _show(name: str) -> str:
    return repr(name if len(name) <= 120 else name[:117] + "...")


class _Header(tarfile.TarInfo):
    """tarfile's header reader, refusing before it reads them: an extended header over MAX_HEADER_BYTES (tarfile
    reads one whole into memory) and GNU's old sparse type."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
        if self.type in _EXTENDED and self.size > MAX_HEADER_BYTES:
            raise ArchiveError(f"an extended header of {self.size} bytes (at most {MAX_HEADER_BYTES})")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise ArchiveError(f"{_show(self.name)}: a sparse file; only regular files and directories are unpacked")
        return super()._proc_member(tar)  # type: ignore[misc]


class _Bytes:
    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.view, self.pos = memoryview(data), 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.view) if n < 0 else min(len(self.view), self.pos + n)
        out, self.pos = bytes(self.view[self.pos : end]), end
        return out


class _Gunzip:
    """A gzip stream inflated at most `n` bytes per read (tarfile's own would inflate a whole input chunk at once,
    a thousand times its size for a bomb)."""

    def __init__(self, raw: BinaryIO | _Bytes) -> None:
        self.raw, self.inflate, self.started = raw, zlib.decompressobj(16 + zlib.MAX_WBITS), False

    def read(self, n: int = _CHUNK) -> bytes:
        n = n if n > 0 else _CHUNK
        while True:
            if self.inflate.unconsumed_tail:
                out = self.inflate.decompress(self.inflate.unconsumed_tail, n)
            elif self.inflate.eof:
                if not self.inflate.unused_data.strip(b"\0"):
                    return b""
                rest = self.inflate.unused_data  # another gzip member follows (`cat a.gz b.gz`)
                self.inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                out = self.inflate.decompress(rest, n)
            else:
                chunk = self.raw.read(_CHUNK)
                if not self.started:
                    if chunk[:2] != b"\x1f\x8b":
                        raise ArchiveError("not a valid .tar.gz (no gzip header)")
                    self.started = True
                out = self.inflate.decompress(chunk, n)
                if not chunk and not out:
                    raise ArchiveError("not a valid .tar.gz (it ends before its end)")
            if out:
                return out


class _Extraction:
    """One pass over the archive's members, writing each into `root` as it streams by."""

    def __init__(self, root: Path, limits: Limits) -> None:
        self.root, self.limits = root, limits
        self.bytes = self.entries = 0

    def run(self, tar: tarfile.TarFile) -> Unpacked:
        for m in tar:
            parts = _parts(m.name)
            if not parts:  # "./": the root itself
                if not m.isdir():
                    raise ArchiveError(f"{_show(m.name)}: not a file name")
                continue
            name = "/".join(parts)
            try:
                self._member(tar, m, parts, name)
            except ArchiveError:
                raise
            except (tarfile.TarError, EOFError, zlib.error) as e:
                raise ArchiveError(f"{_show(name)}: not a valid .tar.gz ({_why(e)})") from None
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise NoSpace(e.errno, "no space left on the server's disk") from None
                raise ArchiveError(f"{_show(name)}: cannot be created ({e.strerror or e})") from None
        return Unpacked(self.bytes, self.entries)

    def _count(self, name: str, size: int) -> None:
        self.entries += 1
        if self.entries > self.limits.entries:
            raise TooLarge(f"{_show(name)}: more than {self.limits.entries} files and directories", "entries",
                           self.limits.entries)  # fmt: skip
        self._charge(name, footprint(size))

    def _charge(self, name: str, n: int) -> None:
        self.bytes += n
        if self.bytes > self.limits.bytes:
            raise TooLarge(f"{_show(name)}: unpacks to more than {self.limits.bytes} bytes", "bytes", self.limits.bytes)

    def _dirs(self, parts: list[str], upto: int) -> None:
        """Make the directories `parts[:upto]` that do not exist yet, each counted."""
        path = self.root
        for i in range(upto):
            path = path / parts[i]
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                if not os.path.isdir(path) or os.path.islink(path):
                    raise ArchiveError(
                        f"{_show('/'.join(parts))}: {_show('/'.join(parts[: i + 1]))} is a file"
                    ) from None
                continue
            self._count("/".join(parts[: i + 1]), 0)

    def _member(self, tar: tarfile.TarFile, m: tarfile.TarInfo, parts: list[str], name: str) -> None:
        if m.type in _KINDS:
            raise ArchiveError(f"{_show(name)}: {_KINDS[m.type]}; only regular files and directories are unpacked")
        if m.sparse is not None:
            raise ArchiveError(f"{_show(name)}: a sparse file; only regular files and directories are unpacked")
        if m.isdir():
            if m.size:
                raise ArchiveError(f"{_show(name)}: a directory with {m.size} bytes of data")
            self._dirs(parts, len(parts) - 1)
            path = self.root.joinpath(*parts)
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                if os.path.isdir(path) and not os.path.islink(path):
                    return  # named again, or after what is in it: nothing new
                raise ArchiveError(f"{_show(name)}: appears twice") from None
            self._count(name, 0)
            return
        if not m.isreg():
            raise ArchiveError(f"{_show(name)}: type {m.type!r} is not unpacked; only regular files and directories")
        self._dirs(parts, len(parts) - 1)
        if m.size > self.limits.bytes - self.bytes:  # early, by what the header claims; counted below as written
            raise TooLarge(f"{_show(name)}: unpacks to more than {self.limits.bytes} bytes", "bytes", self.limits.bytes)
        path = self.root.joinpath(*parts)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except (FileExistsError, IsADirectoryError):
            raise ArchiveError(f"{_show(name)}: appears twice") from None
        self._count(name, 0)
        written = 0
        src = tar.extractfile(m)
        assert src is not None
        with os.fdopen(fd, "wb") as out:
            while chunk := src.read(_CHUNK):
                self._charge(name, footprint(written + len(chunk)) - footprint(written))
                written += len(chunk)
                out.write(chunk)
            os.fchmod(out.fileno(), 0o755 if m.mode & 0o100 else 0o644)
        if written != m.size:
            raise ArchiveError(f"{_show(name)}: {written} of its {m.size} bytes are in the archive")
        if 0 <= m.mtime < 1 << 33:
            os.utime(path, (m.mtime, m.mtime), follow_symlinks=False)


def _parts(name: str) -> list[str]:
    """The entry's path as components; absolute paths and `..` are refused (never rewritten)."""
    if name.startswith("/"):
        raise ArchiveError(f"{_show(name)}: an absolute path; the archive's names must be relative to its root")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveError(f"{_show(name)}: '..' in its path; the archive's names must stay inside it")
    if any("\0" in p for p in parts):
        raise ArchiveError(f"{_show(name)}: a NUL byte in its name")
    if not utf8(name):  # a name the filesystem holds but an object store, a URL or JSON cannot
        raise ArchiveError(f"{_show(name)}: its name is not UTF-8")
    return parts


def utf8(name: str) -> bool:
    """Whether a name (as Python decodes file names: bytes that are not UTF-8 become lone surrogates) is UTF-8."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(name: str) -> str:
    """A file name as UTF-8 text, bytes that are not UTF-8 escaped as `\\xff` (a workload may write any name)."""
    return name if utf8(name) else os.fsencode(name).decode("utf-8", "backslashreplace")
