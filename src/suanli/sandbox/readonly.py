"""Turning a mount of a live sandbox read-only: what the storage sweep does to a volume found over its size while
workloads write to it, so their next writes fail (EROFS) inside the sandbox.

Needs root on the sandbox's host (the server's, for the local executor): `nsenter` joins the sandbox's mount
namespace (that of its init, whose pid the rank supervisor recorded) and remounts the bind read-only there; the
host and other sandboxes are untouched. Files already open for writing keep working until closed: the kernel checks
a mount's read-only flag when a file is opened for writing, and on some writes (a new file, a rename) after that.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path


def _ppid(pid: int) -> int | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        return int(data[data.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def remount_read_only(sandbox_file: Path, dest: str) -> bool:
    """Remount `dest` read-only inside the sandbox `sandbox_file` describes; False when it cannot be done here (not
    root, the sandbox gone, no nsenter)."""
    nsenter = shutil.which("nsenter")
    if os.geteuid() != 0 or nsenter is None:
        return False
    try:
        box = json.loads(sandbox_file.read_text(encoding="utf-8"))
        init = int(box["init_pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if _ppid(init) not in {int(p) for p in box.get("bwrap_pids", [])}:  # a recycled pid: somebody else's namespace
        return False
    argv = [nsenter, f"--target={init}", "--mount", "--", "mount", "-o", "remount,bind,ro", dest]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
