"""Workloads as users describe them: the spec (YAML/JSON), its validation, and its mapping to a scheduler request."""

from suanli.workloads.durations import MAX_DURATION_S, format_duration, parse_duration
from suanli.workloads.models import RESERVED_ENV, RESERVED_ENV_PREFIX, ModelSpec, Retry, WorkloadSpec
from suanli.workloads.resources import FieldError, GpuRange, Resources
from suanli.workloads.spec import MAX_SPEC_BYTES, SpecError, load_yaml, parse_spec, spec_errors

__all__ = [
    "MAX_DURATION_S",
    "MAX_SPEC_BYTES",
    "RESERVED_ENV",
    "RESERVED_ENV_PREFIX",
    "FieldError",
    "GpuRange",
    "ModelSpec",
    "Resources",
    "Retry",
    "SpecError",
    "WorkloadSpec",
    "format_duration",
    "load_yaml",
    "parse_duration",
    "parse_spec",
    "spec_errors",
]
