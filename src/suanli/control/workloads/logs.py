"""Reading a workload's logs: the current attempt's file of one node-rank, in byte ranges a client follows."""

from __future__ import annotations

import codecs
import os
from pathlib import Path

from sqlalchemy.orm import Session

from suanli.control.errors import Invalid
from suanli.control.ids import utcnow
from suanli.control.scheduling.clock import seconds
from suanli.db.models import Allocation, Workload
from suanli.executors import executor
from suanli.storage import workdirs


def check_rank(s: Session, w: Workload, rank: int) -> None:
    """A node-rank the workload has on its (current or last) allocation, or a 422 that says how many there are: an
    empty answer would look like a rank that printed nothing. Before it is placed, how many it will have is not
    known yet (an elastic gang, nodes the scheduler picks): every rank reads empty then."""
    alloc = s.get(Allocation, w.allocation_id) if w.allocation_id else None
    if alloc is None:
        return
    count = max(1, len(alloc.placement))
    if rank >= count:
        last = "0" if count == 1 else f"0 to {count - 1}"
        raise Invalid(f"rank: {w.name} has {count} node-rank{'s' if count > 1 else ''} ({last}); got {rank}")


def read(home: Path, w: Workload, rank: int, offset: int, limit: int) -> tuple[str, int, bool]:
    """(text, next offset, at end of file). Never splits a UTF-8 character across chunks; an offset at or past
    the end reads nothing (it is never sought to: past the filesystem's largest file, seek fails)."""
    if w.attempt == 0:
        return "", offset, True
    if w.executor == "virtual" and w.handle is not None and w.state == "running":
        executor("virtual").poll(w.handle, seconds(utcnow()))  # writes the progress lines due by now
    path = workdirs.log_dir(home, w.id, w.attempt) / f"rank-{rank}.log"
    try:
        with path.open("rb") as f:
            if offset >= os.fstat(f.fileno()).st_size:
                return "", offset, True
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
