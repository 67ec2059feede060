"""glibc's allocator tuned for streaming large bodies: a process that moves a file through HTTP allocates and
frees a buffer of 64 KiB to a few MiB per chunk. By default glibc maps each one above 128 KiB fresh from the kernel
(and hands the heap's free top back past 128 KiB), so every chunk costs a page fault per 4 KiB and the zeroing of
its pages: measured, a third of a 1 GiB copy through the API. Serving these sizes from the heap, and keeping up to
32 MiB of it free for the next chunk, removes that. Elsewhere than glibc, nothing is done."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 4 << 20  # chunks up to this come from the heap (the API's largest buffers are 4 MiB)
TRIM_THRESHOLD = 32 << 20  # free heap kept for the next chunk rather than given back


def tune_for_streams() -> bool:
    """Set the two thresholds (once per process; later calls only repeat it). True if glibc took them."""
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        )
    return False
