"""LLM serving: throughput, time to first token and inter-token latency under continuous batching.

One engine iteration runs every active sequence's next decode token together with the prefill tokens of newly
admitted requests (in-flight batching); `perf.serve_iteration` costs it (GEMMs, attention, communication and kernel
launches, layer by layer on one GPU).

The steady state has `B` sequences decoding at mean context `I + O/2`, and `B/O` requests admitted per iteration
(each prefilling `I` tokens). `B` is the load's (Little's law: `B = rate·O·t_iter(B)`), the client count, or, at
maximum throughput, the largest batch the KV cache holds with every request's `I+O` tokens reserved (TensorRT-LLM's
guaranteed-no-evict scheduler) within the engine's batch and token caps. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from suanli.catalog import GPUSpec
from suanli.perf.models import TransformerArch
from suanli.perf.serve_iteration import Engine
from suanli.perf.serve_sched import (
    DEFAULT_MAX_NUM_TOKENS,
    budget_batch,
    finite_run,
    mean_queue_wait,
    prefill_iterations,
)
from suanli.perf.serve_shape import (
    ACT_BYTES,
    Layout,
    ServeError,
    ServePrecision,
    ServeShape,
    check_layout,
    check_precision,
    kv_bytes_per_token,
    shape_of,
    weight_bytes_per_gpu,
)
from suanli.perf.training import RUNTIME_RESERVE_BYTES, GroupFn

# ---- serving engine facts (TensorRT-LLM defaults; none fitted to a measurement) ------------------------------
KV_CACHE_FRACTION = 0.90  # kv_cache_free_gpu_mem_fraction: share of the memory left after weights
TOKENS_PER_BLOCK = 64  # paged KV cache block; a sequence reserves whole blocks
MAX_BATCH = 4096  # trtllm-bench's cap on the engine batch (decoder buffers)
MAX_NUM_TOKENS = 32768  # activation buffers are sized for a quarter of this many tokens
ACTIVATION_RESERVE_BYTES_PER_TOKEN_HIDDEN = 8 * ACT_BYTES  # activation buffers: ~8 hidden-sized tensors per token


@dataclass(frozen=True)
class ServeWorkload:
    input_len: int
    output_len: int
    concurrency: int | None = None  # closed loop: this many clients, each sends its next request on completion
    rate: float | None = None  # open loop: Poisson-like arrivals, requests/s; neither: infinite rate
    num_requests: int | None = None  # a finite run (benchmarks): ramp-down and queueing counted
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS  # the engine's token budget per iteration (decode + prefill)


@dataclass(frozen=True)
class ServeEstimate:
    tokens_per_s: float  # output tokens/s, all GPUs
    tokens_per_s_per_gpu: float
    requests_per_s: float
    ttft_s: float | None  # None: the queue grows without bound (offered load above capacity, unbounded run)
    itl_s: float
    batch: float  # mean sequences decoding per attention replica
    max_batch: int  # the most the KV cache (and engine caps) allow per attention replica
    bound: str  # compute | memory_bandwidth | communication | kv_capacity
    saturated: bool
    kv_tokens_per_gpu: float
    memory_bytes_per_gpu: dict[str, float] = field(default_factory=dict)
    breakdown: dict[str, float] = field(default_factory=dict)  # seconds of one steady-state iteration

    def as_dict(self) -> dict[str, object]:
        return {
            "output_tokens_per_s": round(self.tokens_per_s, 1),
            "output_tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 1),
            "requests_per_s": round(self.requests_per_s, 3),
            "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1e3, 2),
            "itl_ms": round(self.itl_s * 1e3, 3),
            "batch": round(self.batch, 1),
            "max_batch": self.max_batch,
            "bound": self.bound,
            "saturated": self.saturated,
            "kv_cache_tokens_per_gpu": int(self.kv_tokens_per_gpu),
            "memory_gib_per_gpu": {k: round(v / 2**30, 2) for k, v in self.memory_bytes_per_gpu.items()},
            "iteration_ms": {k: round(v * 1e3, 4) for k, v in self.breakdown.items()},
        }


def memory_per_gpu(s: ServeShape, lay: Layout, precision: ServePrecision, gpu: GPUSpec) -> dict[str, float]:
    weights = weight_bytes_per_gpu(s, lay, precision)
    activations = MAX_NUM_TOKENS / 4 * s.hidden * ACTIVATION_RESERVE_BYTES_PER_TOKEN_HIDDEN
    # HBM capacities are binary: an "80 GB" H100 holds 80 GiB (nvidia-smi: 81,559 MiB)
    free = gpu.memory_GB * 2**30 - weights - activations - RUNTIME_RESERVE_BYTES
    return {
        "weights": weights,
        "activations": activations,
        "runtime": RUNTIME_RESERVE_BYTES,
        "kv_cache": max(0.0, free * KV_CACHE_FRACTION),
    }


def _total(parts: dict[str, float]) -> float:
    return sum(parts.values())


def estimate(
    s: ServeShape, gpu: GPUSpec, lay: Layout, precision: ServePrecision, w: ServeWorkload, group: GroupFn
) -> ServeEstimate:
    """Steady-state serving of workload `w` on `lay.gpus` GPUs of model `gpu` laid out as `group` describes."""
    check_layout(s, lay)
    check_precision(gpu, precision)
    if w.input_len < 1 or w.output_len < 1:
        raise ServeError("--input-len and --output-len must be at least 1")
    mem = memory_per_gpu(s, lay, precision, gpu)
    kv_tok = kv_bytes_per_token(s, lay, precision, w.input_len + w.output_len)
    kv_tokens = mem["kv_cache"] / kv_tok
    reserved = math.ceil((w.input_len + w.output_len) / TOKENS_PER_BLOCK) * TOKENS_PER_BLOCK
    b_kv = int(kv_tokens // reserved)
    if b_kv < 1:
        need = (weight_bytes_per_gpu(s, lay, precision) + reserved * kv_tok) / 1e9
        raise ServeError(
            f"{s.name} in {precision} does not fit: {need:.1f} GB per GPU for the weights and one "
            f"{w.input_len}+{w.output_len}-token sequence, {gpu.name} has {gpu.memory_GB:g} GB "
            "(raise --gpus/--tp/--pp, or lower --precision or the lengths)"
        )
    if w.max_num_tokens < 1:
        raise ServeError("--max-num-tokens must be at least 1")
    b_tok = budget_batch(w.max_num_tokens, w.input_len, w.output_len)
    cap_batch = max(1, int(min(b_kv, MAX_BATCH, b_tok)))
    kv_limited = b_kv <= min(MAX_BATCH, b_tok)
    eng = Engine(s, gpu, lay, precision, group)
    replicas = lay.attn_dp
    i_len, o_len = w.input_len, w.output_len
    ctx = i_len + o_len / 2

    def t_iter(b: float) -> dict[str, float]:
        return eng.iteration(b, ctx, b * i_len / o_len, i_len)

    budget = float(w.max_num_tokens)

    def prefill_wait(b: float) -> float:
        """Time to first token of a request admitted into a batch of `b`: half an iteration for the current one
        to end, then the iterations that carry its prompt beside the steady traffic (one, unless the token budget
        is contended or the prompt needs several chunks)."""
        k = prefill_iterations(b, i_len, o_len, budget)
        pre = min(max(budget - b, 1.0), b * i_len / o_len + i_len / k)
        return _total(t_iter(b)) / 2 + k * _total(eng.iteration(b, ctx, pre, i_len))

    saturated = False
    ttft: float | None
    if w.rate is not None:
        r = w.rate / replicas
        lo, hi = 0.0, float(cap_batch)
        if r * o_len * _total(t_iter(hi)) > hi:
            saturated, batch = True, hi
        else:
            for _ in range(30):  # B = r·O·t(B): bisection on a monotone residual
                mid = (lo + hi) / 2
                if r * o_len * _total(t_iter(mid)) > mid:
                    lo = mid
                else:
                    hi = mid
            batch = hi
    elif w.concurrency is not None:
        batch = min(w.concurrency / replicas, float(cap_batch))
    else:
        batch = float(cap_batch)
        if w.num_requests is not None:
            batch = min(batch, w.num_requests / replicas)
        saturated = True
    parts = t_iter(batch)
    itl = _total(parts)
    mu = batch / (o_len * itl)  # requests/s one replica completes at this batch
    first = prefill_wait(batch)
    e2e = first + (o_len - 1) * itl
    if w.rate is not None and not saturated:
        req_s = w.rate / replicas
        ttft = first
    elif w.concurrency is not None:
        c = w.concurrency / replicas
        req_s = min(c, batch) / e2e
        ttft = first + max(0.0, c - batch) / req_s
    else:
        req_s = mu
        ttft = None
        if w.num_requests is not None:
            n = w.num_requests / replicas
            arrival = float("inf") if w.rate is None else w.rate / replicas
            ttft = first + mean_queue_wait(n, batch, mu, arrival)
    if w.num_requests is not None and w.concurrency is None:
        n = w.num_requests / replicas
        if w.rate is None:
            # all requests queued at once on an idle engine: the batch ramps up under the token budget, runs while
            # the queue lasts and drains (serve_sched.finite_run)
            busy, ttft, itl = finite_run(
                lambda b, c, p, pl: _total(eng.iteration(b, c, p, pl)), n, i_len, o_len, budget, float(cap_batch)
            )
        elif saturated:  # arrivals outpace the engine: it ramps up, runs full while the queue lasts and drains
            busy, ttft, itl = finite_run(
                lambda b, c, p, pl: _total(eng.iteration(b, c, p, pl)), n, i_len, o_len, budget, float(cap_batch),
                w.rate / replicas,
            )  # fmt: skip
        else:  # the last request arrives at n/rate and takes one request's latency
            busy = n / (w.rate / replicas) + e2e
        req_s = n / busy
    bound = max(("compute", "memory", "communication"), key=lambda k: parts[k])
    if bound != "compute" and kv_limited and batch >= cap_batch:
        bound = "kv_capacity"
    total = req_s * o_len * replicas
    return ServeEstimate(
        tokens_per_s=total,
        tokens_per_s_per_gpu=total / lay.gpus,
        requests_per_s=req_s * replicas,
        ttft_s=ttft,
        itl_s=itl,
        batch=batch,
        max_batch=cap_batch,
        bound={"memory": "memory_bandwidth"}.get(bound, bound),
        saturated=saturated,
        kv_tokens_per_gpu=kv_tokens,
        memory_bytes_per_gpu=mem,
        breakdown=parts,
    )


def serve(
    arch: TransformerArch, gpu: GPUSpec, lay: Layout, precision: ServePrecision, w: ServeWorkload, group: GroupFn
) -> ServeEstimate:
    """`estimate` for an architecture (dense or MoE)."""
    return estimate(shape_of(arch), gpu, lay, precision, w, group)
