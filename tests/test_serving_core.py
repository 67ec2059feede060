"""The serving core: the endpoint spec's bounds, the runtime adapters' command lines, and the autoscaler's decision
as a pure function (hypothesis properties)."""

from __future__ import annotations

import shlex
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.billing.tokens import cost_of_tokens, part_charge
from suanli.serving.autoscale import Decision, Observed, decide
from suanli.serving.runtimes import RUNTIMES, Replica, runtime
from suanli.serving.spec import parse_endpoint, replica_spec
from suanli.workloads.spec import SpecError


def _errors(doc: dict) -> str:
    with pytest.raises(SpecError) as e:
        parse_endpoint(doc)
    return str(e.value)


BASE = {"name": "chat", "kind": "service", "model": "tiny-gpt"}


def test_spec_defaults_and_runtime_choice() -> None:
    s = parse_endpoint(BASE)
    assert s.gpus() == 1 and s.runtime_name() == "vllm"
    assert s.scaling().min_replicas == s.scaling().max_replicas == 1
    cpu = parse_endpoint({**BASE, "resources": {"gpus": 0}})
    assert cpu.runtime_name() == "transformers"
    assert parse_endpoint({**BASE, "replicas": 0}).scaling().max_replicas == 1
    auto = parse_endpoint({**BASE, "autoscale": {"min_replicas": 0, "max_replicas": 4, "target": 2}})
    assert (auto.scaling().min_replicas, auto.scaling().max_replicas) == (0, 4)
    assert parse_endpoint(parse_endpoint(BASE).model_dump(mode="json")) == parse_endpoint(BASE)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Bad_Name"}, "name"),
        ({"model": "../etc"}, "model"),
        ({"model": "vol:ckpt/../x"}, "model"),
        ({"replicas": 17}, "replicas"),
        ({"replicas": -1}, "replicas"),
        ({"replicas": 2, "autoscale": {"max_replicas": 2}}, "replicas"),
        ({"autoscale": {"min_replicas": 3, "max_replicas": 2}}, "autoscale.max_replicas"),
        ({"autoscale": {"target": 0}}, "autoscale.target"),
        ({"autoscale": {"cold_start_s": 10_000}}, "autoscale.cold_start_s"),
        ({"max_model_len": 1}, "max_model_len"),
        ({"max_model_len": True}, "max_model_len"),
        ({"runtime": "tgi"}, "runtime"),
        ({"resources": {"gpus": {"min": 1, "max": 2}}}, "resources.gpus"),
        ({"price_per_1m_tokens": "-1"}, "price_per_1m_tokens"),
        ({"price_per_1m_tokens": "1e400"}, "price_per_1m_tokens"),
        ({"price_per_1m_tokens": "0.000000001"}, "price_per_1m_tokens"),
        ({"price_per_1m_tokens": 1.5}, "price_per_1m_tokens"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_spec_refuses_naming_the_field(change: dict, field: str) -> None:
    assert f"{field}:" in _errors({**BASE, **change})


def test_replica_spec_is_an_ordinary_workload() -> None:
    s = parse_endpoint({**BASE, "resources": {"gpu": "H100-SXM", "gpus": 4}, "max_model_len": 4096})
    rt = runtime(s.runtime_name())
    r = Replica("org/tiny", s.name, 20001, 4, s.max_model_len)
    w = replica_spec(s, 3, rt.command(r), 20001, rt.env(r))
    assert w.kind == "job" and w.name == "chat-r3" and w.ports == (20001,) and w.models == ("tiny-gpt",)
    assert w.resources.topology == "nvlink" and w.gpu_count() == 4  # a TP-4 replica inside one NVLink domain
    assert "failure" in w.retry.on and w.retry.limit > 0
    assert w.network == "host"  # the serving gateway reaches it by port on the host, whatever `network: auto` gives


def test_vllm_command_line() -> None:
    r = Replica("Qwen/Qwen2.5-0.5B-Instruct", "chat", 21000, 2, 8192)
    argv = shlex.split(RUNTIMES["vllm"].command(r))
    assert argv[:4] == ["exec", "vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"]
    opts = dict(zip(argv[4::2], argv[5::2], strict=True))
    assert opts == {"--host": "127.0.0.1", "--port": "21000", "--served-model-name": "chat",
                    "--tensor-parallel-size": "2", "--max-model-len": "8192"}  # fmt: skip
    assert RUNTIMES["vllm"].upstream_model(r) == "chat" and RUNTIMES["vllm"].probe_path == "/health"


def test_transformers_command_line() -> None:
    r = Replica("tiny/random-gpt2", "chat", 21001, 0)
    argv = shlex.split(RUNTIMES["transformers"].command(r))
    assert argv[:4] == ["exec", "transformers", "serve", "tiny/random-gpt2"]
    assert argv[argv.index("--port") + 1] == "21001" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--device") + 1] == "cpu"
    assert RUNTIMES["transformers"].upstream_model(r) == "tiny/random-gpt2"
    assert not RUNTIMES["transformers"].serves("embeddings")


def test_a_hostile_model_name_cannot_inject_into_the_command() -> None:
    r = Replica("a; rm -rf / #", "chat", 21002, 1)
    for rt in RUNTIMES.values():
        assert shlex.split(rt.command(r))[3] == "a; rm -rf / #"


# ---- the autoscaler -------------------------------------------------------------------------------------------
def test_scale_up_under_load_and_cold_start() -> None:
    d = decide(Observed(1, 20, 0, 100), 1, 4, 5, 60)
    assert d == Decision(4, d.reason) and "20 request(s)" in d.reason
    d = decide(Observed(0, 1, 0, 1000), 0, 3, 8, 60)
    assert d is not None and d.replicas == 1 and "cold start" in d.reason


def test_scale_down_waits_for_idle_then_goes_to_zero() -> None:
    assert decide(Observed(3, 0, 10, 10), 0, 4, 5, 60) is None  # requests came 10 s ago: keep
    d = decide(Observed(3, 0, 10, 100, 100), 0, 4, 5, 60)
    assert d is not None and d.replicas == 1  # idle enough to shrink, not to zero: a request came 10 s ago
    d = decide(Observed(1, 0, 61, 100, 100), 0, 4, 5, 60)
    assert d is not None and d.replicas == 0 and "idle" in d.reason
    assert decide(Observed(1, 0, 61, 100), 1, 4, 5, 60) is None  # min_replicas 1: never below


counts = st.integers(0, 16)
ages = st.none() | st.floats(0, 10_000, allow_nan=False)


@st.composite
def cases(draw: st.DrawFn) -> tuple[Observed, int, int, int, float]:
    lo = draw(st.integers(0, 8))
    hi = draw(st.integers(max(lo, 1), 16))
    o = Observed(draw(counts), draw(st.integers(0, 10_000)), draw(ages), draw(ages), draw(ages))
    return o, lo, hi, draw(st.integers(1, 64)), draw(st.floats(5, 3600, allow_nan=False))


@settings(max_examples=400, deadline=None)
@given(cases())
def test_decisions_stay_in_bounds_and_settle(case: tuple[Observed, int, int, int, float]) -> None:
    o, lo, hi, target, idle = case
    d = decide(o, lo, hi, target, idle)
    n = o.replicas if d is None else d.replicas
    assert lo <= n <= hi
    need = -(-o.load // target)
    assert n >= min(hi, need)  # never fewer than the load needs (up to max)
    if o.load > 0:
        assert n >= 1  # a waiting request is never left at zero
    if d is not None:
        assert d.replicas != o.replicas and d.reason
        again = decide(Observed(d.replicas, o.load, o.since_request_s, 0.0, o.since_busy_s), lo, hi, target, idle)
        assert again is None  # applied, the same view asks for nothing more
    if n < o.replicas and o.replicas <= hi:  # a scale-down only after idle_s since the last change and busy time
        assert all(x is None or x >= idle for x in (o.since_change_s, o.since_busy_s))
    if n == 0 and o.replicas > 0:
        assert o.load == 0 and (o.since_request_s is None or o.since_request_s >= idle)


# ---- paying for tokens ------------------------------------------------------------------------------------------
def test_token_cost_is_exact() -> None:
    assert cost_of_tokens(777_778, Decimal("2.50")) == Decimal("1.944445")
    assert cost_of_tokens(1, Decimal("0.00000001")) == Decimal("0")  # below the ledger's precision: rounds to 0
    assert cost_of_tokens(0, Decimal("5")) == 0
    with pytest.raises(ValueError):
        part_charge(5, 4, Decimal(1))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=20),
       st.decimals(min_value=0, max_value=10**6, places=8, allow_nan=False, allow_infinity=False))  # fmt: skip
def test_charging_a_row_in_parts_sums_to_its_whole(parts: list[int], price: Decimal) -> None:
    total = charged = 0
    paid = Decimal(0)
    for p in parts:
        total += p
        paid += part_charge(charged, total, price)
        charged = total
    assert paid == cost_of_tokens(total, price)
