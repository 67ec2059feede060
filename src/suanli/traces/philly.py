"""Microsoft Philly (ATC'19) job lists in CSV form, e.g. Pollux's ``philly.csv`` (``pollux_philly.csv.gz``).

That file has ``timestamp, duration, num_gpus, gpu_time, cluster``: one row per job (attempts merged), submit
times as ``YYYY-MM-DD HH:MM:SS`` (not sorted), durations in seconds, ``cluster`` the Philly virtual cluster.
The reader goes by the header, so flattened exports of the original ``cluster_job_log`` read too:

* submit time: ``timestamp`` | ``submitted_time`` | ``submit_time`` | ``submit_time_s`` (date-time text or seconds);
* duration: ``duration`` (s), else ``end_time - start_time``;
* GPUs: ``num_gpus`` | ``num_gpu`` | ``gpus``;
* tenant: ``user``, else ``vc``, else ``cluster``; job id: ``jobid`` | ``job_id``, else ``philly-000001`` … by row.

Jobs with 0 GPUs (``zero_gpus``), a missing end/start (``no_duration``) or a duration <= 0
(``non_positive_duration``) are skipped and counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime

from suanli.traces.common import (
    RawJob,
    TraceReadResult,
    check_width,
    csv_rows,
    fail,
    finish,
    parse_float,
    parse_int,
)

_TIME = ("timestamp", "submitted_time", "submit_time", "submit_time_s")
_GPUS = ("num_gpus", "num_gpu", "gpus")
_TENANT = ("user", "vc", "cluster")
_ID = ("jobid", "job_id")
_MISSING = {"", "none", "null", "nan"}


def parse_time(value: str, line: int, column: str) -> float | None:
    """Seconds: a plain number, or an ISO date-time (naive = UTC) as seconds since the epoch. None if missing."""
    text = value.strip()
    if text.lower() in _MISSING:
        return None
    if ":" in text or (len(text) >= 10 and text[4] == "-"):
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            raise fail(line, column, f"must be a date-time or seconds, got {value!r}") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return dt.timestamp()
    return parse_float(text, line, column)


def _pick(index: dict[str, int], names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in index), None)


def read_philly(lines: Iterable[str]) -> TraceReadResult:
    """Read a Philly-derived CSV (see the module docstring) from an iterable of text lines."""
    rows = csv_rows(lines)
    first = next(rows, None)
    if first is None:
        return finish([])
    hline, header = first
    index = {h.strip(): i for i, h in enumerate(header)}
    time_col, gpu_col = _pick(index, _TIME), _pick(index, _GPUS)
    tenant_col, id_col = _pick(index, _TENANT), _pick(index, _ID)
    has_span = "start_time" in index and "end_time" in index
    problems = []
    if time_col is None:
        problems.append(f"a submit-time column ({' | '.join(_TIME)})")
    if gpu_col is None:
        problems.append(f"a GPU-count column ({' | '.join(_GPUS)})")
    if "duration" not in index and not has_span:
        problems.append("duration or start_time + end_time")
    if problems:
        raise fail(hline, None, f"not a Philly CSV: needs {'; '.join(problems)}; header has {', '.join(index)}")
    assert time_col is not None and gpu_col is not None
    ti, gi = index[time_col], index[gpu_col]
    di = index.get("duration")
    si, ei = index.get("start_time"), index.get("end_time")
    tenant_i = index[tenant_col] if tenant_col else None
    id_i = index[id_col] if id_col else None
    width = len(header)
    skipped: Counter[str] = Counter()
    raw: list[RawJob] = []
    for number, (line, row) in enumerate(rows, start=1):
        check_width(row, width, line)
        submit = parse_time(row[ti], line, time_col)
        if submit is None:
            raise fail(line, time_col, f"must be a date-time or seconds, got {row[ti]!r}")
        gpus = parse_int(row[gi], line, gpu_col, minimum=0)
        if di is not None:
            duration: float | None = parse_float(row[di], line, "duration")
        else:
            assert si is not None and ei is not None
            start, end = parse_time(row[si], line, "start_time"), parse_time(row[ei], line, "end_time")
            duration = None if start is None or end is None else end - start
        if gpus == 0:
            skipped["zero_gpus"] += 1
            continue
        if duration is None:
            skipped["no_duration"] += 1
            continue
        if duration <= 0:
            skipped["non_positive_duration"] += 1
            continue
        tenant = row[tenant_i].strip() if tenant_i is not None else ""
        job_id = row[id_i].strip() if id_i is not None else ""
        fields = {
            "job_id": job_id or f"philly-{number:06d}",
            "num_gpus": gpus,
            "duration_s": duration,
            "tenant": tenant or "default",
        }
        raw.append(RawJob(submit, line, fields))
    return finish(raw, skipped)
