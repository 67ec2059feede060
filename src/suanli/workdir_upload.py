"""A job's working directory packed for upload: a deterministic .tar.gz in memory, refused early when too big."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

WORKDIR_LIMIT = 64 << 20  # bytes of .tar.gz a job may upload
WORKDIR_SKIP = frozenset({".git", "__pycache__", ".venv"})


class _Capped(io.BytesIO):
    """An in-memory file that notes when it grows past `limit` bytes and drops what comes after."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.over = False

    def write(self, b: Any) -> int:
        if self.over:
            return len(b)
        n = super().write(b)
        if self.tell() > self.limit:
            self.over = True
            raise _TooLarge
        return n


class _TooLarge(Exception):
    pass


def _entry(path: Path, arcname: str, st: os.stat_result) -> tarfile.TarInfo:
    """A directory or regular file's header, anonymous (no owner names or ids), with its mode and mtime."""
    info = tarfile.TarInfo(arcname)
    info.type = tarfile.DIRTYPE if stat.S_ISDIR(st.st_mode) else tarfile.REGTYPE
    info.size = st.st_size if info.type == tarfile.REGTYPE else 0
    info.mode, info.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
    return info


def pack_workdir(root: Path | str, limit: int | None = None) -> bytes:
    """A job's working directory as a .tar.gz in memory (names relative to `root`), without `.git`,
    `__pycache__` and `.venv` anywhere in it; a ValueError once the archive grows past `limit` bytes
    (default WORKDIR_LIMIT, what the server accepts). Only directories and regular files go up, as the server
    unpacks nothing else: a hard-linked file goes as a file each time it appears, and a symbolic link or a
    special file is a ValueError naming it."""
    limit = WORKDIR_LIMIT if limit is None else limit
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ValueError(f"workdir {root} is not a directory")
    buf = _Capped(limit)
    try:
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for top, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if d not in WORKDIR_SKIP)
                base = Path(top)
                for name in [*dirs, *sorted(files)]:
                    path = base / name
                    st = path.lstat()
                    arcname = path.relative_to(root).as_posix()
                    if stat.S_ISLNK(st.st_mode):
                        raise ValueError(f"workdir {root}: {arcname} is a symbolic link; the server unpacks only "
                                         "files and directories (copy what it points to, or remove it)")  # fmt: skip
                    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                        raise ValueError(f"workdir {root}: {arcname} is not a file or a directory")
                    if stat.S_ISDIR(st.st_mode):
                        tar.addfile(_entry(path, arcname, st))
                        continue
                    with path.open("rb") as f:
                        tar.addfile(_entry(path, arcname, st), f)
    except _TooLarge:
        skipped = ", ".join(sorted(WORKDIR_SKIP))
        raise ValueError(
            f"workdir {root} is over {limit / (1 << 20):g} MiB compressed (without {skipped}): "
            "upload less (a smaller --workdir) and keep data sets on the cluster's storage"
        ) from None
    return buf.getvalue()
