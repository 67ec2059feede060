"""`suanli perf train/plan` MoE plan options: EP all-to-all overlap, token dispatcher, FP8 attention, selective
recompute modules (each flag, its refusals naming the flag, and what the plan search chooses by itself)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from suanli.perf import Placement, Plan, TrainJob, candidate_plans, model_preset, search
from suanli.perf.plan import with_moe_options
from suanli.topology import parse
from tests.cli_helpers import invoke

H100_2x8 = ["--gpu", "H100-SXM", "--gpus", "16", "--gpus-per-node", "8"]
QWEN = ["--model", "qwen3-30b-a3b", *H100_2x8, "--global-batch", "1024"]
EXACT = [*QWEN, "--tp", "1", "--pp", "1", "--cp", "1", "--ep", "16"]  # EP over both nodes


def _train(*args: str) -> dict[str, Any]:
    return json.loads(invoke(["perf", "train", *args, "--json"]).stdout)


def _refused(*args: str) -> str:
    result = invoke(list(args), code=2)
    err = result.stderr.strip()
    assert result.stdout == "" and err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_exact_plan_runs_the_overlap_megatron_allows_and_the_flag_turns_it_off() -> None:
    on, off = _train(*EXACT), _train(*EXACT, "--no-moe-a2a-overlap")
    assert on["plan"]["moe_a2a_overlap"] is True and off["plan"]["moe_a2a_overlap"] is False
    assert on["step_time_s"] < off["step_time_s"]
    assert on["breakdown"]["ep_exposed"] < off["breakdown"]["ep_exposed"]
    assert _train(*EXACT, "--moe-a2a-overlap")["step_time_s"] == on["step_time_s"]


def test_overlap_flag_is_refused_where_megatron_refuses_it() -> None:
    assert "--moe-a2a-overlap" in _refused("perf", "train", *EXACT, "--moe-a2a-overlap", "--recompute", "full")
    assert "--moe-a2a-overlap" in _refused("perf", "train", *QWEN, "--ep", "1", "--moe-a2a-overlap")
    dense = ["--model", "llama3.1-8b", *H100_2x8]
    assert "--moe-a2a-overlap" in _refused("perf", "plan", *dense, "--moe-a2a-overlap")
    assert "--moe-dispatcher" in _refused("perf", "plan", *dense, "--moe-dispatcher", "flex")  # (it was ignored)
    pipelined = [*QWEN, "--tp", "1", "--pp", "2", "--cp", "1", "--ep", "8", "--moe-a2a-overlap"]
    err = _refused("perf", "train", *pipelined)
    assert "--moe-a2a-overlap" in err and "vp" in err
    err = _refused("perf", "plan", *QWEN, "--pp", "2", "--vp", "1", "--moe-a2a-overlap")
    assert "--moe-a2a-overlap" in err and "--vp" in err
    searched = json.loads(invoke(["perf", "plan", *QWEN, "--pp", "2", "--moe-a2a-overlap", "--json"]).stdout)
    assert all(p["plan"]["moe_a2a_overlap"] and p["plan"]["vp"] > 1 for p in searched["plans"])
    # without the flag the same pipelined plan simply runs without the overlap
    assert _train(*pipelined[:-1])["plan"]["moe_a2a_overlap"] is False


def test_dispatcher_flag_and_its_default_by_topology() -> None:
    assert _train(*EXACT)["plan"]["moe_dispatcher"] == "flex"  # EP16 spans two HGX nodes
    inside = _train(*QWEN, "--tp", "1", "--pp", "1", "--cp", "1", "--ep", "8")
    assert inside["plan"]["moe_dispatcher"] == "alltoall"  # EP8 inside one node
    flex, plain = _train(*EXACT), _train(*EXACT, "--moe-dispatcher", "alltoall")
    assert plain["plan"]["moe_dispatcher"] == "alltoall"
    assert plain["breakdown"]["ep_exposed"] > flex["breakdown"]["ep_exposed"]
    assert _train(*EXACT, "--moe-dispatcher", "FLEX")["plan"]["moe_dispatcher"] == "flex"
    err = _refused("perf", "train", *EXACT, "--moe-dispatcher", "ring")
    assert "--moe-dispatcher" in err and "alltoall" in err


def test_fp8_attention_flag_needs_an_fp8_recipe() -> None:
    base = _train(*EXACT, "--precision", "fp8")
    fp8 = _train(*EXACT, "--precision", "fp8", "--fp8-attention")
    assert base["plan"]["fp8_attention"] is False and fp8["plan"]["fp8_attention"] is True
    assert fp8["breakdown"]["compute_attention"] < base["breakdown"]["compute_attention"]
    err = _refused("perf", "train", *EXACT, "--fp8-attention")
    assert "--fp8-attention" in err and "bf16" in err
    assert "--fp8-attention" in _refused("perf", "plan", *QWEN, "--precision", "fp16", "--fp8-attention")


def test_recompute_modules_flag() -> None:
    doc = _train(*EXACT, "--recompute-modules", "moe_act, layernorm,moe_act")
    assert doc["plan"]["recompute"] == "selective"  # implied
    assert doc["plan"]["recompute_modules"] == ["moe_act", "layernorm"]
    assert doc["breakdown"]["recompute"] > _train(*EXACT)["breakdown"]["recompute"]
    assert _train(*EXACT, "--recompute", "selective", "--recompute-modules", "mlp")["plan"]["recompute"] == "selective"
    for bad in ("attention", "moe_act,bogus", ",", "x" * 201):
        assert "--recompute-modules" in _refused("perf", "train", *EXACT, "--recompute-modules", bad)
    err = _refused("perf", "train", *EXACT, "--recompute", "full", "--recompute-modules", "moe_act")
    assert "--recompute-modules" in err and "selective" in err


def test_plan_search_passes_the_flags_on_and_lists_the_options() -> None:
    args = ["perf", "plan", *QWEN, "--precision", "fp8", "--fp8-attention", "--recompute-modules", "moe_act"]
    doc = json.loads(invoke([*args, "--moe-dispatcher", "alltoall", "--top", "3", "--json"]).stdout)
    for p in (d["plan"] for d in doc["plans"]):
        assert p["fp8_attention"] and p["recompute_modules"] == ["moe_act"] and p["recompute"] == "selective"
        assert p["moe_dispatcher"] == "alltoall"
    table = invoke(["perf", "plan", *QWEN, "--top", "1"]).stdout
    assert "A2A-overlap" in table and "-dispatch" in table


def _placement(nodes: int) -> Placement:
    c = parse({"name": "t", "fabric": "ib-ndr",
               "node_groups": [{"name": "n", "count": nodes, "gpu": "H100-SXM", "gpus_per_node": 8, "nics": 8}]})  # fmt: skip
    return Placement(c, c.compact_gpus(nodes * 8))


def test_searched_expert_parallel_plans_use_the_overlap_wherever_megatron_allows_it() -> None:
    job = TrainJob(model_preset("qwen3-30b-a3b"), "bf16", 4096, 1024)
    best = search(job, _placement(2), top=5)
    assert best and all(r.plan.ep > 1 for r in best)
    assert all(r.plan.moe_a2a_overlap for r in best if r.plan.recompute != "full" and (r.plan.pp == 1 or r.plan.vp > 1))
    plans = list(candidate_plans(job, 16, 8))
    assert any(p.moe_a2a_overlap for p in plans)
    for p in plans:
        allowed = p.ep > 1 and p.recompute != "full" and (p.pp == 1 or p.vp > 1)
        assert p.moe_a2a_overlap == allowed, p.label()
        assert p.moe_dispatcher == ("flex" if p.ep * p.etp > 8 or p.ep == 1 else "alltoall")
        assert not p.fp8_attention and p.recompute_modules == ()


@pytest.mark.parametrize("fixed", [{"moe_a2a_overlap": False}, {"moe_a2a_overlap": True}])
def test_a_fixed_overlap_is_kept_or_the_plan_dropped(fixed: dict[str, object]) -> None:
    ok, full = Plan(ep=8, dp=8), Plan(ep=8, dp=8, recompute="full")
    assert with_moe_options(ok, 8, fixed).moe_a2a_overlap is fixed["moe_a2a_overlap"]  # type: ignore[union-attr]
    assert (with_moe_options(full, 8, fixed) is None) is bool(fixed["moe_a2a_overlap"])


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--ep", "3"], "--ep 3 must divide the model's 128 experts"),
        (["--ep", "3", "--moe-a2a-overlap"], "--ep 3 must divide the model's 128 experts"),
        (["--gpus", "24", "--ep", "16"], "--ep 16 x --etp 1 must divide the GPUs of one pipeline stage"),
    ],
)
def test_an_expert_split_that_fits_no_plan_is_named_not_blamed_on_the_batch(args: list[str], said: str) -> None:
    """Review: `--ep 3` on a 128-expert model was refused as "global batch 256 must be a multiple of …", with the
    advice to try --global-batch 256."""
    err = _refused("perf", "train", "--model", "qwen3-30b-a3b", "--gpu", "H100-SXM", "--gpus", "16", "--tp", "1",
                   "--pp", "1", *args)  # fmt: skip
    assert said in err and "global batch" not in err
