"""What every trace reader shares: the error type, the result record, field parsers and the final sort/rebase.

Readers parse rows into `RawJob`s (raw submit time, the source line, the `TraceJob` fields) and hand them to
`finish`, which sorts them by submit time (stable: ties keep file order), re-bases the times so the first job
arrives at 0, checks that job ids are unique and builds the `TraceJob`s. No reader does I/O: each takes an
iterable of text lines.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from suanli.sim.workload import TraceJob


class TraceError(ValueError):
    """A trace file that cannot be read as its format says; the message names the line and the column."""


@dataclass(frozen=True)
class TraceReadResult:
    """The jobs of a trace plus what was left out or approximated on the way.

    `skipped` counts rows dropped by reason (e.g. ``zero_gpus``, ``non_positive_duration``, ``cpu_only``);
    `notes` counts rows kept but adjusted or approximated (e.g. ``throughput_default``), so a caller can see
    how much of a trace rests on a fallback.
    """

    jobs: list[TraceJob]
    skipped: dict[str, int] = field(default_factory=dict)
    notes: dict[str, int] = field(default_factory=dict)

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())


@dataclass(slots=True)
class RawJob:
    """A parsed row before sorting and rebasing: `submit` in seconds on the source's own clock."""

    submit: float
    line: int
    fields: dict[str, Any]


HOST_MAX = 1 << 40  # the most CPU (milli-cores) or memory (MiB) a trace row may ask for


def fail(line: int, column: str | None, message: str) -> TraceError:
    where = f"line {line}: {column}: " if column else f"line {line}: "
    return TraceError(where + message)


def parse_float(value: str, line: int, column: str, *, minimum: float | None = None, positive: bool = False) -> float:
    """A finite float; `minimum` (inclusive) or `positive` (> 0) bound it. Errors name line and column."""
    text = value.strip()
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if positive:
        ok, want = x > 0, "a number > 0"
    elif minimum is not None:
        ok, want = x >= minimum, f"a number >= {minimum:g}"
    else:
        ok, want = True, "a number"
    if not math.isfinite(x) or not ok:
        raise fail(line, column, f"must be {want}, got {value!r}")
    return x


def parse_int(value: str, line: int, column: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (``"4"`` or ``"4.0"``); `minimum` and `maximum` are inclusive. Errors name line and column."""
    text = value.strip()
    want = "an integer" if minimum is None else f"an integer >= {minimum}"
    if maximum is not None:
        want += f" and <= {maximum}"
    try:
        x = float(text)
    except ValueError:
        raise fail(line, column, f"must be {want}, got {value!r}") from None
    if (
        not math.isfinite(x)
        or x != int(x)
        or (minimum is not None and x < minimum)
        or (maximum is not None and x > maximum)
    ):
        raise fail(line, column, f"must be {want}, got {value!r}")
    return int(x)


def csv_rows(lines: Iterable[str], *, delimiter: str = ",") -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) per non-blank row; the line number is where the row ends (1-based)."""
    reader = csv.reader(lines, delimiter=delimiter)
    for row in reader:
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        yield reader.line_num, row


def tsv_rows(lines: Iterable[str]) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) per non-blank line of a tab-separated file (no quoting, as Gavel writes them)."""
    for number, text in enumerate(lines, start=1):
        text = text.rstrip("\r\n")
        if text.strip():
            yield number, text.split("\t")


def header_index(header: list[str], line: int, required: Iterable[str]) -> dict[str, int]:
    """Column name -> index; raises if a required column is missing."""
    names = [h.strip() for h in header]
    index = {name: i for i, name in enumerate(names)}
    missing = [c for c in required if c not in index]
    if missing:
        raise fail(line, None, f"missing required column(s) {', '.join(missing)}; header has {', '.join(names)}")
    return index


def check_width(row: list[str], width: int, line: int) -> None:
    if len(row) != width:
        raise fail(line, None, f"expected {width} fields, got {len(row)}")


def finish(
    raw: list[RawJob], skipped: Counter[str] | None = None, notes: Counter[str] | None = None
) -> TraceReadResult:
    """Sort by submit time (stable), re-base to 0, check unique ids, build the `TraceJob`s."""
    raw = sorted(raw, key=lambda r: r.submit)
    t0 = raw[0].submit if raw else 0.0
    seen: dict[str, int] = {}
    jobs: list[TraceJob] = []
    for r in raw:
        job_id = r.fields["job_id"]
        if job_id in seen:
            raise fail(r.line, "job_id", f"duplicate job id {job_id!r} (first on line {seen[job_id]})")
        seen[job_id] = r.line
        try:
            jobs.append(TraceJob(submit_time_s=r.submit - t0, **r.fields))
        except ValueError as e:
            raise fail(r.line, None, str(e)) from None
    return TraceReadResult(
        jobs=jobs,
        skipped={k: v for k, v in sorted((skipped or Counter()).items()) if v},
        notes={k: v for k, v in sorted((notes or Counter()).items()) if v},
    )
