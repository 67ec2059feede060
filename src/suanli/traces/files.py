"""Opening trace files: the default `open_text` the dispatcher is given (plain text or gzip, UTF-8)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import TextIO

_GZIP_MAGIC = b"\x1f\x8b"


def open_text_file(path: str | Path) -> TextIO:
    """Open `path` for reading as UTF-8 text, decompressing it when it is gzip (by its magic bytes, not its name).

    The caller closes the stream (``with open_text_file(p) as f: ...``). Raises `OSError` when it cannot be opened.
    """
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")
