"""The gateway's host key: generated once, kept in the data directory (mode 0600), so clients that trusted it
once (known_hosts) keep trusting the same server across restarts."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

HOST_KEY_FILE = "ssh_host_ed25519_key"


def host_key_path(home: Path) -> Path:
    return home / HOST_KEY_FILE


def ensure_host_key(home: Path) -> Path:
    """The private key's path, generating an ed25519 key first if there is none. Written to a private temporary
    file and linked into place, so two processes starting at once agree on one key and nobody ever reads a
    partial or world-readable one."""
    import asyncssh

    path = host_key_path(home)
    if path.exists():
        _check_mode(path)
        return path
    home.mkdir(parents=True, exist_ok=True)
    key = asyncssh.generate_private_key("ssh-ed25519", comment="suanli-gateway")
    tmp = path.with_name(f".{HOST_KEY_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key.export_private_key("openssh"))
        with contextlib.suppress(FileExistsError):  # another process won the race: its key stands
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    pub = path.with_name(HOST_KEY_FILE + ".pub")
    if not pub.exists():
        pub.write_bytes(asyncssh.read_private_key(path).export_public_key("openssh"))
    return path


def _check_mode(path: Path) -> None:
    """sshd refuses a host key others can read; so do we, and say how to fix it."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(f"{path} is readable by others (mode {mode:o}); chmod 600 it")


def public_host_key(home: Path) -> tuple[str, str] | None:
    """The gateway's public host key in OpenSSH form ("ssh-ed25519 AAAA…") and its SHA256 fingerprint, or None
    before the gateway first started."""
    import asyncssh

    try:
        text = host_key_path(home).with_name(HOST_KEY_FILE + ".pub").read_text(encoding="ascii")
        key = asyncssh.import_public_key(text)
    except (OSError, ValueError, asyncssh.KeyImportError):
        return None
    return " ".join(text.split()[:2]), key.get_fingerprint("sha256")
