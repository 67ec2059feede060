"""Reading a workload's logs: the current attempt's file of one node-rank, in byte ranges a client follows."""

from __future__ import annotations

import codecs
from pathlib import Path

from suanli.control.ids import utcnow
from suanli.control.scheduling import seconds
from suanli.db.models import Workload
from suanli.executors import executor
from suanli.storage import workdirs


def read(home: Path, w: Workload, rank: int, offset: int, limit: int) -> tuple[str, int, bool]:
    """(text, next offset, at end of file). Never splits a UTF-8 character across chunks."""
    if w.attempt == 0:
        return "", offset, True
    if w.executor == "virtual" and w.handle is not None and w.state == "running":
        executor("virtual").poll(w.handle, seconds(utcnow()))  # writes the progress lines due by now
    path = workdirs.log_dir(home, w.id, w.attempt) / f"rank-{rank}.log"
    try:
        with path.open("rb") as f:
            f.seek(offset)
            raw = f.read(limit)
            eof = not f.read(1)
    except FileNotFoundError:
        return "", offset, True
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(raw, final=False)
    pending = len(decoder.getstate()[0])  # bytes of a character cut at the end of the chunk
    if pending and eof:
        return text + decoder.decode(b"", final=True), offset + len(raw), True
    return text, offset + len(raw) - pending, eof and not pending
