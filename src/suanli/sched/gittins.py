"""The Gittins index of a job's remaining service, from a sample of similar work's run times.

Among orders blind to each job's own length, serving the job with the highest Gittins index minimises the mean
completion time on one server (Gittins; Aalto, Ayesta and Righter, "On the Gittins index in the M/G/1 queue",
Queueing Systems 2009). For a job that has run `a` seconds, with run time D drawn from the sample:

    G(a) = max over b > a of  P(D <= b | D > a) / E[min(D, b) - a | D > a]

the best rate, completions per second of further service, that serving it up to some b buys. The index decides by
itself what a policy needs a constant for today: where run times have a decreasing hazard (most jobs tiny, a few run
for days: Philly, Pollux) G falls as a job runs, and the order is LAS (fresh work first, preempt the old); where the
hazard increases (a batch of similar lengths: Shockwave) G rises, and a running job should not be preempted for a
fresh one. A g-GPU job's index per GPU-second is G / g (Tiresias' two-dimensional attained service).

Robust to a sample that knows nothing of the job: a job that has run past every sample is taken to need as much
again as it has had (heavy tails, as `policies.est_left` takes it), never to be nearly done; its index is then 1 / a.
Pure and O(len(samples)).
"""

from __future__ import annotations

from bisect import bisect_right


def index(samples: tuple[float, ...], ran: float) -> float:
    """G(ran) over the sorted `samples` (seconds). `inf` for a job that has not run and whose sample holds a zero."""
    i = bisect_right(samples, ran)
    m = len(samples) - i
    if m == 0:
        return 1.0 / ran if ran > 0 else float("inf")
    best = 0.0
    below = 0.0  # sum over k in i..j of (s_k - ran)
    for j in range(i, len(samples)):
        s = samples[j] - ran
        below += s
        spent = below + (len(samples) - 1 - j) * s  # m x E[min(D, s_j) - ran | D > ran]
        if spent <= 0:
            return float("inf")
        rate = (j - i + 1) / spent
        if rate > best:
            best = rate
    return best
