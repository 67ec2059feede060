"""The generic CSV trace: the format to write by hand or to convert other traces into.

Header row, then one job per row. Required columns: ``submit_time_s, num_gpus, duration_s``. Optional:
``job_id`` (default ``job-000001`` … by row), ``tenant`` (``default``), ``gpu_type``, ``priority``
(``reserved | on-demand | spot``; also ``high`` → reserved, ``normal`` → on-demand, ``low``/``best-effort`` → spot;
default on-demand), ``model``, ``min_gpus``, ``max_gpus`` (elastic jobs), ``gpu_fraction`` (``(0, 1]``, only
with ``num_gpus = 1``), and ``cpu_milli``, ``memory_mib`` (host CPU, 1000 = a core, and memory; counted on
clusters whose spec states node cores and memory). Empty optional cells take the default. Unknown columns are rejected. Rows asking for 0
GPUs are skipped and counted (``zero_gpus``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from suanli.traces.common import (
    HOST_MAX,
    RawJob,
    TraceReadResult,
    check_width,
    csv_rows,
    fail,
    finish,
    header_index,
    parse_float,
    parse_int,
)

REQUIRED_COLUMNS = ("submit_time_s", "num_gpus", "duration_s")
OPTIONAL_COLUMNS = ("job_id", "tenant", "gpu_type", "priority", "model", "min_gpus", "max_gpus", "gpu_fraction",
                    "cpu_milli", "memory_mib")  # fmt: skip
ALLOWED_COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS

PRIORITY_ALIASES: dict[str, str] = {
    "reserved": "reserved",
    "high": "reserved",
    "on-demand": "on-demand",
    "ondemand": "on-demand",
    "on_demand": "on-demand",
    "normal": "on-demand",
    "spot": "spot",
    "low": "spot",
    "best-effort": "spot",
    "best_effort": "spot",
    "besteffort": "spot",
}


def parse_priority(value: str, line: int, column: str = "priority") -> str:
    key = value.strip().lower()
    if not key:
        return "on-demand"
    try:
        return PRIORITY_ALIASES[key]
    except KeyError:
        raise fail(
            line, column, f"must be one of reserved, on-demand, spot (or high, normal, low, best-effort), got {value!r}"
        ) from None


def read_csv(lines: Iterable[str]) -> TraceReadResult:
    """Read the generic CSV format (see the module docstring) from an iterable of text lines."""
    rows = csv_rows(lines)
    first = next(rows, None)
    if first is None:
        return finish([])
    hline, header = first
    names = [h.strip() for h in header]
    unknown = [n for n in names if n not in ALLOWED_COLUMNS]
    if unknown:
        raise fail(
            hline, None, f"unknown column(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(ALLOWED_COLUMNS)}"
        )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise fail(hline, None, f"duplicate column(s) {', '.join(dupes)}")
    col = header_index(header, hline, REQUIRED_COLUMNS)
    skipped: Counter[str] = Counter()
    raw: list[RawJob] = []
    for index, (line, row) in enumerate(rows, start=1):
        check_width(row, len(names), line)
        cell = {name: row[i] for name, i in col.items()}
        submit = parse_float(cell["submit_time_s"], line, "submit_time_s", minimum=0)
        num_gpus = parse_int(cell["num_gpus"], line, "num_gpus", minimum=0)
        duration = parse_float(cell["duration_s"], line, "duration_s", minimum=0)
        if num_gpus == 0:
            skipped["zero_gpus"] += 1
            continue
        fields: dict[str, Any] = {
            "job_id": cell.get("job_id", "").strip() or f"job-{index:06d}",
            "num_gpus": num_gpus,
            "duration_s": duration,
            "tenant": cell.get("tenant", "").strip() or "default",
            "gpu_type": cell.get("gpu_type", "").strip() or None,
            "priority": parse_priority(cell.get("priority", ""), line),
            "model": cell.get("model", "").strip() or None,
        }
        for name in ("min_gpus", "max_gpus"):
            if cell.get(name, "").strip():
                fields[name] = parse_int(cell[name], line, name, minimum=1)
        for name in ("cpu_milli", "memory_mib"):
            if cell.get(name, "").strip():
                fields[name] = parse_int(cell[name], line, name, minimum=0, maximum=HOST_MAX)
        if fields.get("min_gpus") is not None and fields["min_gpus"] > num_gpus:
            raise fail(line, "min_gpus", f"must be <= num_gpus ({num_gpus}), got {fields['min_gpus']}")
        if fields.get("max_gpus") is not None and fields["max_gpus"] < num_gpus:
            raise fail(line, "max_gpus", f"must be >= num_gpus ({num_gpus}), got {fields['max_gpus']}")
        if cell.get("gpu_fraction", "").strip():
            fraction = parse_float(cell["gpu_fraction"], line, "gpu_fraction", positive=True)
            if fraction > 1:
                raise fail(line, "gpu_fraction", f"must be in (0, 1], got {cell['gpu_fraction']!r}")
            if fraction < 1 and num_gpus != 1:
                raise fail(line, "gpu_fraction", f"a fraction < 1 needs num_gpus = 1, got num_gpus = {num_gpus}")
            fields["gpu_fraction"] = fraction
        raw.append(RawJob(submit, line, fields))
    return finish(raw, skipped)
