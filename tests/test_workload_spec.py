"""Workload specs: every rule refuses bad input naming the field, the issue's example round-trips, requests hold."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.sched.types import FULL, Request, mig_milli
from suanli.workloads import (
    MAX_DURATION_S,
    MAX_SPEC_BYTES,
    SpecError,
    WorkloadSpec,
    format_duration,
    parse_duration,
    parse_spec,
)

EXAMPLE = """\
name: finetune-7b
kind: job                  # job | instance
command: torchrun --nproc-per-node $SUANLI_GPUS_PER_NODE train.py
workdir: .                 # uploaded for `job` (size limit), or a volume path
env: {EPOCHS: "3"}
resources:
  gpu: H100-SXM            # or "any", or a list in order of preference
  gpus: 16                 # or {min: 4, max: 32} for elastic work; or slice: 1g.10gb
  nodes: 2                 # optional; otherwise derived
  topology: leaf           # nvlink | leaf | any | auto
billing: on-demand         # on-demand | spot | plan:<id>
priority: normal
max_duration: 6h
max_price_per_hour: 300    # optional ceiling
retry: {on: [node-failure, preemption], limit: 3}
model: {preset: llama3.1-8b, precision: bf16}   # optional: enables quotes and topology-aware scoring
"""

BASE: dict[str, Any] = {"name": "w", "command": "python train.py"}


def spec(**patch: Any) -> dict[str, Any]:
    """BASE with top-level keys replaced; `resources` patches merge into {}; a None value deletes the key."""
    out = {**BASE, **patch}
    return {k: v for k, v in out.items() if v is not None}


def errors_of(source: Any) -> list[dict[str, str]]:
    with pytest.raises(SpecError) as info:
        parse_spec(source)
    return info.value.errors


# ---- the example ------------------------------------------------------------------------------------------
def test_example_parses_to_normalised_values() -> None:
    s = parse_spec(EXAMPLE)
    assert (s.name, s.kind, s.workdir, s.env) == ("finetune-7b", "job", ".", {"EPOCHS": "3"})
    assert s.command == "torchrun --nproc-per-node $SUANLI_GPUS_PER_NODE train.py"
    r = s.resources
    assert (r.gpu, r.gpus, r.nodes, r.topology, r.slice, r.exclusive) == ("H100-SXM", 16, 2, "leaf", None, False)
    assert (s.billing, s.priority, s.max_duration, s.duration) == ("on-demand", "normal", 21600.0, None)
    assert s.max_price_per_hour == Decimal(300)
    assert (s.retry.on, s.retry.limit) == (("node-failure", "preemption"), 3)  # YAML 1.1 would read `on` as True
    assert s.model is not None and (s.model.preset, s.model.precision) == ("llama3.1-8b", "bf16")


@pytest.mark.parametrize(
    "encode",
    [
        pytest.param(lambda d: d, id="mapping"),
        pytest.param(json.dumps, id="json"),
        pytest.param(lambda d: json.dumps(d).encode(), id="json-bytes"),
        pytest.param(lambda d: json.dumps(d, indent="\t"), id="json-tabs"),
        pytest.param(yaml.safe_dump, id="yaml"),
    ],
)
def test_example_round_trips(encode: Any) -> None:
    s = parse_spec(EXAMPLE)
    dumped = s.model_dump(mode="json")
    assert parse_spec(encode(dumped)) == s
    assert parse_spec(encode(dumped)).model_dump(mode="json") == dumped


def test_stored_form_revalidates() -> None:
    """The control plane stores model_dump(mode="json", exclude_none=True) and re-reads it with model_validate."""
    from suanli.workloads.spec import WorkloadSpec as FromSpec
    from suanli.workloads.spec import format_duration as fd
    from suanli.workloads.spec import parse_spec as ps

    s = ps(EXAMPLE)
    stored = json.loads(json.dumps(s.model_dump(mode="json", exclude_none=True)))
    assert FromSpec.model_validate(stored) == s and fd(stored["max_duration"]) == "6h"
    assert "duration" not in stored and stored["max_price_per_hour"] == "300"


def test_defaults() -> None:
    s = parse_spec({"name": "a", "command": "true"})
    assert (s.kind, s.workdir, s.env, s.billing, s.priority) == ("job", ".", {}, "on-demand", "normal")
    assert (s.resources.gpu, s.resources.gpus, s.resources.topology, s.resources.exclusive) == ("any", 1, "auto", False)
    assert (s.retry.on, s.retry.limit) == (("node-failure", "preemption"), 0)
    assert s.max_duration is s.duration is s.max_price_per_hour is s.model is None


# ---- accepted inputs, normalised ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("patch", "attr", "expected"),
    [
        ({"resources": {"gpu": "h100"}}, lambda s: s.resources.gpu, "H100-SXM"),
        ({"resources": {"gpu": "ANY"}}, lambda s: s.resources.gpu, "any"),
        ({"resources": {"gpu": ["h20", "NVIDIA H200"]}}, lambda s: s.gpu_preference(), ("H20", "H200")),
        ({"resources": {"gpu": "any"}}, lambda s: s.gpu_preference(), None),
        ({"resources": {"gpus": 0}}, lambda s: s.gpu_count(), 0),
        ({"resources": {"gpus": {"min": 4, "max": 32}}}, lambda s: (s.gpu_count(), s.gpu_range()), (4, (4, 32))),
        ({"resources": {"gpus": {"min": 8, "max": 8}}}, lambda s: s.gpu_range(), (8, 8)),
        ({"resources": {"slice": " 1G.10GB "}}, lambda s: (s.resources.slice, s.milli()), ("1g.10gb", 142)),
        ({"resources": {"gpu": "a100", "slice": "3g.40gb", "gpus": 1}}, lambda s: s.milli(), 428),
        ({"resources": {"gpus": {"min": 4, "max": 16}, "nodes": 2}}, lambda s: s.resources.nodes, 2),
        ({"resources": {"gpus": 0, "nodes": 1}}, lambda s: s.resources.nodes, 1),
        ({"resources": {"exclusive": True, "topology": "nvlink"}}, lambda s: s.resources.exclusive, True),
        ({"kind": "instance", "command": None}, lambda s: (s.kind, s.command), ("instance", None)),
        ({"workdir": "./src//train/"}, lambda s: s.workdir, "src/train"),
        ({"workdir": "a..b/c"}, lambda s: s.workdir, "a..b/c"),
        ({"env": {"EPOCHS": 3, "LR": 0.5, "_X1": ""}}, lambda s: s.env, {"EPOCHS": "3", "LR": "0.5", "_X1": ""}),
        ({"env": {"suanli_lower": "x"}}, lambda s: s.env, {"suanli_lower": "x"}),
        ({"env": {f"V{i}": "x" for i in range(256)}}, lambda s: len(s.env), 256),
        ({"env": {"BIG": "x" * 32 * 1024}}, lambda s: len(s.env["BIG"]), 32 * 1024),
        ({"billing": "plan:team_a-1"}, lambda s: (s.billing_mode(), s.plan_id()), ("plan", "team_a-1")),
        ({"billing": "spot"}, lambda s: (s.billing_mode(), s.plan_id(), s.priority_class()), ("spot", None, "spot")),
        ({"priority": "high"}, lambda s: s.priority_rank(), 2),
        ({"priority": "low"}, lambda s: s.priority_rank(), 0),
        ({"max_duration": 90, "duration": "1.5m"}, lambda s: (s.max_duration, s.duration), (90.0, 90.0)),
        ({"max_duration": "90d"}, lambda s: s.max_duration, MAX_DURATION_S),
        ({"max_price_per_hour": 2.5}, lambda s: s.max_price_per_hour, Decimal("2.5")),
        ({"max_price_per_hour": "0.00000001"}, lambda s: s.max_price_per_hour, Decimal("1E-8")),
        ({"retry": {"on": ["failure", "failure"], "limit": 20}}, lambda s: (s.retry.on, s.retry.limit), (("failure",), 20)),
        ({"retry": {"on": []}}, lambda s: s.retry.on, ()),
        ({"retry": {True: ["failure"]}}, lambda s: s.retry.on, ("failure",)),  # dict from plain yaml.safe_load
        ({"retry": {"true": ["failure"]}}, lambda s: s.retry.on, ("failure",)),  # …then through json.dumps
        ({"model": {"preset": "Llama3.1-70B", "tokens": 1e12}}, lambda s: (s.model.preset, s.model.precision), ("llama3.1-70b", "bf16")),
    ],
)  # fmt: skip
def test_accepted(patch: dict[str, Any], attr: Any, expected: Any) -> None:
    s = parse_spec(spec(**patch))
    assert attr(s) == expected
    assert parse_spec(s.model_dump(mode="json")) == s


# ---- refused inputs: each names its field -------------------------------------------------------------------------
BAD: list[tuple[dict[str, Any], str, str]] = [
    # name
    ({"name": None}, "name", "is required"),
    ({"name": ""}, "name", "1-63"),
    ({"name": "Finetune"}, "name", "lowercase"),
    ({"name": "7b-run"}, "name", "starting with a letter"),
    ({"name": "run-"}, "name", "not ending"),
    ({"name": "a_b"}, "name", "1-63"),
    ({"name": "a" * 64}, "name", "1-63"),
    ({"name": 5}, "name", "valid string"),
    # kind / command
    ({"kind": "service"}, "kind", "'job' or 'instance'"),
    ({"command": None}, "command", "required for a job"),
    ({"command": ""}, "command", "empty"),
    ({"command": "   "}, "command", "empty"),
    ({"command": "a\x00b"}, "command", "NUL"),
    ({"command": "x" * 10_001}, "command", "at most 10000"),
    ({"kind": "instance", "command": ""}, "command", "empty"),
    # workdir
    ({"workdir": "/data"}, "workdir", "absolute"),
    ({"workdir": "../up"}, "workdir", "'..' is not allowed"),
    ({"workdir": "a/../../b"}, "workdir", "'..' is not allowed"),
    ({"workdir": "~/x"}, "workdir", "'~'"),
    ({"workdir": "a\\b"}, "workdir", "backslashes"),
    ({"workdir": "a\x00"}, "workdir", "NUL"),
    ({"workdir": ""}, "workdir", "empty"),
    # env
    ({"env": ["A=1"]}, "env", "mapping"),
    ({"env": {"1A": "x"}}, "env", "not a variable name"),
    ({"env": {"A-B": "x"}}, "env", "not a variable name"),
    ({"env": {"SUANLI_GPUS": "8"}}, "env.SUANLI_GPUS", "set by the platform"),
    *[
        ({"env": {n: "0"}}, f"env.{n}", "reserved")
        for n in ("CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")
    ],
    ({"env": {f"V{i}": "x" for i in range(257)}}, "env", "at most 256"),
    ({"env": {"BIG": "é" * 16 * 1024 + "x"}}, "env.BIG", "32 KiB"),
    ({"env": {"A": "x\x00"}}, "env.A", "NUL"),
    ({"env": {"A": True}}, "env.A", "quote it"),
    ({"env": {"A": [1]}}, "env.A", "string"),
    # resources.gpu
    ({"resources": {"gpu": "H900"}}, "resources.gpu", "unknown GPU 'H900'; known: H100-SXM"),
    ({"resources": {"gpu": ["h100", "nope"]}}, "resources.gpu", "unknown GPU 'nope'"),
    ({"resources": {"gpu": []}}, "resources.gpu", "must not be empty"),
    ({"resources": {"gpu": ["h100", "H100-SXM"]}}, "resources.gpu", "listed twice"),
    ({"resources": {"gpu": ["any", "h100"]}}, "resources.gpu", "'any' cannot be part of a list"),
    ({"resources": {"gpu": 100}}, "resources.gpu", "GPU model name"),
    ({"resources": {"gpu": [100]}}, "resources.gpu", "strings"),
    # resources.gpus
    ({"resources": {"gpus": -1}}, "resources.gpus", "0..65536"),
    ({"resources": {"gpus": 65537}}, "resources.gpus", "0..65536"),
    ({"resources": {"gpus": True}}, "resources.gpus", "whole number"),
    ({"resources": {"gpus": 2.5}}, "resources.gpus", "whole number"),
    ({"resources": {"gpus": "8"}}, "resources.gpus", "whole number"),
    ({"resources": {"gpus": {"min": 0, "max": 4}}}, "resources.gpus.min", "greater than or equal to 1"),
    ({"resources": {"gpus": {"min": 8, "max": 4}}}, "resources.gpus.max", ">= min (8)"),
    ({"resources": {"gpus": {"min": 1, "max": 65537}}}, "resources.gpus.max", "less than or equal to 65536"),
    ({"resources": {"gpus": {"min": 1}}}, "resources.gpus.max", "is required"),
    ({"resources": {"gpus": {"min": 1, "max": 2, "step": 1}}}, "resources.gpus.step", "unknown field"),
    # resources.slice
    ({"resources": {"slice": "big"}}, "resources.slice", "not a MIG profile"),
    ({"resources": {"slice": "8g.80gb"}}, "resources.slice", "not a MIG profile"),
    ({"resources": {"slice": "1g.3gb"}}, "resources.slice", "no GPU in the catalog offers"),
    ({"resources": {"slice": "1g.10gb", "gpus": 2}}, "resources.gpus", "must be 1"),
    ({"resources": {"slice": "1g.10gb", "gpus": 0}}, "resources.gpus", "must be 1"),
    ({"resources": {"gpus": 0, "nodes": 3}}, "resources.nodes", "CPU-only work runs on one node"),
    ({"resources": {"slice": "1g.10gb", "gpus": {"min": 1, "max": 2}}}, "resources.gpus", "not a range"),
    ({"resources": {"slice": "1g.10gb", "gpu": "l40s"}}, "resources.gpu", "L40S does not support MIG"),
    ({"resources": {"slice": "1g.10gb", "gpu": ["h100", "h200"]}}, "resources.slice", "H200 offers 1g.18gb"),
    ({"resources": {"slice": "1g.10gb", "exclusive": True}}, "resources.exclusive", "whole nodes"),
    ({"resources": {"slice": "1g.10gb", "nodes": 2}}, "resources.nodes", "divisible"),
    # resources.nodes / topology / exclusive
    ({"resources": {"gpus": 6, "nodes": 4}}, "resources.nodes", "gpus (6) must be divisible by nodes (4)"),
    ({"resources": {"gpus": {"min": 4, "max": 10}, "nodes": 4}}, "resources.nodes", "max (10)"),
    ({"resources": {"gpus": {"min": 2, "max": 8}, "nodes": 4}}, "resources.nodes", "min (2)"),
    ({"resources": {"nodes": 0}}, "resources.nodes", "greater than or equal to 1"),
    ({"resources": {"nodes": 8193}}, "resources.nodes", "less than or equal to 8192"),
    ({"resources": {"nodes": "2"}}, "resources.nodes", "valid integer"),
    ({"resources": {"topology": "rack"}}, "resources.topology", "'nvlink', 'leaf', 'any' or 'auto'"),
    ({"resources": {"exclusive": "yes"}}, "resources.exclusive", "valid boolean"),
    ({"resources": {"gpuz": 3}}, "resources.gpuz", "did you mean 'gpu"),
    ({"resources": "8xh100"}, "resources", "valid dictionary"),
    # billing / priority
    ({"billing": "reserved"}, "billing", "on-demand, spot, usage or plan:<id>"),
    ({"billing": "plan:"}, "billing", "plan:<id>"),
    ({"billing": "plan:" + "a" * 33}, "billing", "plan:<id>"),
    ({"billing": "plan:a b"}, "billing", "plan:<id>"),
    ({"billing": "On-Demand"}, "billing", "plan:<id>"),
    ({"priority": "urgent"}, "priority", "'low', 'normal' or 'high'"),
    # durations
    ({"max_duration": 0}, "max_duration", "more than 0"),
    ({"max_duration": -5}, "max_duration", "more than 0"),
    ({"max_duration": "91d"}, "max_duration", "at most 90d"),
    ({"max_duration": "6 hours"}, "max_duration", "'1h30m'"),
    ({"max_duration": "30m1h"}, "max_duration", "largest first"),
    ({"max_duration": True}, "max_duration", "number of seconds"),
    ({"max_duration": float("nan")}, "max_duration", "more than 0"),
    ({"duration": float("inf")}, "duration", "at most 90d"),
    ({"duration": "2h", "max_duration": "1h"}, "duration", "must not exceed max_duration (1h); got 2h"),
    # price
    ({"max_price_per_hour": 0}, "max_price_per_hour", "greater than 0"),
    ({"max_price_per_hour": -1}, "max_price_per_hour", "greater than 0"),
    ({"max_price_per_hour": 10**9 + 1}, "max_price_per_hour", "less than or equal to"),
    ({"max_price_per_hour": "NaN"}, "max_price_per_hour", "finite"),
    ({"max_price_per_hour": "cheap"}, "max_price_per_hour", "valid decimal"),
    ({"max_price_per_hour": "0.000000001"}, "max_price_per_hour", "8 decimal places"),
    # retry
    ({"retry": {"on": ["oom"]}}, "retry.on.0", "'node-failure', 'preemption' or 'failure'"),
    ({"retry": {"limit": 21}}, "retry.limit", "less than or equal to 20"),
    ({"retry": {"limit": -1}}, "retry.limit", "greater than or equal to 0"),
    ({"retry": {"limit": 1.0}}, "retry.limit", "valid integer"),
    ({"retry": {"on": [], "limits": 2}}, "retry.limits", "did you mean 'limit'"),
    # model
    ({"model": {"preset": "gpt5"}}, "model.preset", "presets: llama3.1-8b"),
    (
        {"model": {"preset": "llama3.1-8b", "precision": "int8"}},
        "model.precision",
        "'fp8', 'fp8-blockwise', 'mxfp8', 'nvfp4' or 'fp32'",
    ),
    ({"model": {"preset": "llama3.1-8b", "tokens": 0}}, "model.tokens", "greater than 0"),
    ({"model": {"preset": "llama3.1-8b", "tokens": "1e9"}}, "model.tokens", "valid number"),
    ({"model": {"preset": "llama3.1-8b", "tokens": float("inf")}}, "model.tokens", "finite"),
    ({"model": {"precision": "bf16"}}, "model.preset", "is required"),
    # unknown top-level field
    ({"gpus": 8}, "gpus", "unknown field"),
    ({"max_duraton": "6h"}, "max_duraton", "did you mean 'max_duration'"),
]


@pytest.mark.parametrize(("patch", "field", "fragment"), BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_refused(patch: dict[str, Any], field: str, fragment: str) -> None:
    errs = errors_of(spec(**patch))
    fields = [e["field"] for e in errs]
    assert field in fields, errs
    assert fragment in next(e["message"] for e in errs if e["field"] == field)


def test_every_error_is_reported_and_joined() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(spec(name="Bad", resources={"gpus": -1}, priority="urgent"))
    fields = [e["field"] for e in info.value.errors]
    assert fields == ["name", "resources.gpus", "priority"]
    text = str(info.value)
    assert text.startswith("name: must be") and "; resources.gpus: must be 0..65536" in text
    assert isinstance(info.value, ValueError)


def test_messages_do_not_echo_huge_values() -> None:
    errs = errors_of(spec(name="x" * 200_000, billing="y" * 100_000, **{"z" * 1000: 1}))
    assert len(str(SpecError(errs))) < 2000


def test_a_spec_of_many_unknown_keys_reports_a_bounded_list_quickly() -> None:
    """Each unknown key is an error with a did-you-mean hint: a spec of 10⁵ of them must still be answered at
    once (the first MAX_ERRORS, then how many more), not after minutes of comparing every pair."""
    from suanli.workloads.spec import MAX_ERRORS

    doc = spec(**{f"k{i:06d}": 1 for i in range(100_000)})
    doc["resources"] = {**doc.get("resources", {}), **{f"r{i:05d}": 1 for i in range(10_000)}}
    t0 = time.process_time()
    errs = errors_of(doc)
    assert time.process_time() - t0 < 5.0  # quadratic de-duplication took minutes here
    assert len(errs) == MAX_ERRORS + 1
    assert all(e["field"][0] == "k" or e["field"].startswith("resources.r") for e in errs[:-1]), errs[:3]
    assert all("unknown field" in e["message"] for e in errs[:-1])
    assert errs[-1] == {"field": "spec", "message": f"…and up to {110_000 - MAX_ERRORS} more errors"}


# ---- text-level errors and YAML pitfalls --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("name: x\n  command: [\n", "not valid YAML"),
        ("name: x\ncommand: 'unterminated\n", "line"),
        ("- name: x\n", "must be a mapping"),
        ("just text", "not a str"),
        ("", "is empty"),
        ("# nothing\n", "is empty"),
        ("a: &x 1\nb: *x\n", "aliases"),
        ("name: x\nname: y\n", "appears twice"),
        ('{"name": "x", "name": "y", "command": "a"}', "appears twice"),
        ("name: x\n---\nname: y\n", "single document"),
        ("[" * 400, "nested too deeply"),
        ("n: " + "9" * 5000, "not valid YAML"),
    ],
)
def test_bad_text(text: str, fragment: str) -> None:
    errs = errors_of(text)
    assert [e["field"] for e in errs] == ["spec"]
    assert fragment in errs[0]["message"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_fields = ["name", "kind", "command", "workdir", "env", "billing", "priority", "max_duration", "duration",
           "max_price_per_hour", "retry", "model", "resources", "resources.gpu", "resources.gpus", "resources.slice",
           "resources.nodes", "resources.topology", "resources.exclusive"]  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(field=st.sampled_from(_fields), value=_json)
def test_any_value_gives_spec_error_or_spec(field: str, value: Any) -> None:
    """Whatever JSON lands in a field, the answer is a spec or a SpecError naming fields; never another exception."""
    doc: dict[str, Any] = {**BASE, "resources": {}}
    *parent, key = field.split(".")
    (doc[parent[0]] if parent else doc)[key] = value
    try:
        parse_spec(doc)
    except SpecError as e:
        assert e.errors and all(x["field"] and x["message"] for x in e.errors)


@pytest.mark.parametrize(
    "text", ["? [a]\n: 1\n", "retry: {on: [[1]]}\nname: x\ncommand: a\n", "!!python/object:os.system {}"]
)
def test_odd_yaml_gives_spec_error(text: str) -> None:
    assert errors_of(text)


def test_yaml_error_has_line_and_column() -> None:
    errs = errors_of("name: x\ncommand: a\nresources: {gpus: 8\n")
    assert errs[0]["field"] == "spec" and "(line 4, column 1)" in errs[0]["message"]


def test_size_limit_and_encoding() -> None:
    big = "name: x\ncommand: a\n#" + "x" * MAX_SPEC_BYTES
    assert "limit is 256 KiB" in errors_of(big)[0]["message"]
    assert "limit is 256 KiB" in errors_of(big.encode())[0]["message"]
    assert "not UTF-8" in errors_of(b"name: \xff\n")[0]["message"]
    assert parse_spec("name: x\ncommand: echo 算力\n".encode()).command == "echo 算力"


def test_yaml_12_scalars() -> None:
    s = parse_spec("name: x\ncommand: a\nenv: {A: yes, B: off, C: 1:30, D: 2024-01-01, E: 010}\n")
    assert s.env == {"A": "yes", "B": "off", "C": "1:30", "D": "2024-01-01", "E": "010"}
    assert errors_of("name: x\ncommand: a\nmax_duration: 1:30\n")[0]["field"] == "max_duration"  # not 90 seconds
    assert parse_spec("name: x\ncommand: a\nresources: {exclusive: true, gpus: 0x10}\n").resources.gpus == 16


# ---- durations ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "seconds"),
    [(90, 90.0), (0.5, 0.5), ("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("6h", 21600.0), ("1h30m", 5400.0),
     ("2d", 172800.0), ("1.5h", 5400.0), ("1d2h3m4s", 93784.0), (" 1H 30M ", 5400.0), (".5m", 30.0)],
)  # fmt: skip
def test_parse_duration(value: Any, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["", "h", "1x", "1h1h", "1m1h", "1h-30m", "-1h", "1e3s", None, [1], 10**400])
def test_parse_duration_refuses(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (90, "1m30s"), (5400, "1h30m"), (21600, "6h"), (86400 * 2 + 1, "2d1s"), (1.5, "1.5s"),
     (0.001, "0.001s"), (3600.25, "1h0.25s")],
)  # fmt: skip
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=1, max_value=int(MAX_DURATION_S)))
def test_duration_round_trip_whole_seconds(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.integers(min_value=1, max_value=int(MAX_DURATION_S) * 1000))
def test_duration_round_trip_milliseconds(ms: int) -> None:
    assert parse_duration(format_duration(ms / 1000)) == pytest.approx(ms / 1000, abs=1e-6)


# ---- scheduler request and helpers --------------------------------------------------------------------------------
def test_to_request_example() -> None:
    r = parse_spec(EXAMPLE).to_request("wl-1", 12.5, "org-1", attained=3.0)
    assert r == Request(
        id="wl-1", gpus=16, submit_time=12.5, tenant="org-1", gpu_type=("H100-SXM",), milli=FULL, topology="leaf",
        priority="on-demand", attained=3.0, model=r.model, nodes=2,
    )  # fmt: skip
    assert r.model is not None and (r.model.preset, r.model.precision) == ("llama3.1-8b", "bf16")


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"resources": {"gpus": {"min": 4, "max": 32}}}, {"gpus": 4, "min_gpus": 4, "max_gpus": 32, "gpu_type": None}),
        ({"resources": {"slice": "2g.20gb", "gpu": "h100"}}, {"gpus": 1, "milli": mig_milli("2g.20gb")}),
        ({"billing": "plan:p1", "duration": "2h"}, {"priority": "reserved", "est_runtime": 7200.0}),
        ({"billing": "spot", "resources": {"exclusive": True}}, {"priority": "spot", "exclusive": True}),
        ({"resources": {"gpu": ["h20", "h800"], "gpus": 0}}, {"gpu_type": ("H20", "H800"), "gpus": 0}),
        ({"model": {"preset": "qwen2.5-72b", "precision": "fp8"}}, {"model": ("qwen2.5-72b", "fp8")}),
    ],
)
def test_to_request(patch: dict[str, Any], expected: dict[str, Any]) -> None:
    r = parse_spec(spec(**patch)).to_request("id", 0.0, "t")
    for key, value in expected.items():
        got = (r.model.preset, r.model.precision) if key == "model" and r.model else getattr(r, key)
        assert got == value, key


_gpus = st.one_of(
    st.integers(0, 64),
    st.tuples(st.integers(1, 64), st.integers(0, 64)).map(lambda t: {"min": t[0], "max": t[0] + t[1]}),
)


@given(
    gpus=_gpus,
    nodes=st.sampled_from([None, 1, 2, 4]),
    billing=st.sampled_from(["on-demand", "spot", "plan:x"]),
    duration=st.one_of(st.none(), st.integers(1, 10**6)),
    gpu=st.sampled_from(["any", "h100", ["h20", "a100"]]),
)
def test_to_request_invariants(gpus: Any, nodes: int | None, billing: str, duration: int | None, gpu: Any) -> None:
    res = {"gpus": gpus, "gpu": gpu, **({"nodes": nodes} if nodes else {})}
    try:
        s = parse_spec(spec(resources=res, billing=billing, duration=duration))
    except SpecError as e:
        assert nodes and [x["field"] for x in e.errors] == ["resources.nodes"]  # only divisibility may fail
        return
    r = s.to_request("id", 1.0, "t")  # Request.__post_init__ checks its own invariants
    assert r.gpus == s.gpu_count() >= 0
    if isinstance(gpus, dict):
        assert (r.min_gpus, r.gpus, r.max_gpus) == (gpus["min"], gpus["min"], gpus["max"])
        assert r.elastic == (gpus["min"] < gpus["max"])
    else:
        assert r.min_gpus is r.max_gpus is None and r.gpus == gpus
    assert r.priority == {"on-demand": "on-demand", "spot": "spot", "plan:x": "reserved"}[billing]
    assert r.est_runtime == duration and r.milli == FULL
    assert r.nodes == (nodes if s.gpu_count() > 0 else None)  # a hard constraint for the placement
    assert r.gpu_type == (None if gpu == "any" else s.gpu_preference())
    n = s.nodes_for(8)
    assert n == (nodes or max(1, -(-s.gpu_count() // 8)))
    if nodes:
        assert all(c % n == 0 for c in (s.gpu_range() or (s.gpu_count(),)))


@pytest.mark.parametrize(
    ("patch", "gpn", "gpus", "nodes"),
    [({}, 8, None, 1), ({"resources": {"gpus": 16}}, 8, None, 2), ({"resources": {"gpus": 17}}, 8, None, 3),
     ({"resources": {"gpus": 0}}, 8, None, 1), ({"resources": {"gpus": 16, "nodes": 4}}, 8, None, 4),
     ({"resources": {"gpus": {"min": 4, "max": 32}}}, 8, 24, 3), ({"resources": {"slice": "1g.10gb"}}, 8, None, 1)],
)  # fmt: skip
def test_nodes_for(patch: dict[str, Any], gpn: int, gpus: int | None, nodes: int) -> None:
    assert parse_spec(spec(**patch)).nodes_for(gpn, gpus=gpus) == nodes


def test_nodes_for_refuses_empty_nodes() -> None:
    with pytest.raises(ValueError, match="gpus_per_node"):
        parse_spec(BASE).nodes_for(0)


def test_spec_is_frozen() -> None:
    s = parse_spec(BASE)
    with pytest.raises(ValueError):
        s.name = "other"  # type: ignore[misc]
    assert isinstance(s, WorkloadSpec)
