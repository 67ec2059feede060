"""Which GPUs train at which precision recipe (`perf.training.precision_gap`, `GPUSpec.mx_block_scaling`).

Attack: MXFP8 asked of a Hopper or Ada GPU. Its FP8 tensor cores have a rate, but MX block scales are applied
by Blackwell's tensor cores only; before this rule the model priced MXFP8 on an H100 as FP8 and quoted it. Now
it is refused exactly as NVFP4 is: the plan search raises, the exact-plan estimate raises, the CLI exits 2 naming
the precision.
"""

from __future__ import annotations

import pytest

from suanli import catalog
from suanli.perf import TrainJob, model_preset
from suanli.perf.plan import search
from suanli.perf.training import PlanError, precision_gap
from suanli.topology import parse
from tests.cli_helpers import invoke


@pytest.mark.parametrize("gpu", ["H100-SXM", "H200", "H20", "L40S", "RTX-4090"])
def test_mxfp8_is_refused_before_blackwell(gpu: str) -> None:
    spec = catalog.gpu(gpu)
    assert not spec.mx_block_scaling
    gap = precision_gap(spec, "mxfp8")
    assert gap is not None and "mxfp8" in gap and "Blackwell" in gap and gpu in gap
    assert precision_gap(spec, "fp8") is None and precision_gap(spec, "fp8-blockwise") is None  # the FP8 recipes run


@pytest.mark.parametrize("gpu", ["B200", "B300", "GB200", "GB300"])
def test_mxfp8_and_nvfp4_run_on_blackwell(gpu: str) -> None:
    spec = catalog.gpu(gpu)
    assert spec.mx_block_scaling
    assert precision_gap(spec, "mxfp8") is None and precision_gap(spec, "nvfp4") is None


def test_the_plan_search_refuses_mxfp8_on_hopper_as_it_refuses_nvfp4() -> None:
    c = parse({"name": "t", "node_groups": [{"name": "n", "count": 1, "gpu": "H100-SXM", "gpus_per_node": 8,
                                             "nics": 8}], "fabric": "ib-ndr"})  # fmt: skip
    from suanli.perf import Placement

    placement = Placement(c, c.compact_gpus(8))
    for precision in ("mxfp8", "nvfp4"):
        job = TrainJob(model_preset("llama3.1-8b"), seq_len=4096, global_batch=64, precision=precision)  # type: ignore[arg-type]
        with pytest.raises(PlanError, match=precision):
            search(job, placement)


@pytest.mark.parametrize("extra", [[], ["--tp", "1", "--pp", "1"]])
def test_the_cli_names_mxfp8_on_an_h100(extra: list[str]) -> None:
    args = ["perf", "train", "--model", "llama3.1-8b", "--gpu", "H100-SXM", "--gpus", "8", "--precision", "mxfp8"]
    r = invoke([*args, *extra], code=2)
    assert "mxfp8" in r.stderr and "Blackwell" in r.stderr and "Traceback" not in r.stderr
