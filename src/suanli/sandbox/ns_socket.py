"""A socket made inside a running sandbox's own network namespace (`network: private`), for the server's proxy.

A socket belongs to the network namespace it was made in, whichever thread uses it later. So it is made in a
thread of its own that joins the sandbox's namespace (`setns` moves the calling thread only) and then ends: no
server thread ever stays in a tenant's namespace. Joining needs CAP_SYS_ADMIN over the namespace, so a root server.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

from suanli.sandbox.record import running
from suanli.sandbox.syscalls import CLONE_NEWNET, call


class NoWayIn(OSError):
    """The sandbox's namespace cannot be joined (not running, or this server is not root)."""


def own_network(sandbox_file: Path | str) -> bool:
    """Whether a running sandbox has a network namespace of its own (private or none), not the host's."""
    found = running(sandbox_file)
    return found is not None and found[0].get("network", "host") != "host"


def _handle(init: int) -> tuple[int, bool]:
    """A descriptor that names the process `init` itself (a pidfd: setns takes it, Linux 5.8 and later), or its
    network namespace by path where there is none. (fd, is_pidfd)"""
    try:
        return os.pidfd_open(init), True
    except (AttributeError, OSError):
        return os.open(f"/proc/{init}/ns/net", os.O_RDONLY | os.O_CLOEXEC), False


def socket_in(sandbox_file: Path | str, family: int) -> socket.socket:
    """A new, unconnected TCP socket in the namespace of the sandbox `sandbox_file` records."""
    found = running(sandbox_file)
    if found is None:
        raise NoWayIn("the sandbox is not running")
    init = found[1]
    fd, is_pidfd = _handle(init)
    try:
        # Checked again with the handle held: the process it names is still that sandbox's init (with a pidfd, a
        # recycled pid cannot slip in between: the handle names the process, not the number).
        again = running(sandbox_file)
        if again is None or again[1] != init:
            raise NoWayIn("the sandbox is not running")
        if is_pidfd:
            try:
                signal.pidfd_send_signal(fd, 0)
            except OSError:
                raise NoWayIn("the sandbox is not running") from None
        made: dict[str, object] = {}

        def make() -> None:
            try:
                call("setns", fd, CLONE_NEWNET)
            except OSError as e:
                made["error"] = NoWayIn(e.errno, f"cannot enter the sandbox's network: {e.strerror}")
                return
            try:
                made["socket"] = socket.socket(family, socket.SOCK_STREAM)
            except OSError as e:
                made["error"] = e

        worker = threading.Thread(target=make, name="suanli-netns-socket", daemon=True)
        try:
            worker.start()
        except RuntimeError as e:  # no thread to be had: a 503, not a 500
            raise NoWayIn(f"cannot enter the sandbox's network now: {e}") from None
        worker.join()
    finally:
        os.close(fd)
    if "socket" in made:
        return made["socket"]  # type: ignore[return-value]
    error = made.get("error")
    raise error if isinstance(error, OSError) else NoWayIn("cannot enter the sandbox's network")
