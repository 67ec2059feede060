"""The room copies into one volume share. Each copy measures the tree as it starts; two copies at once each saw
the whole room left and together could take twice it. So each copy holds a claim, in a small file beside the
tree (`room.json`, changed under a lock on `room.lock`: every server process of the host sees it): the bytes it
has written so far. A copy may take bytes while the tree it measured, plus every other claim that tree does not
hold yet, plus its own, stays within the volume's size. A claim registers before its copy measures; once the copy
ends it is marked with the sequence number of its end, and counts for the copies that started before that (their
measure lacks its bytes) until they end too. A claim of a process that is gone is dropped.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Callable, Iterator
from typing import Any

from suanli.storage.volumes import OverSize, Paths

_STATE, _LOCK = "room.json", "room.lock"
_PID, _START, _END, _BYTES = range(4)


class Claim:
    """One copy's bytes, counted against the others' room (`take`) until `close`."""

    def __init__(self, p: Paths, size: int) -> None:
        self.p, self.size, self.id = p, size, secrets.token_hex(8)
        self.used = size  # nothing may be taken until `measured`
        with self._state() as st:
            st["seq"] += 1
            self.start = st["seq"]
            st["claims"][self.id] = [os.getpid(), self.start, None, 0]

    def measured(self, used: int) -> int:
        """The tree held `used` bytes when measured (after this claim registered). Returns the room left now."""
        self.used = used
        with self._state() as st:
            return _size(st, self.size) - used - self._others(st)

    def left(self) -> int:
        """The room the others leave now (before what this copy holds)."""
        with self._state() as st:
            return max(_size(st, self.size) - self.used - self._others(st), 0)

    def take(self, total: int, what: str = "this file would need") -> None:
        """This copy now holds `total` bytes (in whole blocks); OverSize if that is past the room the others leave."""
        with self._state() as st:
            left = _size(st, self.size) - self.used - self._others(st)
            if total > left:
                raise OverSize(f"{what} more than the {max(left, 0)} bytes left in the volume")
            mine = st["claims"].get(self.id)
            if mine is not None:
                mine[_BYTES] = total

    def close(self) -> None:
        """The copy has ended: its bytes (if it took any) count for the copies that started before, no others."""
        with self._state() as st:
            mine = st["claims"].get(self.id)
            if mine is None:
                return
            if mine[_BYTES] == 0:
                del st["claims"][self.id]
            else:
                st["seq"] += 1
                mine[_END] = st["seq"]

    def _others(self, st: dict[str, Any]) -> int:
        return sum(c[_BYTES] for cid, c in st["claims"].items()
                   if cid != self.id and (c[_END] is None or c[_END] > self.start))  # fmt: skip

    def _state(self) -> contextlib.AbstractContextManager[dict[str, Any]]:
        return _state(self.p)


def resize(p: Paths, size: int, held: Callable[[], int]) -> int:
    """Make `size` the volume's size for the copies under way and those to come (each reads it at every `take`),
    if what the volume holds (`held()`: its tree and the uploads waiting beside it, read under the lock) and what
    the copies under way have written fit in it; else OverSize. A shrink that measured the tree alone let an
    upload held or still arriving land past the new size. Returns what was counted."""
    with _state(p) as st:
        total = held() + sum(c[_BYTES] for c in st["claims"].values() if c[_END] is None)
        if total > size:
            raise OverSize(f"it holds {total} bytes with the uploads under way or held in it")
        st["size"] = size
        return total


def _size(st: dict[str, Any], claimed: int) -> int:
    """The volume's size now: as a resize left it, or as the copy found it when it began."""
    size = st.get("size")
    return size if isinstance(size, int) else claimed


@contextlib.contextmanager
def _state(p: Paths) -> Iterator[dict[str, Any]]:
    fd = os.open(p.root / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            st = json.loads((p.root / _STATE).read_text(encoding="ascii"))
            if not isinstance(st, dict) or not isinstance(st.get("claims"), dict):
                raise ValueError
        except (OSError, ValueError):
            st = {"seq": 0, "claims": {}}
        yield st
        _forget(st)
        tmp = p.root / f".{_STATE}.{os.getpid()}"
        tmp.write_text(json.dumps(st), encoding="ascii")
        os.replace(tmp, p.root / _STATE)
    finally:
        os.close(fd)  # (the lock goes with it)


def _forget(st: dict[str, Any]) -> None:
    """Drop the claims of processes that are gone, and ended ones no running copy started before the end of."""
    claims: dict[str, list[Any]] = st["claims"]
    for cid in [cid for cid, c in claims.items() if not _alive(c[_PID])]:
        del claims[cid]
    first = min((c[_START] for c in claims.values() if c[_END] is None), default=None)
    for cid in [cid for cid, c in claims.items() if c[_END] is not None and (first is None or c[_END] < first)]:
        del claims[cid]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
