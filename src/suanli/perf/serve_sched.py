"""Continuous batching under a per-iteration token budget: how prompts share an engine iteration with decoding.

Both serving engines the model follows schedule one iteration at a time under two caps: the sequences in flight
(TensorRT-LLM `max_batch_size`, vLLM `max_num_seqs`) and the tokens one iteration carries (TensorRT-LLM
`max_num_tokens`, vLLM `max_num_batched_tokens`). Every running sequence's next decode token is scheduled first;
prompt tokens of waiting requests fill what is left of the token budget, a prompt longer than that is split into
chunks over several iterations (chunked prefill / chunked context). Sources: TensorRT-LLM's "Tuning Max Batch Size
and Max Num Tokens" guide (the scheduler's token budget, default 8192) and vLLM's `SchedulerConfig`
(`max_num_batched_tokens`, decode-first chunked prefill). An iteration's time is the engine's roofline of its token
mix (`perf.serve_iteration`); this module says which mix each iteration carries. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable

# (decoding sequences, their mean context, prefill tokens, prompt length) -> seconds of one iteration
IterFn = Callable[[float, float, float, float], float]

DEFAULT_MAX_NUM_TOKENS = 8192  # TensorRT-LLM's default token budget per iteration (trtllm-build / trtllm-serve)


def budget_batch(budget: float, input_len: int, output_len: int) -> float:
    """The most sequences a steady state can decode when every iteration also prefills the prompts that replace
    the finishing ones (`B/O` prompts of `I` tokens): `B + B·I/O ≤ budget`."""
    return budget / (1.0 + input_len / output_len)


def prefill_iterations(batch: float, input_len: int, output_len: int, budget: float) -> float:
    """Iterations from a prompt's admission to its first token at steady state with `batch` sequences decoding.

    An iteration carries `budget - batch` prefill tokens after the decode tokens; the steady traffic of other
    prompts (`batch/O` per iteration, `I` tokens each) uses a share `rho` of that. A new prompt waits behind the
    prompt tokens ahead of it (deterministic service: `rho·I / 2(1-rho)`, at most one iteration's worth of other
    prompts); it and they take whole iterations of `budget - batch` prompt tokens, at least one."""
    room = max(budget - batch, 1.0)
    demand = batch * input_len / output_len
    rho = demand / room
    ahead = demand if rho >= 1.0 else min(demand, rho * input_len / (2.0 * (1.0 - rho)))
    return float(max(1, math.ceil((ahead + input_len) / room - 1e-9)))


def finite_run(
    t_iter: IterFn,
    requests: float,
    input_len: int,
    output_len: int,
    budget: float,
    slots: float,
    rate: float = math.inf,
) -> tuple[float, float, float]:
    """(seconds, mean TTFT, mean ITL) of `requests` arriving at `rate` per second (infinite: queued at once) on
    an idle engine.

    The engine admits waiting prompts as far as the token budget left after the decode tokens and the free
    sequence slots allow, so the batch ramps up from empty, runs at the mixed steady state while the queue lasts,
    and drains as the last requests finish. Integrated over steps of a quarter of a request's life (cohorts
    admitted in the same step finish together); once the run repeats itself from one request lifetime to the
    next, the rest of the queue is fast-forwarded by whole lifetimes, so one estimate costs a few dozen
    iteration evaluations whatever the number of requests. Requests are served in arrival order; TTFT counts
    from each one's arrival."""
    o_len = float(output_len)
    h = max(1.0, o_len / 4.0)
    period = max(1, round(o_len / h))
    cohorts: list[list[float]] = []  # [sequences, decode iterations left]
    queue, clock = float(requests), 0.0
    ttft_sum = itl_sum = decode_iters = 0.0
    steps, mark, skipped = 0, None, False
    last_dt = 0.0 if rate == math.inf else t_iter(0.0, float(input_len), min(budget, float(input_len)), input_len)
    while queue > 1e-9 or cohorts:
        if not skipped and steps >= 2 * period and steps % period == 0:
            if mark is None:
                mark = (clock, queue, ttft_sum, itl_sum, decode_iters)
            else:  # one lifetime recorded: repeat it while the queue lasts, keeping two lifetimes to run out
                d_clock, d_adm = clock - mark[0], mark[1] - queue
                d_ttft, d_itl, d_dec = ttft_sum - mark[2], itl_sum - mark[3], decode_iters - mark[4]
                reps = math.floor(queue / d_adm) - 2 if d_adm > 0 else 0
                if reps >= 1:
                    ttft_sum += reps * d_ttft + d_adm * d_clock * reps * (reps + 1) / 2
                    clock += reps * d_clock
                    queue -= reps * d_adm
                    itl_sum += reps * d_itl
                    decode_iters += reps * d_dec
                skipped = True
        steps += 1
        active = sum(c for c, _ in cohorts)
        room_tokens = max(budget - active, 0.0)
        # requests that have arrived by the middle of this step (the last step's iteration time as the guess)
        arrived = queue - max(0.0, requests - rate * (clock + h * last_dt / 2)) if rate < math.inf else queue
        admit = min(arrived, max(slots - active, 0.0), h * room_tokens / input_len)
        if admit < 1e-9 and not cohorts:  # idle: wait for the next arrival, or run one prompt alone, chunked
            if arrived < min(1.0, queue) - 1e-9 and rate < math.inf:
                clock = max(clock, (requests - queue + 1.0) / rate)
                continue
            admit = min(queue, 1.0)
        queue -= admit
        ctx = (sum(c * (input_len + o_len - r) for c, r in cohorts) / active) if active else float(input_len)
        step = h
        if queue <= 1e-9:  # the queue is empty: run until the step ends or the last sequence finishes
            step = max(1.0, min(h, max([r for _, r in cohorts] + ([o_len] if admit else [0.0]))))
        dt = t_iter(active + admit / 2.0, ctx, admit * input_len / step, float(input_len))
        last_dt = dt
        if admit:
            chunks = max(1.0, input_len / max(room_tokens, 1.0))
            ttft_sum += admit * (clock + step * dt / 2.0 + chunks * dt)
        clock += step * dt
        survivors = []
        for c, r in cohorts:
            ran = min(r, step)
            itl_sum += c * ran * dt
            decode_iters += c * ran
            if r > step:
                survivors.append([c, r - step])
        if admit:
            ran = min(o_len - 1.0, step / 2.0)
            itl_sum += admit * ran * dt
            decode_iters += admit * ran
            if o_len - 1.0 - ran > 0:
                survivors.append([admit, o_len - 1.0 - ran])
        cohorts = survivors
    itl = itl_sum / decode_iters if decode_iters else 0.0
    arrivals = 0.0 if rate == math.inf else requests * (requests - 1.0) / (2.0 * rate)  # sum of j/rate
    return clock, max(0.0, ttft_sum - arrivals) / requests, itl


def mean_queue_wait(n: float, slots: float, mu: float, arrival: float) -> float:
    """Mean wait for a slot of `n` requests arriving at `arrival`/s (inf: all at once) into `slots` slots that
    free at `mu`/s: request j starts at max(j/arrival, (j - slots)/mu)."""
    if n <= slots:
        return 0.0
    a = 1.0 / mu - (0.0 if math.isinf(arrival) else 1.0 / arrival)
    if a <= 0:
        return 0.0
    j0 = max(slots, slots / mu / a)  # first request that waits
    if j0 >= n:
        return 0.0
    k = n - j0
    return (a * (j0 + n) / 2 * k - slots / mu * k) / n
