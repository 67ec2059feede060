"""Continuous batching under a per-iteration token budget (`perf/serve_sched.py`, used by `perf/inference.py`).

Properties the scheduling model must keep whatever its inputs: throughput never falls as clients are added up to
what the KV cache holds; a prompt waits longer for its first token when the budget is contended; one client sees
exactly the decode-bound engine (one iteration carries its whole prompt); a finite run fed at once approaches the
steady state as it grows, and its fast-forward over repeated lifetimes changes nothing but the cost.
"""

from __future__ import annotations

import pytest

from suanli.perf import Layout, Placement, ServeWorkload, model_preset, shape_of
from suanli.perf.inference import _total, estimate
from suanli.perf.serve_iteration import Engine
from suanli.perf.serve_sched import budget_batch, finite_run, prefill_iterations
from suanli.topology import parse
from tests.cli_helpers import invoke


def _placement(gpus: int = 4) -> Placement:
    c = parse({"name": "t", "node_groups": [{"name": "n", "count": 1, "gpu": "H100-SXM", "gpus_per_node": 8,
                                             "nics": 8}], "fabric": "ib-ndr"})  # fmt: skip
    return Placement(c, c.compact_gpus(gpus))


def _est(w: ServeWorkload, model: str = "llama3.1-70b", gpus: int = 4, precision: str = "bf16"):
    p = _placement(gpus)
    return estimate(shape_of(model_preset(model)), p.gpu, Layout(gpus, gpus), precision, w, p.group_fn())  # type: ignore[arg-type]


@pytest.mark.parametrize("budget", [2048, 8192, 32768])
def test_throughput_never_falls_with_more_clients_up_to_the_kv_capacity(budget: int) -> None:
    last = 0.0
    cap = _est(ServeWorkload(467, 256, max_num_tokens=budget)).max_batch
    for c in (1, 2, 8, 32, 64, 128, 256, 512, cap):
        e = _est(ServeWorkload(467, 256, concurrency=c, max_num_tokens=budget))
        assert e.tokens_per_s >= last * (1 - 1e-9), (budget, c)
        last = e.tokens_per_s
    # the token budget bounds the steady batch: decode tokens plus the prompts that replace finishing requests
    assert cap <= max(1, budget_batch(budget, 467, 256))


def test_ttft_grows_as_the_budget_is_contended() -> None:
    # more sequences decoding leave fewer prompt tokens per iteration, and more prompts compete for them
    waits = [prefill_iterations(b, 2048, 256, 4096) for b in (1, 100, 200, 300, 400, 455)]
    assert waits == sorted(waits) and waits[0] == 1.0 and waits[-1] >= 2.0
    ttfts = [_est(ServeWorkload(2048, 256, concurrency=c, max_num_tokens=4096)).ttft_s for c in (1, 64, 256, 455)]
    assert all(t is not None for t in ttfts) and ttfts == sorted(ttfts)  # type: ignore[type-var]
    # the same clients on a smaller budget wait longer for their first token
    big = _est(ServeWorkload(2048, 256, concurrency=64, max_num_tokens=32768))
    small = _est(ServeWorkload(2048, 256, concurrency=64, max_num_tokens=2048))
    assert small.ttft_s is not None and big.ttft_s is not None and small.ttft_s > 1.2 * big.ttft_s
    # a prompt longer than the budget is chunked over several iterations
    assert prefill_iterations(1, 20000, 2000, 8192) == 3.0


def test_one_client_sees_the_decode_bound_engine() -> None:
    """At concurrency 1 the budget is idle: ITL is one decode step, TTFT half an iteration plus the iteration that
    carries the whole prompt -- the engine's own costs, to 1e-9."""
    p = _placement(4)
    s = shape_of(model_preset("llama3.1-70b"))
    eng = Engine(s, p.gpu, Layout(4, 4), "bf16", p.group_fn())
    i, o = 1024, 256
    ctx = i + o / 2
    step = _total(eng.iteration(1.0, ctx, i / o, i))
    first = step / 2 + _total(eng.iteration(1.0, ctx, i / o + i, i))
    e = _est(ServeWorkload(i, o, concurrency=1))
    assert e.itl_s == pytest.approx(step, rel=1e-9)
    assert e.ttft_s == pytest.approx(first, rel=1e-9)
    assert e.tokens_per_s == pytest.approx(o / (first + (o - 1) * step), rel=1e-9)


def test_a_finite_run_fed_at_once_ramps_up_and_approaches_the_steady_state() -> None:
    steady = _est(ServeWorkload(467, 256, max_num_tokens=8192)).tokens_per_s
    runs = [_est(ServeWorkload(467, 256, num_requests=n, max_num_tokens=8192)).tokens_per_s for n in (50, 500, 20000)]
    assert runs == sorted(runs)  # ramp-up and drain weigh less on a longer run
    assert runs[-1] == pytest.approx(steady, rel=0.05) and runs[0] < 0.5 * steady


def test_the_fast_forward_matches_plain_integration() -> None:
    """With a fixed iteration time and only the slots binding, N requests take N/S lifetimes of O iterations plus
    the ramp; the result is the same whether the run is long enough to fast-forward or not."""

    def t_iter(dec: float, ctx: float, pre: float, pre_len: float) -> float:
        return 0.01

    slots, o = 10.0, 100
    for n in (10, 1000, 100000):
        busy, ttft, itl = finite_run(t_iter, n, 10, o, 1e12, slots)
        assert itl == pytest.approx(0.01)
        assert busy == pytest.approx(n / slots * o * 0.01, rel=0.02 + slots / n), n
    # TTFT: the mean wait of the queue is half the run
    busy, ttft, _ = finite_run(t_iter, 100000, 10, o, 1e12, slots)
    assert ttft == pytest.approx(busy / 2, rel=0.02)


def test_the_budget_flag_is_bounded_and_reported() -> None:
    base = ["perf", "serve", "--model", "llama3.1-8b", "--input-len", "512", "--output-len", "128"]
    for bad in ("0", "-1", "99999999999"):
        r = invoke([*base, "--max-num-tokens", bad], code=2)
        assert "--max-num-tokens" in r.stderr and "Traceback" not in r.stderr
    r = invoke([*base, "--max-num-tokens", "2048", "--json"])
    assert '"max_num_tokens": 2048' in r.stdout


def test_a_finite_run_never_serves_more_at_a_finite_rate_than_fed_at_once() -> None:
    """500 requests at a rate the engine cannot keep up with ramp up, queue and drain like the run fed at once,
    only later: throughput grows with the rate and stays at or below the infinite-rate run."""
    last = 0.0
    runs = [_est(ServeWorkload(467, 256, rate=r, num_requests=500)) for r in (2, 8, 16, 24, 32, 64, 1000)]
    inf = _est(ServeWorkload(467, 256, num_requests=500))
    for e in runs:
        assert e.tokens_per_s >= last * (1 - 1e-6)
        assert e.tokens_per_s <= inf.tokens_per_s * 1.01  # to the integration's step
        last = e.tokens_per_s
    assert runs[-1].saturated and runs[-1].tokens_per_s == pytest.approx(inf.tokens_per_s, rel=0.02)


def test_a_finite_run_of_a_fraction_of_a_request_ends() -> None:
    """Requests split over attention replicas can leave a fraction of one request per replica: the run still ends
    (an idle engine waiting for an arrival that never comes would loop forever)."""

    def t_iter(dec: float, ctx: float, pre: float, pre_len: float) -> float:
        return 0.01

    for n in (0.5, 2.5, 7.25):
        busy, ttft, itl = finite_run(t_iter, n, 100, 10, 8192, 4, rate=0.1)
        assert busy >= (n - 1) / 0.1 and ttft >= 0 and itl >= 0
    p = _placement(8)  # attention data-parallel over 8 GPUs: 3 requests are 3/8 of one per replica
    w = ServeWorkload(467, 256, rate=1000.0, num_requests=3)
    e = estimate(shape_of(model_preset("mixtral-8x7b")), p.gpu, Layout(8, 1, ep=8), "fp8", w, p.group_fn())
    assert e.saturated and e.tokens_per_s > 0
