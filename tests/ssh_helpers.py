"""The real OpenSSH client against the SSH gateway: keys, options, and a skip (or, in CI, a failure) without it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REQUIRE_ENV = "SUANLI_REQUIRE_OPENSSH"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"


def require_openssh() -> None:
    """ssh, scp and sftp-server (Debian's openssh-client and openssh-sftp-server): .ci/run installs them."""
    missing = [x for x in ("ssh", "scp", "ssh-keygen") if shutil.which(x) is None]
    if not os.path.exists(SFTP_SERVER):
        missing.append(SFTP_SERVER)
    if missing:
        why = f"{', '.join(missing)} missing (apt-get install openssh-client openssh-sftp-server)"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {why}", pytrace=False)
        pytest.skip(f"{why}; {REQUIRE_ENV}=1 fails instead")


def wait_listening(port: int, timeout: float = 30.0) -> None:
    """The gateway starts in a child process of the server, after the API answers: wait for its port."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def keygen(path: Path, kind: str = "ed25519", bits: int | None = None) -> Path:
    """A new key pair without a passphrase; returns the private key's path (the public one is beside it)."""
    args = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", path.name, "-f", str(path)]
    subprocess.run([*args, *(["-b", str(bits)] if bits else [])], check=True, capture_output=True)
    return path


def options(key: Path, port: int) -> list[str]:
    return ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
            "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=20", "-i", str(key),
            "-p", str(port)]  # fmt: skip


def ssh(key: Path, port: int, login: str, *command: str, tty: bool = False, timeout: float = 60,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    argv = ["ssh", *options(key, port), *(["-tt"] if tty else []), f"{login}@127.0.0.1"]
    return subprocess.run([*argv, *(["--", *command] if command else [])], capture_output=True, text=True,
                          timeout=timeout, input=stdin)  # fmt: skip


def scp(key: Path, port: int, src: str, dst: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    opts = [o if o != "-p" else "-P" for o in options(key, port)]
    return subprocess.run(["scp", "-q", *opts, src, dst], capture_output=True, text=True, timeout=timeout)
