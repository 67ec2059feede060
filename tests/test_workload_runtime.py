"""The performance model's runtime of a workload on a placement."""

from __future__ import annotations

import pytest

from suanli.topology import presets
from suanli.topology.spec import parse
from suanli.workloads import parse_spec
from suanli.workloads.runtime import RUNTIME_CAP_S, predicted_runtime

CLUSTER = parse(presets.preset_spec("h20-roce800-128"))


def spec(tokens: float | None, gpus: int = 8, model: str | None = "llama3.1-8b") -> object:
    doc: dict[str, object] = {"name": "x", "command": "c", "resources": {"gpu": "H20", "gpus": gpus}}
    if model is not None:
        doc["model"] = {"preset": model, **({"tokens": tokens} if tokens is not None else {})}
    return parse_spec(doc)


def test_runtime_is_the_token_count_over_the_best_plans_throughput() -> None:
    one = predicted_runtime(spec(1e6), CLUSTER, range(8))  # type: ignore[arg-type]
    ten = predicted_runtime(spec(1e7), CLUSTER, range(8))  # type: ignore[arg-type]
    assert one is not None and ten is not None
    assert ten == pytest.approx(10 * one)


def test_more_gpus_of_one_job_finish_sooner() -> None:
    eight = predicted_runtime(spec(1e8, 8), CLUSTER, range(8))  # type: ignore[arg-type]
    sixty_four = predicted_runtime(spec(1e8, 64), CLUSTER, range(64))  # type: ignore[arg-type]
    assert eight is not None and sixty_four is not None
    assert sixty_four < eight


@pytest.mark.parametrize(("tokens", "model"), [(None, "llama3.1-8b"), (1e6, None)])
def test_without_a_model_and_a_token_count_there_is_no_prediction(tokens: float | None, model: str | None) -> None:
    assert predicted_runtime(spec(tokens, model=model), CLUSTER, range(8)) is None  # type: ignore[arg-type]


def test_the_longest_run_the_edge_accepts_still_fits_in_a_date() -> None:
    """1e15 tokens (the spec's bound) on one GPU is ~10^11 s by the model: capped, so `now + runtime` is a date."""
    from datetime import datetime, timedelta

    one_gpu = predicted_runtime(spec(1e15, 1), CLUSTER, range(1))  # type: ignore[arg-type]
    assert one_gpu == RUNTIME_CAP_S
    assert datetime(2026, 1, 1) + timedelta(seconds=one_gpu) < datetime(2037, 1, 1)
    shorter = predicted_runtime(spec(1e9, 1), CLUSTER, range(1))  # type: ignore[arg-type]
    assert shorter is not None and shorter < RUNTIME_CAP_S  # the cap does not touch ordinary runs


def test_a_precision_the_gpus_lack_predicts_nothing_instead_of_failing_the_scheduler() -> None:
    doc = {"name": "x", "command": "c", "resources": {"gpu": "H20", "gpus": 8},
           "model": {"preset": "llama3.1-8b", "tokens": 1e6, "precision": "nvfp4"}}  # fmt: skip
    assert predicted_runtime(parse_spec(doc), CLUSTER, range(8)) is None  # type: ignore[arg-type]
    doc["model"] = {"preset": "llama3.1-8b", "tokens": 1e6, "precision": "mxfp8"}  # MX block scaling: Blackwell
    assert predicted_runtime(parse_spec(doc), CLUSTER, range(8)) is None  # type: ignore[arg-type]
    doc["model"] = {"preset": "llama3.1-8b", "tokens": 1e6, "precision": "fp8-blockwise"}
    assert predicted_runtime(parse_spec(doc), CLUSTER, range(8)) is not None  # type: ignore[arg-type]
