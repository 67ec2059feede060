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
    return set(family_top_down(root))


def family_top_down(root: int) -> list[int]:
    """`family(root)` with every process after its parent: breadth first from `root`, then from each session member
    the walk did not reach (oldest first: a parent starts before its child). A stop is passed on in this order: a
    shell that gets its SIGTERM after a child has died may already have left its `wait` and exited, its trap unrun."""
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for pid, st in sorted(stats.items()):
        children.setdefault(st[1], []).append(pid)
    order: list[int] = []
    seen = {root}

    def walk(start: int) -> None:
        queue, i = [start], 0
        while i < len(queue):
            for child in children.get(queue[i], ()):
                if child not in seen:
                    seen.add(child)
                    order.append(child)
                    queue.append(child)
            i += 1

    walk(root)
    # A session member's parent may be outside the family; its children may have left the session (setsid).
    for pid, _ in sorted(((p, st) for p, st in stats.items() if st[2] == root), key=lambda x: (x[1][3], x[0])):
        if pid not in seen:
            seen.add(pid)
            order.append(pid)
            walk(pid)
    return order


def kill_family(root: int, sig: int) -> int:
    """Send `sig` to `family(root)`, parents first; how many processes were signalled."""
    n = 0
    for pid in family_top_down(root):
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
