"""Alibaba cluster-trace-gpu-v2023 ("openb", FGD, ATC'23) pod lists: ``openb_pod_list_*.csv``.

Columns: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec, qos, pod_phase, creation_time,
deletion_time, scheduled_time`` (times in seconds from the trace start). One pod = one job:

* ``num_gpu = 0`` pods are CPU-only: skipped and counted (``cpu_only``).
* ``num_gpu = 1`` with ``gpu_milli < 1000`` asks for a shared slice: ``gpu_fraction = gpu_milli / 1000``.
  Multi-GPU pods always carry ``gpu_milli = 1000`` in the trace; if one did not it is read as whole GPUs
  (counted in notes as ``multi_gpu_partial_milli``).
* submit = ``creation_time``; duration = ``deletion_time - scheduled_time`` (the run time). Pods never scheduled
  (``Pending``, empty ``scheduled_time``) use ``deletion_time - creation_time``, their lifetime as a request
  (notes: ``never_scheduled``). Pods ``Running`` when the trace was cut end at the cut, so their durations
  are censored (notes: ``running_at_trace_end``). Durations <= 0 are skipped (``non_positive_duration``).
* ``gpu_type`` = ``gpu_spec`` as written (``|``-separated alternatives, e.g. ``V100M16|V100M32``), None if empty.
* priority from ``qos``: Guaranteed → reserved, LS and Burstable → on-demand, BE → spot.

The ``multigpu*`` variants have no time columns at all (FGD replays them as placement requests in row
order). Reading one needs ``untimed_duration_s``: every pod then gets that duration and arrives
``untimed_interarrival_s`` after the previous row (notes: ``untimed``).

Licence: the openb trace is for research or study use (alibaba/clusterdata README); cite Weng et al., ATC'23.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from suanli.traces.common import (
    HOST_MAX,
    RawJob,
    TraceError,
    TraceReadResult,
    check_width,
    csv_rows,
    fail,
    finish,
    header_index,
    parse_float,
    parse_int,
)

QOS_PRIORITY: dict[str, str] = {"guaranteed": "reserved", "ls": "on-demand", "burstable": "on-demand", "be": "spot"}
_REQUIRED = ("name", "num_gpu", "gpu_milli")


def read_alibaba_openb(
    lines: Iterable[str], *, untimed_duration_s: float | None = None, untimed_interarrival_s: float = 1.0
) -> TraceReadResult:
    """Read an openb pod list (see the module docstring) from an iterable of text lines."""
    rows = csv_rows(lines)
    first = next(rows, None)
    if first is None:
        return finish([])
    hline, header = first
    col = header_index(header, hline, _REQUIRED)
    timed = "creation_time" in col and "deletion_time" in col
    if not timed and untimed_duration_s is None:
        raise TraceError(
            "this openb pod list has no creation_time/deletion_time columns (the multigpu* variants); "
            "pass untimed_duration_s= to replay it as a placement-only trace"
        )
    if untimed_duration_s is not None and not untimed_duration_s > 0:
        raise TraceError(f"untimed_duration_s must be > 0, got {untimed_duration_s!r}")
    width = len(header)
    skipped: Counter[str] = Counter()
    notes: Counter[str] = Counter()
    raw: list[RawJob] = []
    for number, (line, row) in enumerate(rows, start=0):
        check_width(row, width, line)
        num_gpu = parse_int(row[col["num_gpu"]], line, "num_gpu", minimum=0)
        milli = parse_int(row[col["gpu_milli"]], line, "gpu_milli", minimum=0)
        if num_gpu == 0:
            skipped["cpu_only"] += 1
            continue
        if not 0 < milli <= 1000:
            raise fail(line, "gpu_milli", f"must be in 1..1000 for a pod with GPUs, got {row[col['gpu_milli']]!r}")
        fraction = 1.0
        if milli < 1000:
            if num_gpu == 1:
                fraction = milli / 1000.0
            else:
                notes["multi_gpu_partial_milli"] += 1
        if timed:
            submit = parse_float(row[col["creation_time"]], line, "creation_time", minimum=0)
            end = parse_float(row[col["deletion_time"]], line, "deletion_time", minimum=0)
            sched = row[col["scheduled_time"]].strip() if "scheduled_time" in col else ""
            if sched:
                duration = end - parse_float(sched, line, "scheduled_time", minimum=0)
            else:
                duration = end - submit
                notes["never_scheduled"] += 1
            if duration <= 0:
                skipped["non_positive_duration"] += 1
                continue
            if "pod_phase" in col and row[col["pod_phase"]].strip() == "Running":
                notes["running_at_trace_end"] += 1
        else:
            assert untimed_duration_s is not None
            submit, duration = number * untimed_interarrival_s, untimed_duration_s
            notes["untimed"] += 1
        priority = "on-demand"
        if "qos" in col and row[col["qos"]].strip():
            qos = row[col["qos"]].strip()
            if qos.lower() not in QOS_PRIORITY:
                raise fail(line, "qos", f"must be one of Guaranteed, LS, Burstable, BE, got {qos!r}")
            priority = QOS_PRIORITY[qos.lower()]
        spec = row[col["gpu_spec"]].strip() if "gpu_spec" in col else ""
        fields = {
            "job_id": row[col["name"]].strip() or f"openb-{number + 1:06d}",
            "num_gpus": num_gpu,
            "duration_s": duration,
            "gpu_type": spec or None,
            "priority": priority,
            "gpu_fraction": fraction,
        }
        for name in ("cpu_milli", "memory_mib"):  # the pod's host request (counted on clusters that state hosts)
            if name in col and row[col[name]].strip():
                fields[name] = parse_int(row[col[name]], line, name, minimum=0, maximum=HOST_MAX)
        raw.append(RawJob(submit, line, fields))
    return finish(raw, skipped, notes)
