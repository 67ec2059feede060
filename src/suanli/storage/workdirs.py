"""Where a workload's files live under the data directory, and unpacking an uploaded workdir safely.

An upload is a gzip'd tar from the client. It is unpacked with tarfile's `data` filter (no absolute paths, no
`..`, no links out of the tree, no devices), under limits on its unpacked size and member count, into a fresh
directory; a refused archive leaves nothing behind.
"""

from __future__ import annotations

import io
import secrets
import shutil
import tarfile
from pathlib import Path

MAX_UNPACKED_BYTES = 1 << 30
MAX_MEMBERS = 100_000


class ArchiveError(ValueError):
    pass


def workload_dir(home: Path, workload_id: str) -> Path:
    return home / "workloads" / workload_id


def upload_dir(home: Path, workload_id: str) -> Path:
    return workload_dir(home, workload_id) / "workdir"


def instance_disk(home: Path, workload_id: str) -> Path:
    """An instance's disk: kept when it stops, there again when it starts."""
    return workload_dir(home, workload_id) / "disk"


def log_dir(home: Path, workload_id: str, attempt: int) -> Path:
    return workload_dir(home, workload_id) / f"attempt-{attempt}"


def unpack(archive: bytes, dest: Path) -> None:
    """Unpack a .tar.gz into `dest` (created; must not exist yet)."""
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        try:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
                members = tar.getmembers()
                if len(members) > MAX_MEMBERS:
                    raise ArchiveError(f"{len(members)} files; at most {MAX_MEMBERS}")
                size = sum(m.size for m in members if m.isfile())
                if size > MAX_UNPACKED_BYTES:
                    raise ArchiveError(f"unpacks to {size} bytes; at most {MAX_UNPACKED_BYTES}")
                tar.extractall(tmp, members=members, filter="data")
        except (tarfile.TarError, EOFError, OSError) as e:
            raise ArchiveError(f"not a valid .tar.gz ({e})") from e
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def stage(archive: bytes, home: Path) -> Path:
    """Unpack into a fresh directory under `home/workloads/.incoming`, to be adopted by a workload (or discarded)."""
    dest = home / "workloads" / ".incoming" / secrets.token_hex(8)
    unpack(archive, dest)
    return dest


def adopt(staged: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    staged.rename(dest)


def discard(staged: Path | None) -> None:
    if staged is not None:
        shutil.rmtree(staged, ignore_errors=True)
