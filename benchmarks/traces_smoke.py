"""Hand-run smoke check (not a test): read every supported trace in a data folder and print what came out.

    python benchmarks/traces_smoke.py [../shared/data/traces]

Prints, per file: jobs, skipped and notes counts and the time taken; then recomputes the Pollux reference
durations (median profile-derived duration per application over all workload files) next to the constants.
"""

from __future__ import annotations

import glob
import itertools
import os
import statistics
import sys
import time
from collections import defaultdict

from suanli.traces import read_trace_result
from suanli.traces.common import TraceError
from suanli.traces.pollux import REFERENCE_DURATION_S

SPECS = (
    ("philly", "philly-derived/pollux_philly.csv.gz", {}),
    ("alibaba-openb", "alibaba-gpu-v2023-openb/csv/openb_pod_list_*.csv", {}),
    ("pollux", "pollux-sim/workloads*/workload-*.csv", {}),
    ("gavel", "gavel-sim/msr/seed=*/*.trace.gz", {}),
    ("gavel-physical", "gavel-sim/physical_cluster/*.trace", {}),
    ("tiresias", "tiresias-sim/60_job.csv", {}),
    ("shockwave", "shockwave-sim/traces/*.trace", {}),
)


def main(root: str) -> int:
    failures = 0
    pollux: dict[str, list[float]] = defaultdict(list)
    for fmt, pattern, options in SPECS:
        paths = sorted(glob.glob(os.path.join(root, pattern)))
        if not paths:
            print(f"{fmt:15s} no files match {pattern}")
            failures += 1
            continue
        total, skipped, notes, seconds = 0, defaultdict(int), defaultdict(int), 0.0
        for path in paths:
            t = time.perf_counter()
            try:
                result = read_trace_result(f"{fmt}:{path}", **options)
            except TraceError as e:
                if fmt == "alibaba-openb" and "untimed_duration_s" in str(e):
                    result = read_trace_result(f"{fmt}:{path}", untimed_duration_s=3600.0)
                else:
                    print(f"{fmt:15s} FAILED {path}: {e}")
                    failures += 1
                    continue
            seconds += time.perf_counter() - t
            jobs = result.jobs
            assert jobs and jobs[0].submit_time_s == 0.0, path
            assert all(a.submit_time_s <= b.submit_time_s for a, b in itertools.pairwise(jobs)), path
            assert len({j.job_id for j in jobs}) == len(jobs), path
            total += len(jobs)
            for k, v in result.skipped.items():
                skipped[k] += v
            for k, v in result.notes.items():
                notes[k] += v
            if fmt == "pollux":
                for j in jobs:
                    pollux[j.model or ""].append(j.duration_s)
            if len(paths) == 1 or fmt == "philly":
                print(f"{fmt:15s} {os.path.relpath(path, root)}: {len(jobs)} jobs in {seconds:.2f} s")
        print(
            f"{fmt:15s} {len(paths)} file(s): {total} jobs, skipped {dict(skipped) or '-'}, "
            f"notes {dict(notes) or '-'}, {seconds:.2f} s"
        )
    print("pollux reference durations (median of profile-derived, s):")
    for app in sorted(pollux):
        print(f"  {app:12s} median {statistics.median(pollux[app]):10.1f}  constant {REFERENCE_DURATION_S.get(app)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.join("..", "shared", "data", "traces")))
