"""Trace readers: public GPU-cluster traces → `TraceJob`s for the scheduler simulator.

``read_trace("philly:path/to/pollux_philly.csv.gz")`` returns the jobs sorted by submit time, re-based so the
first arrives at 0 s, with unique job ids; `read_trace_result` also says what was skipped or approximated.
Each format has a pure reader taking text lines (`read_csv`, `read_philly`, …); `FORMATS` lists them.
"""

from suanli.traces.alibaba import read_alibaba_openb
from suanli.traces.common import TraceError, TraceReadResult
from suanli.traces.files import open_text_file
from suanli.traces.gavel import parse_throughputs, read_gavel, read_gavel_physical, read_shockwave
from suanli.traces.generic import read_csv
from suanli.traces.philly import read_philly
from suanli.traces.pollux import PolluxProfile, parse_profile, read_pollux
from suanli.traces.registry import FORMATS, parse_spec, read_trace, read_trace_result
from suanli.traces.tiresias import read_tiresias

__all__ = [
    "FORMATS",
    "PolluxProfile",
    "TraceError",
    "TraceReadResult",
    "open_text_file",
    "parse_profile",
    "parse_spec",
    "parse_throughputs",
    "read_alibaba_openb",
    "read_csv",
    "read_gavel",
    "read_gavel_physical",
    "read_philly",
    "read_pollux",
    "read_shockwave",
    "read_tiresias",
    "read_trace",
    "read_trace_result",
]
