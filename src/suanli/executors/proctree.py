"""The processes of a rank, read from /proc: a process's state, parent, session and start time; a session's members;
a root's whole family (its session and every descendant, including those that left it with setsid); and the
exit-code file written whole or not at all.

Linux only, standard library only: the rank supervisor (`rankrun`) imports this at every rank start, and the
executors read the same /proc facts when they poll.
"""

from __future__ import annotations

import os


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, session id, start time in clock ticks) of a process; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        # The command name (field 2) may hold spaces and parentheses; fields after the last ')' are plain.
        rest = data[data.rindex(b")") + 2 :].split()
        return rest[0].decode(), int(rest[1]), int(rest[3]), int(rest[19])
    except (OSError, ValueError, IndexError):
        return None


def _all_stats() -> dict[int, tuple[str, int, int, int]]:
    stats: dict[int, tuple[str, int, int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return stats
    for name in names:
        if name.isdigit() and (st := proc_stat(int(name))) is not None:
            stats[int(name)] = st
    return stats


def session_members(sid: int) -> set[int]:
    """Processes whose session id is `sid`. Linux keeps a pid number allocated while it names a session."""
    return {pid for pid, st in _all_stats().items() if st[2] == sid and pid != sid}


def family(root: int) -> set[int]:
    """Processes of `root`'s session (as a session leader) and all its descendants, less `root` itself.

    Only for a live `root`: descendants of a recycled pid are strangers.
    """
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(st[1], []).append(pid)
    found = {pid for pid, st in stats.items() if st[2] == root}
    # Walk from the root and from every session member: a member's children may have left the session (setsid).
    stack = [root, *found]
    walked: set[int] = set()
    while stack:
        pid = stack.pop()
        if pid in walked:
            continue
        walked.add(pid)
        for child in children.get(pid, ()):
            found.add(child)
            stack.append(child)
    found.discard(root)
    return found


def kill_family(root: int, sig: int) -> int:
    """Send `sig` to `family(root)`; how many processes were signalled."""
    n = 0
    for pid in family(root):
        try:
            os.kill(pid, sig)
            n += 1
        except OSError:
            pass
    return n


def write_atomic(path: str, text: str) -> None:
    """Write a whole file or nothing: readers never see a partial exit code."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
