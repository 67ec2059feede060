"""Pollux (OSDI'21) simulator workloads: ``workloads*/workload-N.csv`` and the ``model-profiles`` beside them.

A workload row is ``name, time, application, num_replicas, batch_size``: a job of one of six applications
(bert, cifar10, deepspeech2, imagenet, ncf, yolov3) submitted at ``time`` s, asking for ``num_replicas`` GPUs
and a global batch size. The file has no duration: Pollux simulates training progress from per-application
profiles. Durations here follow the formula Pollux's own workload generator uses to rate a configuration
(``Application.get_configurations`` in ``simulator/applications.py``):

    duration = iterations(batch_size) × step_time(placement, local batch)

* ``iterations``: the ``iteration`` column of ``validation-<batch_size>.csv`` at epoch ``MAX_EPOCHS[app] - 1``
  (Pollux's completion epoch: it sets no target metric, so a job trains for max_epochs epochs).
* placement: the replicas packed onto 4-GPU nodes (Pollux's simulated cluster, 16 nodes × 4 GPUs), e.g.
  10 → ``(4, 4, 2)``, written as its smallest rotation (``244``) as in ``placements.csv``.
* local batch ``ceil(batch_size / replicas)``; above the application's largest local batch (the largest in
  ``placements.csv``; yolov3: 8) it is split into gradient-accumulation steps, each extra one costing
  ``step_time - sync_time``.
* ``step_time, sync_time``: ``placements.csv`` rows of that placement, linear in the local batch (clamped to the
  measured range). Placements of more than 4 nodes (over 16 replicas) use the ``scalability.csv`` rows with the
  same ``(num_nodes, num_replicas)``.

Checked against Pollux's published Tiresias runs (``results-jobload/tiresias-0.5``, fixed-size jobs, 8 workloads):
per workload the smallest ratio of recorded JCT to the duration computed here is 0.83–1.01 and the median
1.2–2.2 (queueing included).

Where the profile lacks what a job needs (no files for the application, batch size without a validation
file, no matching placement or scalability rows), the job gets ``REFERENCE_DURATION_S[application]`` and is
counted in notes as ``duration_reference``. Those reference durations are the medians of the profile-derived
durations of each application's jobs over all 40 workload files of the Pollux artifact (commit c793c70);
``python -m suanli.traces.smoke`` recomputes them.

Pollux jobs are elastic: ``min_gpus = 1``, ``max_gpus = min(4 × num_replicas, 64)`` (never below the request).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from suanli.traces.common import (
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

#: Epochs to completion per application (Pollux simulator/applications.py, APPLICATIONS).
MAX_EPOCHS: dict[str, int] = {"bert": 2, "cifar10": 100, "deepspeech2": 80, "imagenet": 90, "ncf": 10, "yolov3": 50}
#: Largest per-GPU batch where Pollux overrides the profile's maximum.
MAX_LOCAL_BSZ: dict[str, int] = {"yolov3": 8}
#: Fallback durations (s): median profile-derived duration per application over the 40 Pollux workloads.
REFERENCE_DURATION_S: dict[str, float] = {
    "bert": 2480.0,
    "cifar10": 826.0,
    "deepspeech2": 3501.0,
    "imagenet": 26207.0,
    "ncf": 33.0,
    "yolov3": 12870.0,
}
GPUS_PER_NODE = 4
MAX_ELASTIC_GPUS = 64

_Row = tuple[float, float, float]  # (local_bsz, step_time, sync_time)


@dataclass(frozen=True)
class PolluxProfile:
    """What the duration formula needs from one application's ``model-profiles/<app>/`` folder."""

    placements: dict[str, tuple[_Row, ...]]
    scalability: dict[tuple[int, int], tuple[_Row, ...]]
    iterations: dict[int, float]
    max_local_bsz: float


def _table(lines: Iterable[str], key_cols: tuple[str, ...], what: str) -> dict[tuple[str, ...], list[_Row]]:
    rows = csv_rows(lines)
    first = next(rows, None)
    out: dict[tuple[str, ...], list[_Row]] = {}
    if first is None:
        return out
    hline, header = first
    col = header_index(header, hline, (*key_cols, "local_bsz", "step_time", "sync_time"))
    for line, row in rows:
        check_width(row, len(header), line)
        key = tuple(row[col[k]].strip() for k in key_cols)
        vals = tuple(
            parse_float(row[col[c]], line, f"{what} {c}", minimum=0) for c in ("local_bsz", "step_time", "sync_time")
        )
        out.setdefault(key, []).append(vals)  # type: ignore[arg-type]
    return out


def parse_profile(
    app: str,
    placements: Iterable[str],
    scalability: Iterable[str] | None,
    validation: Mapping[int, Iterable[str]],
) -> PolluxProfile:
    """Build a profile from the text lines of ``placements.csv``, ``scalability.csv`` and ``validation-<bsz>.csv``."""
    place = {k[0]: tuple(sorted(v)) for k, v in _table(placements, ("placement",), "placements").items()}
    scal: dict[tuple[int, int], tuple[_Row, ...]] = {}
    if scalability is not None:
        for k, v in _table(scalability, ("num_nodes", "num_replicas"), "scalability").items():
            scal[(int(float(k[0])), int(float(k[1])))] = tuple(sorted(v))
    iterations: dict[int, float] = {}
    for bsz, lines in validation.items():
        rows = csv_rows(lines)
        first = next(rows, None)
        if first is None:
            continue
        hline, header = first
        col = header_index(header, hline, ("iteration",))
        its = [parse_float(row[col["iteration"]], line, "iteration", minimum=0) for line, row in rows]
        if its:
            epochs = min(MAX_EPOCHS.get(app, len(its)), len(its))
            iterations[int(bsz)] = its[epochs - 1]
    largest = max((r[0] for rows_ in place.values() for r in rows_), default=0.0)
    return PolluxProfile(place, scal, iterations, float(MAX_LOCAL_BSZ.get(app, largest)))


def placement_id(replicas: int) -> str:
    """Replicas packed on 4-GPU nodes, as the lexicographically smallest rotation: 10 → ``"244"``."""
    nodes = (GPUS_PER_NODE,) * (replicas // GPUS_PER_NODE) + (
        (replicas % GPUS_PER_NODE,) if replicas % GPUS_PER_NODE else ()
    )
    best = min(nodes[i:] + nodes[:i] for i in range(len(nodes)))
    return "".join(map(str, best))


def _interp(rows: tuple[_Row, ...], x: float) -> tuple[float, float]:
    if x <= rows[0][0]:
        return rows[0][1], rows[0][2]
    for (x0, s0, y0), (x1, s1, y1) in itertools.pairwise(rows):
        if x <= x1:
            w = (x - x0) / (x1 - x0) if x1 > x0 else 1.0
            return s0 + w * (s1 - s0), y0 + w * (y1 - y0)
    return rows[-1][1], rows[-1][2]


def profile_duration(profile: PolluxProfile, replicas: int, batch_size: int) -> float | None:
    """Seconds to completion at `replicas` GPUs and global `batch_size`, or None if the profile lacks data."""
    iterations = profile.iterations.get(batch_size)
    if iterations is None or replicas < 1 or profile.max_local_bsz <= 0:
        return None
    rows = profile.placements.get(placement_id(replicas)) if replicas <= 4 * GPUS_PER_NODE else None
    if rows is None:
        nodes = min(math.ceil(replicas / GPUS_PER_NODE), 16)
        rows = profile.scalability.get((nodes, replicas))
    if not rows:
        return None
    local = math.ceil(batch_size / replicas - 1e-8)
    accum = math.ceil(local / profile.max_local_bsz - 1e-8) - 1
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    step, sync = _interp(rows, atomic)
    step += accum * (step - sync)
    return iterations * step


def pollux_needs(lines: Iterable[str]) -> dict[str, set[int]]:
    """Application → batch sizes a workload uses: which profile files `parse_profile` will need."""
    rows = csv_rows(lines)
    first = next(rows, None)
    needs: dict[str, set[int]] = {}
    if first is None:
        return needs
    hline, header = first
    col = header_index(header, hline, ("application",))
    for line, row in rows:
        check_width(row, len(header), line)
        bsz = row[col["batch_size"]].strip() if "batch_size" in col else ""
        entry = needs.setdefault(row[col["application"]].strip(), set())
        if bsz:
            entry.add(parse_int(bsz, line, "batch_size", minimum=1))
    return needs


def read_pollux(lines: Iterable[str], profiles: Mapping[str, PolluxProfile] | None = None) -> TraceReadResult:
    """Read a Pollux workload CSV (see the module docstring); `profiles` maps application → `PolluxProfile`."""
    rows = csv_rows(lines)
    first = next(rows, None)
    if first is None:
        return finish([])
    hline, header = first
    col = header_index(header, hline, ("name", "time", "application", "num_replicas"))
    skipped: Counter[str] = Counter()
    notes: Counter[str] = Counter()
    raw: list[RawJob] = []
    for line, row in rows:
        check_width(row, len(header), line)
        app = row[col["application"]].strip()
        submit = parse_float(row[col["time"]], line, "time", minimum=0)
        replicas = parse_int(row[col["num_replicas"]], line, "num_replicas", minimum=0)
        bsz_text = row[col["batch_size"]].strip() if "batch_size" in col else ""
        bsz = parse_int(bsz_text, line, "batch_size", minimum=1) if bsz_text else None
        if replicas == 0:
            skipped["zero_gpus"] += 1
            continue
        profile = (profiles or {}).get(app)
        duration = profile_duration(profile, replicas, bsz) if profile is not None and bsz is not None else None
        if duration is None:
            if app not in REFERENCE_DURATION_S:
                raise fail(line, "application", f"no profile and no reference duration for {app!r}")
            duration = REFERENCE_DURATION_S[app]
            notes["duration_reference"] += 1
        if duration <= 0:
            skipped["non_positive_duration"] += 1
            continue
        fields = {
            "job_id": row[col["name"]].strip() or f"pollux-{line:06d}",
            "num_gpus": replicas,
            "duration_s": duration,
            "model": app,
            "min_gpus": 1,
            "max_gpus": max(replicas, min(4 * replicas, MAX_ELASTIC_GPUS)),
        }
        raw.append(RawJob(submit, line, fields))
    return finish(raw, skipped, notes)
