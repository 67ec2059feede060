"""A running sandbox as its record (`rank-N.sandbox.json`: bwrap's pids and its init's) says, checked against /proc:
the init must still be bwrap's child, or the pid was recycled and names somebody else's namespaces. Standard
library only: `suanli.sandbox.join` imports it in a process that may have little else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def ppid(pid: int) -> int | None:
    """The parent of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def running(sandbox_file: Path | str) -> tuple[dict[str, Any], int, set[int]] | None:
    """(the record, the init's pid, bwrap's pids) while the sandbox runs; None when it does not (no record, or an
    init that is no longer bwrap's child)."""
    try:
        with open(sandbox_file, encoding="utf-8") as f:
            box = json.load(f)
        init, bwrap = int(box["init_pid"]), {int(p) for p in box.get("bwrap_pids", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return (box, init, bwrap) if ppid(init) in bwrap else None
