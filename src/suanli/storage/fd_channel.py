"""Messages with file descriptors over a Unix stream socket, and kernel copies between descriptors.

The same-host copy path (`api.local_copy` on the server, `client.local_copy` in the SDK) passes open files
instead of their bytes: a message is a 4-byte length, a JSON object, and up to `MAX_FDS` descriptors sent with its
first byte (SCM_RIGHTS). Either side bounds what it reads. The server only ever uses descriptors the tenant's own
process opened (so the tenant's file permissions decide what can be read or written), and it checks each one
before it touches it (`check_fd`): a regular file, opened the right way, not on a FUSE filesystem whose reads a
tenant could stall.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import ipaddress
import json
import os
import socket
import stat
import struct
import time
from collections.abc import Callable
from typing import Any

MAX_FDS = 250  # per message (the kernel's SCM_MAX_FD is 253)
MAX_MESSAGE = 4 << 20  # bytes of JSON one message may carry
STEP = 256 << 20  # a kernel copy in steps this large: progress is told and a cancel is seen between steps
FUSE_SUPER_MAGIC = 0x65735546
# The kernel's own filesystems (statfs f_type): some of their files check the capabilities of whoever reads or
# writes them as it happens, not of who opened them, so a root server must never be the one that reads or writes.
KERNEL_FS = {0x9FA0: "proc", 0x62656572: "sysfs", 0x64626720: "debugfs", 0x74726163: "tracefs",
             0x73636673: "securityfs", 0x62656570: "configfs", 0x27E0EB: "cgroup", 0x63677270: "cgroup2",
             0xCAFE4A11: "bpf", 0xDE5E81E4: "efivarfs", 0x6165676C: "pstore", 0xF97CFF8C: "selinuxfs",
             0x43415D53: "smackfs", 0x42494E4D: "binfmt_misc", 0x65735543: "fusectl"}  # fmt: skip
_HEAD = struct.Struct("!I")


class ChannelError(Exception):
    """The peer broke the protocol (or went away): the connection is dropped."""


class BadDescriptor(ValueError):
    """A descriptor that is not an open regular file of the kind asked for."""


def loopback_host(host: str) -> bool:
    """A host name or address of this machine's loopback: where a same-host copy may be offered and taken."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def send(sock: socket.socket, msg: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    if len(fds) > MAX_FDS:
        raise ValueError(f"at most {MAX_FDS} descriptors a message")
    body = json.dumps(msg, separators=(",", ":")).encode()
    if len(body) > MAX_MESSAGE:
        raise ValueError(f"a message of {len(body)} bytes is over {MAX_MESSAGE}")
    data = _HEAD.pack(len(body)) + body
    if fds:
        sent = socket.send_fds(sock, [data], list(fds))
        data = data[sent:]
    if data:
        sock.sendall(data)


def recv(sock: socket.socket, max_fds: int = MAX_FDS) -> tuple[dict[str, Any], list[int]]:
    """One message and the descriptors that came with it (the caller closes them). More descriptors than
    `max_fds`, a truncated set, a message over `MAX_MESSAGE`, not a JSON object, nested deeper than the parser
    recurses or holding a lone surrogate (which no database or path encodes): `ChannelError` (any descriptors
    received are closed first). Where the socket has a timeout, the whole message must come within it (a peer
    trickling a byte at a time is not waited for without end): `TimeoutError` otherwise."""
    timeout = sock.gettimeout()
    deadline = None if timeout is None else time.monotonic() + timeout
    head, fds, flags, _ = socket.recv_fds(sock, _HEAD.size, MAX_FDS + 3)
    try:
        if flags & socket.MSG_CTRUNC or len(fds) > max_fds:
            raise ChannelError(f"at most {max_fds} descriptors a message")
        head += _exactly(sock, _HEAD.size - len(head), deadline) if head else b""
        if not head:
            raise ChannelError("the peer closed the connection")
        (n,) = _HEAD.unpack(head)
        if n > MAX_MESSAGE:
            raise ChannelError(f"a message of {n} bytes is over {MAX_MESSAGE}")
        try:
            raw = _exactly(sock, n, deadline)
            msg = json.loads(raw)
            if b"\\ud" in raw or b"\\uD" in raw or b"\xed" in raw:  # a surrogate, escaped or in UTF-8: one alone
                json.dumps(msg, ensure_ascii=False).encode()  # ("\ud800") is no text a path or a row holds
        except (ValueError, RecursionError):  # (UnicodeError is a ValueError)
            raise ChannelError("a message is not JSON text (or it is nested too deeply)") from None
        if not isinstance(msg, dict):
            raise ChannelError("a message must be a JSON object")
        return msg, fds
    except BaseException:
        close_all(fds)
        raise
    finally:
        sock.settimeout(timeout)


def _exactly(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the rest of the message did not come in time")
            sock.settimeout(left)
        got = sock.recv(min(n - len(buf), 1 << 20))
        if not got:
            raise ChannelError("the peer closed the connection mid-message")
        buf += got
    return bytes(buf)


def close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


# ---- what a passed descriptor may be -------------------------------------------------------------------------------
class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 112)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def fs_type(fd: int) -> int:
    buf = _StatFs()
    if _libc.fstatfs(fd, ctypes.byref(buf)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(buf.f_type) & 0xFFFFFFFF


def check_fd(fd: int, *, write: bool) -> os.stat_result:
    """The descriptor's stat if it is a regular file opened for reading (or, with `write`, for writing, not in
    append mode and not sealed against it), not with O_PATH or O_DIRECT, on a filesystem other than FUSE and the kernel's own (`KERNEL_FS`);
    else `BadDescriptor` saying why."""
    try:
        st = os.fstat(fd)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        raise BadDescriptor("not an open file") from None
    if not stat.S_ISREG(st.st_mode):
        raise BadDescriptor("not a regular file (a directory, pipe, socket or device is refused)")
    for flag in ("O_PATH", "O_DIRECT"):  # neither can be copied from or to in the kernel (EBADF, EINVAL)
        if flags & getattr(os, flag):
            raise BadDescriptor(f"opened with {flag}; open it plainly")
    access = flags & os.O_ACCMODE
    if write and (access not in (os.O_WRONLY, os.O_RDWR) or flags & os.O_APPEND):
        raise BadDescriptor("not opened for writing (or opened to append)")
    if not write and access not in (os.O_RDONLY, os.O_RDWR):
        raise BadDescriptor("not opened for reading")
    if write and _seals(fd) & _NO_WRITE:
        raise BadDescriptor("sealed against writing, growing or shrinking (a memfd)")
    try:
        kind = fs_type(fd)
    except OSError:
        raise BadDescriptor("its filesystem cannot be told") from None
    if kind == FUSE_SUPER_MAGIC:
        raise BadDescriptor("on a FUSE filesystem (its reads could stall the server); copy it over HTTP")
    if kind in KERNEL_FS:
        raise BadDescriptor(f"a file of the kernel's {KERNEL_FS[kind]} filesystem, not one to copy")
    return st


_NO_WRITE = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)


def _seals(fd: int) -> int:
    try:
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:  # EINVAL: a file that takes no seals
        return 0


# ---- kernel copies ------------------------------------------------------------------------------------------------
def copy(src: int, dst: int, count: int, src_off: int = 0, dst_off: int = 0,
         step: Callable[[int], None] | None = None) -> int:  # fmt: skip
    """Copy up to `count` bytes from `src` at `src_off` to `dst` at `dst_off` in the kernel: copy_file_range (a
    reflink where the filesystem shares extents), else sendfile, else reads and writes. Stops early at the source's
    end. `step(bytes so far)` is called every `STEP` bytes (it may raise to cancel). Returns the bytes copied."""
    done = 0
    how = "range"
    while done < count:
        want = min(STEP, count - done)
        n = _copy_some(src, dst, want, src_off + done, dst_off + done, how)
        if n < 0:  # the way tried is not available between these two files: the next one
            how = "sendfile" if how == "range" else "rw"
            continue
        if n == 0:
            break
        done += n
        if step is not None and done < count and done % STEP == 0:
            step(done)
    return done


def _copy_some(src: int, dst: int, want: int, src_off: int, dst_off: int, how: str) -> int:
    """Up to `want` bytes (all of them unless the source ends); -1 where `how` is unsupported here."""
    got = 0
    while got < want:
        try:
            if how == "range":
                n = os.copy_file_range(src, dst, want - got, src_off + got, dst_off + got)
            elif how == "sendfile":
                os.lseek(dst, dst_off + got, os.SEEK_SET)
                n = os.sendfile(dst, src, src_off + got, want - got)
            else:
                chunk = os.pread(src, min(want - got, 1 << 20), src_off + got)
                n = os.pwrite(dst, chunk, dst_off + got) if chunk else 0
        except OSError as e:
            if got == 0 and how != "rw" and e.errno in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                return -1
            raise
        if n == 0:
            break
        got += n
    return got
