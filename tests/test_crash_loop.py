"""The crash loop (`tests/crash_loop.py`), CI-sized: a real server killed with SIGKILL three times while local
and virtual jobs run, its loop leads and submissions arrive (the last time its loop process dies with it, as in
a host crash, leaving the loop's leases to run out), on SQLite and PostgreSQL. After every crash, every restart
and at the end: no workload lost or duplicated, no GPU held twice, every transaction balanced, every balance
exactly its entries, every allocation charged exactly for its recorded start and stop (`tests/crash_checks.py`).
`benchmarks/chaos.py` is the long version."""

from __future__ import annotations

from pathlib import Path

from tests.crash_checks import CHARGED_TO_END, assert_charged_to_end
from tests.crash_loop import CrashLoop, table

KILLS = (False, False, True)  # the hard kill last: the restart that finishes waits for its lease (15 s)


def test_kill_9_three_times_with_work_in_flight_loses_and_doubles_nothing(db_url: str, tmp_path: Path) -> None:
    loop = CrashLoop(tmp_path / "home", db_url, seed=18)
    try:
        for hard in KILLS:
            c = loop.cycle(hard)
            assert not c.after_crash.broken(), (c.cycle, c.after_crash.problems[:20])
            assert c.answered > 0, "no submission got through before the kill"
        final = loop.finish(wait_launches=False)  # (benchmarks/chaos.py waits the 120 s out)
        for c in loop.cycles:
            assert c.after_restart is not None and not c.after_restart.broken(), (
                c.cycle,
                c.after_restart.problems[:20],
            )
        assert not final.broken(), final.problems[:20]
        assert sum(c.in_flight for c in loop.cycles) > 0, "no work was running when the server died"
        assert sum(1 for x in loop.subs if x.local and x.id) > 0, "no local job was submitted"
        assert loop.server_tracebacks() == 0, "a restarted server logged an error"
        print(table(loop.cycles, final))
        if CHARGED_TO_END:
            assert_charged_to_end(loop.db)
    finally:
        loop.close()
