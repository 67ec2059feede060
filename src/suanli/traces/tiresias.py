"""Tiresias (NSDI'19) simulator job lists, e.g. ``60_job.csv``.

Header ``job_id, num_gpu, submit_time, iterations, model_name, duration, interval``: submit time and duration in
seconds, ``iterations`` and ``interval`` (the gap to the previous arrival) are not needed. ``model_name`` becomes
the model; the job id is kept as written. Jobs with 0 GPUs or a duration <= 0 are skipped and counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from suanli.traces.common import (
    RawJob,
    TraceReadResult,
    check_width,
    csv_rows,
    finish,
    header_index,
    parse_float,
    parse_int,
)

_REQUIRED = ("job_id", "num_gpu", "submit_time", "duration")


def read_tiresias(lines: Iterable[str]) -> TraceReadResult:
    """Read a Tiresias job CSV (see the module docstring) from an iterable of text lines."""
    rows = csv_rows(lines)
    first = next(rows, None)
    if first is None:
        return finish([])
    hline, header = first
    col = header_index(header, hline, _REQUIRED)
    skipped: Counter[str] = Counter()
    raw: list[RawJob] = []
    for number, (line, row) in enumerate(rows, start=1):
        check_width(row, len(header), line)
        gpus = parse_int(row[col["num_gpu"]], line, "num_gpu", minimum=0)
        submit = parse_float(row[col["submit_time"]], line, "submit_time", minimum=0)
        duration = parse_float(row[col["duration"]], line, "duration")
        if gpus == 0:
            skipped["zero_gpus"] += 1
            continue
        if duration <= 0:
            skipped["non_positive_duration"] += 1
            continue
        model = row[col["model_name"]].strip() if "model_name" in col else ""
        fields = {
            "job_id": row[col["job_id"]].strip() or f"tiresias-{number:06d}",
            "num_gpus": gpus,
            "duration_s": duration,
            "model": model or None,
        }
        raw.append(RawJob(submit, line, fields))
    return finish(raw, skipped)
