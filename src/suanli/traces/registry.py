"""``FORMAT:PATH`` → jobs: the dispatcher over the readers, and the side files some formats need.

`open_text(path)` is injected (default `open_text_file`), so the readers stay pure and tests can hand in fakes.
Side files are looked up next to the trace through the same `open_text`:

* ``gavel`` / ``gavel-physical``: ``simulation_throughputs.json(.gz)`` in the trace's folder or up to three
  folders above it (``gavel-sim/msr/seed=0/x.trace.gz`` → ``gavel-sim/``), unless ``throughputs=`` is given.
* ``pollux``: ``<folder above the workload's folder>/model-profiles/<application>/`` unless ``profiles=`` or
  ``profile_dir=`` is given; missing profile files fall back to reference durations (counted in notes).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from suanli.sim.workload import TraceJob
from suanli.traces.alibaba import read_alibaba_openb
from suanli.traces.common import TraceError, TraceReadResult
from suanli.traces.files import open_text_file
from suanli.traces.gavel import Throughputs, parse_throughputs, read_gavel, read_gavel_physical, read_shockwave
from suanli.traces.generic import read_csv
from suanli.traces.philly import read_philly
from suanli.traces.pollux import PolluxProfile, parse_profile, pollux_needs, read_pollux
from suanli.traces.tiresias import read_tiresias

OpenText = Callable[[str], TextIO]

FORMATS: dict[str, str] = {
    "csv": "generic CSV: submit_time_s,num_gpus,duration_s[,job_id,tenant,gpu_type,priority,model,min_gpus,max_gpus,gpu_fraction]",
    "philly": "Philly-derived CSV (Pollux's philly.csv: timestamp,duration,num_gpus,gpu_time,cluster)",
    "alibaba-openb": "Alibaba GPU v2023 openb pod list (openb_pod_list_*.csv)",
    "pollux": "Pollux simulator workload (workloads*/workload-N.csv; durations from ../model-profiles)",
    "gavel": "Gavel 7-field trace (msr/seed=S/<vc>.trace[.gz]; steps → seconds via simulation_throughputs.json)",
    "gavel-physical": "Gavel 10-field physical-cluster trace (physical_cluster/*.trace)",
    "tiresias": "Tiresias job CSV (job_id,num_gpu,submit_time,iterations,model_name,duration,interval)",
    "shockwave": "Shockwave 12-field trace (traces/*.trace, durations included)",
}

THROUGHPUT_FILES = ("simulation_throughputs.json.gz", "simulation_throughputs.json")


def _stem(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".gz", ".trace", ".csv"):
        name = name.removesuffix(suffix)
    return name


def _ancestors(path: str, levels: int) -> list[str]:
    out: list[str] = []
    folder = os.path.dirname(path) or "."
    for _ in range(levels + 1):
        if folder not in out:
            out.append(folder)
        folder = os.path.normpath(os.path.join(folder, os.pardir))
    return out


def _read_all(open_text: OpenText, path: str) -> list[str]:
    with open_text(path) as f:
        return f.readlines()


def find_throughputs(trace_path: str, open_text: OpenText, worker_type: str = "v100") -> dict[tuple[str, int], float]:
    """Gavel's throughputs table for `worker_type`, from the first ``simulation_throughputs.json(.gz)`` near the trace."""
    tried = []
    for folder in _ancestors(trace_path, 3):
        for name in THROUGHPUT_FILES:
            candidate = os.path.join(folder, name)
            tried.append(candidate)
            try:
                text = "".join(_read_all(open_text, candidate))
            except OSError:
                continue
            try:
                return parse_throughputs(text, worker_type)
            except TraceError as e:
                raise TraceError(f"{candidate}: {e}") from None
    raise TraceError(f"no Gavel throughputs file found (tried {', '.join(tried)}); pass throughputs= to the reader")


def load_pollux_profiles(
    profile_dir: str, open_text: OpenText, needs: Mapping[str, set[int]]
) -> dict[str, PolluxProfile]:
    """Profiles for the applications and batch sizes in `needs`; applications without ``placements.csv`` are left out."""
    profiles: dict[str, PolluxProfile] = {}
    for app, sizes in sorted(needs.items()):
        folder = os.path.join(profile_dir, app)
        try:
            placements = _read_all(open_text, os.path.join(folder, "placements.csv"))
        except OSError:
            continue
        try:
            scalability: list[str] | None = _read_all(open_text, os.path.join(folder, "scalability.csv"))
        except OSError:
            scalability = None
        validation: dict[int, list[str]] = {}
        for bsz in sorted(sizes):
            try:
                validation[bsz] = _read_all(open_text, os.path.join(folder, f"validation-{bsz}.csv"))
            except OSError:
                continue
        try:
            profiles[app] = parse_profile(app, placements, scalability, validation)
        except TraceError as e:
            raise TraceError(f"{folder}: {e}") from None
    return profiles


def _gavel_like(reader: Callable[..., TraceReadResult], per_vc: bool) -> Callable[..., TraceReadResult]:
    def load(path: str, open_text: OpenText, *, throughputs: Throughputs | None = None, worker_type: str = "v100"):
        table = throughputs if throughputs is not None else find_throughputs(path, open_text, worker_type)
        with open_text(path) as f:
            if per_vc:
                stem = _stem(path)
                return reader(f, table, tenant=stem, id_prefix=f"gavel-{stem}")
            return reader(f, table)

    return load


def _load_pollux(
    path: str,
    open_text: OpenText,
    *,
    profiles: Mapping[str, PolluxProfile] | None = None,
    profile_dir: str | None = None,
) -> TraceReadResult:
    lines = _read_all(open_text, path)
    if profiles is None:
        folder = profile_dir or os.path.join(os.path.dirname(os.path.dirname(path)), "model-profiles")
        profiles = load_pollux_profiles(folder, open_text, pollux_needs(lines))
    return read_pollux(lines, profiles)


def _plain(reader: Callable[..., TraceReadResult]) -> Callable[..., TraceReadResult]:
    def load(path: str, open_text: OpenText, **options: Any) -> TraceReadResult:
        with open_text(path) as f:
            return reader(f, **options)

    return load


_LOADERS: dict[str, Callable[..., TraceReadResult]] = {
    "csv": _plain(read_csv),
    "philly": _plain(read_philly),
    "alibaba-openb": _plain(read_alibaba_openb),
    "pollux": _load_pollux,
    "gavel": _gavel_like(read_gavel, per_vc=True),
    "gavel-physical": _gavel_like(read_gavel_physical, per_vc=False),
    "tiresias": _plain(read_tiresias),
    "shockwave": _plain(read_shockwave),
}
assert set(_LOADERS) == set(FORMATS)


def parse_spec(spec: str) -> tuple[str, str]:
    """``"FORMAT:PATH"`` → (format, path); raises `TraceError` listing the formats."""
    fmt, sep, path = spec.partition(":")
    fmt = fmt.strip().lower()
    if not sep or not path:
        raise TraceError(f"trace spec must be FORMAT:PATH, got {spec!r}; formats: {', '.join(FORMATS)}")
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r} in {spec!r}; formats: {', '.join(FORMATS)}")
    return fmt, path


def read_trace_result(spec: str, open_text: OpenText = open_text_file, **options: Any) -> TraceReadResult:
    """Read ``FORMAT:PATH`` with `open_text`; returns the jobs plus skipped/notes counts.

    `options` go to the format's reader: ``throughputs=`` / ``worker_type=`` (gavel, gavel-physical),
    ``profiles=`` / ``profile_dir=`` (pollux), ``untimed_duration_s=`` / ``untimed_interarrival_s=`` (alibaba-openb).
    Errors are `TraceError`s prefixed with the path.
    """
    fmt, path = parse_spec(spec)
    try:
        return _LOADERS[fmt](path, open_text, **options)
    except TraceError as e:
        message = str(e)
        raise TraceError(message if message.startswith(path) else f"{path}: {message}") from None
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        raise TraceError(f"{path}: cannot open: {e.strerror or e}") from None


def read_trace(spec: str, open_text: OpenText = open_text_file, **options: Any) -> list[TraceJob]:
    """The jobs of ``FORMAT:PATH`` sorted by submit time, the first at 0 s (see `read_trace_result`)."""
    return read_trace_result(spec, open_text, **options).jobs
