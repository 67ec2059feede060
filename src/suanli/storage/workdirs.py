"""Where a workload's files live under the data directory: an uploaded or staged workdir, an instance's disk, the
logs of each attempt; how much of the disk a tree holds, and removing one. Unpacking an upload safely is
`storage.archive`."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from suanli.storage.archive import (
    DEFAULT_LIMITS,
    ArchiveError,
    Limits,
    NoSpace,
    TooLarge,
    Unpacked,
    footprint,
    remove_tree,
    unpack,
)

__all__ = ["DEFAULT_LIMITS", "ArchiveError", "Limits", "NoSpace", "TooLarge", "Unpacked", "footprint", "measure", "remove_tree",
           "unpack"]  # fmt: skip


def workload_dir(home: Path, workload_id: str) -> Path:
    return home / "workloads" / workload_id


def upload_dir(home: Path, workload_id: str) -> Path:
    """A job's workdir: its upload, unpacked (or an empty directory), and whatever the job writes there."""
    return workload_dir(home, workload_id) / "workdir"


def incoming_dir(home: Path) -> Path:
    """Uploads unpacked and waiting for the submission that names them."""
    return home / "workloads" / ".incoming"


def staged_dir(home: Path, upload_id: str) -> Path:
    return incoming_dir(home) / upload_id


def instance_disk(home: Path, workload_id: str) -> Path:
    """An instance's disk: kept when it stops, there again when it starts."""
    return workload_dir(home, workload_id) / "disk"


def log_dir(home: Path, workload_id: str, attempt: int) -> Path:
    return workload_dir(home, workload_id) / f"attempt-{attempt}"


def measure(root: Path) -> Unpacked:
    """What a tree holds, counted as an upload is (`footprint`: whole 4 KiB blocks, a block per directory; a link
    or a special file a block), without following links. A directory the job made unreadable is opened up."""
    total = entries = 0
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            it = list(os.scandir(d))
        except PermissionError:
            try:
                os.chmod(d, 0o700)
                it = list(os.scandir(d))
            except OSError:
                continue
        except OSError:
            continue
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            entries += 1
            total += footprint(st.st_size if stat.S_ISREG(st.st_mode) else 0)
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(e.path))
    return Unpacked(total, entries)


def stage(archive: bytes, home: Path, limits: Limits | None = None) -> Path:
    """Unpack into a fresh directory under `home/workloads/.incoming`, to be adopted by a workload (or discarded)."""
    import secrets

    dest = incoming_dir(home) / secrets.token_hex(8)
    unpack(archive, dest, limits)
    return dest


def adopt(staged: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    staged.rename(dest)


def discard(staged: Path | None) -> None:
    if staged is not None:
        remove_tree(staged)
