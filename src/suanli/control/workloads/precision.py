"""Which GPUs a workload's training precision runs on: a spec's `model.precision` needs tensor cores with that
rate (`perf.training.precision_gap`: mxfp8 and nvfp4 need Blackwell, fp8 needs Hopper, Ada or later), as a quote
for the same job does. A pinned GPU without it is refused naming the precision; `gpu: any` keeps only the
registered models that have it."""

from __future__ import annotations

from collections.abc import Sequence

from suanli import catalog
from suanli.control.errors import Invalid
from suanli.perf.training import precision_gap
from suanli.workloads.spec import WorkloadSpec


def _gap(spec: WorkloadSpec, model: str) -> str | None:
    if spec.model is None or spec.gpu_count() == 0:
        return None
    try:
        gpu = catalog.gpu(model)
    except catalog.CatalogError:
        return None  # not a catalog model (a node group's name): the scheduler's inventory decides
    return precision_gap(gpu, spec.model.precision)


def check_pinned(spec: WorkloadSpec) -> None:
    """422 naming the precision when a GPU model the spec names (any of a preference list) lacks it."""
    for model in spec.gpu_preference() or ():
        gap = _gap(spec, model)
        if gap is not None:
            raise Invalid(f"model.precision: {gap}")


def fitting(spec: WorkloadSpec, models: Sequence[str]) -> list[str]:
    """The `models` (registered, for `gpu: any`) that train at the spec's precision; none: 422 naming it."""
    fit = [m for m in models if _gap(spec, m) is None]
    if models and not fit:
        assert spec.model is not None  # (without one, every model fits)
        raise Invalid(f"model.precision: no GPU on offer here trains at {spec.model.precision} "
                      f"({'; '.join(str(_gap(spec, m)) for m in models)})")  # fmt: skip
    return fit


def narrows(spec: WorkloadSpec, models: Sequence[str]) -> bool:
    """Whether `gpu: any` work must be held to the models that fit (some registered model lacks the precision)."""
    return spec.resources.gpu == "any" and any(_gap(spec, m) is not None for m in models)
