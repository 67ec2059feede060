"""Turning a mount of a live sandbox read-only: what the storage sweep does to a volume found over its size while
workloads write to it, so their next writes fail (EROFS) inside the sandbox.

Needs root on the sandbox's host (the server's, for the local executor): `nsenter` joins the sandbox's mount
namespace (that of its init, whose pid the rank supervisor recorded) and remounts the bind read-only there; the
host and other sandboxes are untouched. Files already open for writing keep working until closed: the kernel checks
a mount's read-only flag when a file is opened for writing, and on some writes (a new file, a rename) after that.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from suanli.sandbox.record import running


def remount_read_only(sandbox_file: Path, dest: str) -> bool:
    """Remount `dest` read-only inside the sandbox `sandbox_file` describes; False when it cannot be done here (not
    root, the sandbox gone, no nsenter)."""
    nsenter = shutil.which("nsenter")
    if os.geteuid() != 0 or nsenter is None:
        return False
    found = running(sandbox_file)  # None for a recycled pid too: somebody else's namespace
    if found is None:
        return False
    init = found[1]
    argv = [nsenter, f"--target={init}", "--mount", "--", "mount", "-o", "remount,bind,ro", dest]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
