"""A job's working directory packed for upload: a deterministic .tar.gz in memory, refused early when too big."""

from __future__ import annotations

import io
import os
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


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_workdir(root: Path | str, limit: int | None = None) -> bytes:
    """A job's working directory as a .tar.gz in memory (names relative to `root`), without `.git`,
    `__pycache__` and `.venv` anywhere in it; a ValueError once the archive grows past `limit` bytes
    (default WORKDIR_LIMIT, what the server accepts)."""
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
                    tar.add(path, arcname=path.relative_to(root).as_posix(), recursive=False, filter=_anonymous)
    except _TooLarge:
        skipped = ", ".join(sorted(WORKDIR_SKIP))
        raise ValueError(
            f"workdir {root} is over {limit / (1 << 20):g} MiB compressed (without {skipped}): "
            "upload less (a smaller --workdir) and keep data sets on the cluster's storage"
        ) from None
    return buf.getvalue()
