"""Which loopback listener belongs to which sandbox: the proxy forwards to a port only when a process of that
workload's sandbox holds the listening socket.

A sandbox on the host network shares the host's loopback with every other sandbox and with the host's own services;
a port number alone would let a tenant's `ports: [8265]` reach somebody else's service. The listening socket's
inode (from /proc/net/tcp{,6} of the sandbox's network namespace) must be an open file of one of the sandbox's
processes (descendants of its bwrap).
"""

from __future__ import annotations

import os
from pathlib import Path

from suanli.sandbox.record import ppid, running

LISTEN = "0A"
LOOPBACK_OR_ANY = {
    "0100007F": "127.0.0.1",
    "00000000": "127.0.0.1",
    "00000000000000000000000001000000": "::1",
    "00000000000000000000000000000000": "::1",
    "0000000000000000FFFF00000100007F": "127.0.0.1",
}


def _listeners(pid: int, port: int) -> dict[int, str]:
    """Listening TCP sockets on `port` bound to loopback or any address, in `pid`'s network namespace: inode ->
    the address to connect to."""
    found: dict[int, str] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != LISTEN:
                continue
            addr, _, hexport = f[1].partition(":")
            if int(hexport, 16) == port and addr in LOOPBACK_OR_ANY:
                found[int(f[9])] = LOOPBACK_OR_ANY[addr]
    return found


def _descendants(roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (parent := ppid(int(name))) is not None:
            children.setdefault(parent, []).append(int(name))
    out, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        if pid in out:
            continue
        out.add(pid)
        stack.extend(children.get(pid, ()))
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    return inodes


def owned_listener(sandbox_file: Path, port: int) -> str | None:
    """The address to connect to for `port` when processes of the sandbox recorded in `sandbox_file` hold every
    socket listening on it (on loopback or any address); None when nobody of that sandbox does, or when somebody
    else listens there too: with SO_REUSEPORT (vLLM sets it) another process of the same uid may bind the same port,
    and the kernel hands it a share of the connections, with the prompts and whatever they carry."""
    found = running(sandbox_file)  # None once the sandbox ended: its pids may be somebody else's now
    if found is None:
        return None
    _, init, bwrap = found
    listeners = _listeners(init, port)
    if not listeners:
        return None
    held: set[int] = set()
    for pid in _descendants(bwrap | {init}):
        held |= _socket_inodes(pid) & listeners.keys()
    if held != listeners.keys():
        return None
    return listeners[min(held)]


def host_listener(port: int) -> str | None:
    """An unsandboxed workload's port (the operator's own work, `sandbox: off`): any loopback listener."""
    listeners = _listeners(os.getpid(), port)
    return next(iter(listeners.values()), None)
