"""The sandbox on a real GPU host: a rank sees exactly the GPUs it holds, and one without GPUs sees none. Needs
NVIDIA GPUs and bubblewrap; CI has no GPU (tests/test_sandbox.py checks the same device rules on fake nodes)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.sandbox_helpers import run


def _host_gpus() -> list[str]:
    """`nvidia-smi -L` lines of this host ("GPU i: NAME (UUID: ...)"); none without a GPU or a driver."""
    if shutil.which("nvidia-smi") is None:
        return []
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return [line for line in r.stdout.splitlines() if line.startswith("GPU ")] if r.returncode == 0 else []


GPUS = _host_gpus()
pytestmark = [
    pytest.mark.skipif(not GPUS, reason="no NVIDIA GPU on this host (nvidia-smi -L lists none)"),
    pytest.mark.skipif(
        shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
        reason="bubblewrap is not installed (apt install bubblewrap); CI installs and requires it",
    ),
]


def _uuid(line: str) -> str:
    return line.rsplit("UUID: ", 1)[1].rstrip(")")


def test_a_rank_sees_exactly_the_gpu_it_holds(tmp_path: Path) -> None:
    last = len(GPUS) - 1  # on a host of several, the last one: not the one a process would pick by default
    st, log = run(tmp_path, "ls /dev | grep nvidia; nvidia-smi -L", gpus=(last,))
    assert st.exit_code == 0, log
    listed = [line for line in log.splitlines() if line.startswith("GPU ")]
    assert len(listed) == 1 and _uuid(listed[0]) == _uuid(GPUS[last]), log
    nodes = {line for line in log.splitlines() if line.startswith("nvidia") and line[6:].isdigit()}
    assert nodes == {f"nvidia{last}"}, log


def test_a_rank_without_gpus_cannot_reach_the_driver(tmp_path: Path) -> None:
    st, log = run(tmp_path, "ls /dev; nvidia-smi -L")
    assert "nvidia" not in log.split("NVIDIA-SMI")[0].lower(), log  # no device node at all
    assert st.exit_code != 0 and not any(line.startswith("GPU ") for line in log.splitlines()), log
