"""The Linux calls Python's standard library lacks (setns, unshare, mount, umount2, prctl), and their constants: one
place for the rank supervisor, `join`, the private network and the proxy's way into it. Standard library only."""

from __future__ import annotations

import ctypes
import functools
import os

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NS_GET_USERNS = 0xB701  # ioctl _IO(0xb7, 0x1): the user namespace that owns a namespace
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def call(name: str, *args: object) -> int:
    """libc's `name`(*args); OSError with the errno when it returns a negative number."""
    rc = getattr(_libc(), name)(*args)
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")
    return int(rc)
