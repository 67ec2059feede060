"""Gavel (OSDI'20) traces and Shockwave (NSDI'23) traces, which use Gavel's tab-separated job format.

Three layouts (no header; fields separated by tabs):

* ``gavel`` — ``msr/seed=S/<vc>.trace``, 7 fields: ``job_type, command, num_steps_arg, needs_data_dir,
  total_steps, arrival_time, scale_factor``. Philly per-VC arrivals mapped onto Gavel's job types.
* ``gavel-physical`` — ``physical_cluster/*.trace``, 10 fields: ``job_type, command, working_directory,
  num_steps_arg, needs_data_dir, total_steps, scale_factor, priority_weight, SLO, arrival_time``.
* ``shockwave`` — ``traces/*.trace``, 12 fields: ``job_type, command, working_directory, num_steps_arg,
  needs_data_dir, total_steps, scale_factor, mode, priority_weight, SLO, duration, arrival_time``.

``scale_factor`` is the GPU count, ``job_type`` (e.g. ``ResNet-50 (batch size 64)``) becomes the model.

Gavel records work in steps, not seconds. Its generators write ``total_steps = run_time × throughput`` with the
isolated steps/s of the job type at its scale factor on a V100 (``simulation_throughputs.json``, key
``('<job_type>', <scale_factor>)``, entry ``"null"``), so the duration read back is ``total_steps / throughput``.
That file only measures scale factors 1, 2, 4, 8 (and only 1 for A3C, CycleGAN and Recommendation), so:

* no entry for the scale factor: the largest measured scale factor below it, scaled linearly
  (``throughput(s) × scale_factor / s``) — notes ``throughput_extrapolated``;
* job type not in the file (or no throughputs given): ``DEFAULT_STEPS_PER_S`` — notes ``throughput_default``.

Shockwave traces carry their duration (s), which is used as is.
``priority_weight`` > 1 → reserved, < 1 → spot, 1 → on-demand. Jobs with 0 GPUs or a duration <= 0 are skipped.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from suanli.traces.common import (
    RawJob,
    TraceError,
    TraceReadResult,
    check_width,
    fail,
    finish,
    parse_float,
    parse_int,
    tsv_rows,
)

GAVEL_FIELDS = (
    "job_type",
    "command",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "arrival_time",
    "scale_factor",
)
GAVEL_PHYSICAL_FIELDS = (
    "job_type",
    "command",
    "working_directory",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "scale_factor",
    "priority_weight",
    "SLO",
    "arrival_time",
)
SHOCKWAVE_FIELDS = (
    "job_type",
    "command",
    "working_directory",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "scale_factor",
    "mode",
    "priority_weight",
    "SLO",
    "duration",
    "arrival_time",
)

#: Median isolated V100 throughput (steps/s) at scale factor 1 over the 26 job types of Gavel's
#: simulation_throughputs.json (commit c4fa400): the fallback for a job type the file does not list.
DEFAULT_STEPS_PER_S = 10.84

Throughputs = Mapping[tuple[str, int], float]


def parse_throughputs(text: str, worker_type: str = "v100") -> dict[tuple[str, int], float]:
    """``{(job_type, scale_factor): steps/s}`` for one worker type from a Gavel/Shockwave throughputs JSON."""
    try:
        data = json.loads(text)
        table = data[worker_type]
    except (ValueError, KeyError, TypeError) as e:
        raise TraceError(f"throughputs: not a Gavel throughputs file with a {worker_type!r} table ({e})") from None
    out: dict[tuple[str, int], float] = {}
    for key, entry in table.items():
        try:
            job_type, scale = ast.literal_eval(key)
            value = float(entry["null"])
        except (ValueError, SyntaxError, TypeError, KeyError):
            raise TraceError(f"throughputs: bad {worker_type} entry {key!r}") from None
        if value > 0:
            out[(str(job_type), int(scale))] = value
    return out


def steps_per_second(throughputs: Throughputs | None, job_type: str, scale: int) -> tuple[float, str | None]:
    """Isolated steps/s of `job_type` at `scale` GPUs and the note to count when it is a fallback (or None)."""
    if throughputs:
        exact = throughputs.get((job_type, scale))
        if exact:
            return exact, None
        below = [s for (jt, s) in throughputs if jt == job_type and s <= scale]
        if below:
            s = max(below)
            return throughputs[(job_type, s)] * scale / s, "throughput_extrapolated"
    return DEFAULT_STEPS_PER_S, "throughput_default"


def _priority(weight: float) -> str:
    return "reserved" if weight > 1 else "spot" if weight < 1 else "on-demand"


def _read(
    lines: Iterable[str],
    layout: tuple[str, ...],
    *,
    throughputs: Throughputs | None,
    tenant: str,
    id_prefix: str,
) -> TraceReadResult:
    col = {name: i for i, name in enumerate(layout)}
    skipped: Counter[str] = Counter()
    notes: Counter[str] = Counter()
    raw: list[RawJob] = []
    for number, (line, row) in enumerate(tsv_rows(lines), start=1):
        check_width(row, len(layout), line)
        job_type = row[col["job_type"]].strip()
        if not job_type:
            raise fail(line, "job_type", "must not be empty")
        gpus = parse_int(row[col["scale_factor"]], line, "scale_factor", minimum=0)
        submit = parse_float(row[col["arrival_time"]], line, "arrival_time", minimum=0)
        if "duration" in col:
            duration = parse_float(row[col["duration"]], line, "duration")
        else:
            steps = parse_float(row[col["total_steps"]], line, "total_steps", minimum=0)
            rate, note = steps_per_second(throughputs, job_type, max(gpus, 1))
            duration = steps / rate
            if note and gpus > 0:
                notes[note] += 1
        if gpus == 0:
            skipped["zero_gpus"] += 1
            continue
        if duration <= 0:
            skipped["non_positive_duration"] += 1
            continue
        fields: dict[str, Any] = {
            "job_id": f"{id_prefix}-{number:06d}",
            "num_gpus": gpus,
            "duration_s": duration,
            "tenant": tenant,
            "model": job_type,
        }
        if "priority_weight" in col:
            fields["priority"] = _priority(parse_float(row[col["priority_weight"]], line, "priority_weight", minimum=0))
        raw.append(RawJob(submit, line, fields))
    return finish(raw, skipped, notes)


def read_gavel(
    lines: Iterable[str], throughputs: Throughputs | None = None, *, tenant: str = "default", id_prefix: str = "gavel"
) -> TraceReadResult:
    """Gavel's 7-field simulator trace (``msr/seed=S/<vc>.trace``); `tenant` is usually the VC (the file stem)."""
    return _read(lines, GAVEL_FIELDS, throughputs=throughputs, tenant=tenant, id_prefix=id_prefix)


def read_gavel_physical(
    lines: Iterable[str], throughputs: Throughputs | None = None, *, tenant: str = "default", id_prefix: str = "gavel"
) -> TraceReadResult:
    """Gavel's 10-field physical-cluster trace (``physical_cluster/*.trace``)."""
    return _read(lines, GAVEL_PHYSICAL_FIELDS, throughputs=throughputs, tenant=tenant, id_prefix=id_prefix)


def read_shockwave(lines: Iterable[str], *, tenant: str = "default", id_prefix: str = "shockwave") -> TraceReadResult:
    """Shockwave's 12-field trace (``traces/*.trace``); the duration column is used as is."""
    return _read(lines, SHOCKWAVE_FIELDS, throughputs=None, tenant=tenant, id_prefix=id_prefix)
