"""The autoscaler's decision: how many replicas an endpoint should have, from what it sees now. Pure and
clock-free: the caller passes the seconds since things happened, so the rule is tested as a function
(`tests/test_serving_core.py`, hypothesis properties) and replayed without a server.

The rule:
- `need` = ceil(load / target), where load is the requests in flight or waiting at the gateway;
- below `min_replicas`, or load that needs more than it has: up, at once, to min(max_replicas, max(need, min));
  a request waiting at zero needs one;
- above `max_replicas`: down to it, at once;
- more than it needs (and more than `min_replicas`): down to max(min_replicas, need, 1 while requests came in the
  last `idle_s`), but only once `idle_s` has passed since the last change and since load last needed more; so it
  goes to zero only after `idle_s` without any request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Observed:
    """What the autoscaler sees: `load` requests in flight or waiting now; seconds since the last request (None:
    never), since the replica count last changed (None: never), and since load last needed the replicas it has."""

    replicas: int  # the desired count now
    load: int
    since_request_s: float | None
    since_change_s: float | None
    since_busy_s: float | None = None


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str


def decide(o: Observed, min_replicas: int, max_replicas: int, target: int, idle_s: float) -> Decision | None:
    """The new replica count and why, or None to keep it."""
    need = math.ceil(max(0, o.load) / max(1, target))
    if o.replicas > max_replicas:
        return Decision(max_replicas, f"above max_replicas ({max_replicas}): {o.replicas} → {max_replicas}")
    want_up = min(max_replicas, max(need, min_replicas))
    if want_up > o.replicas:
        if o.replicas < min_replicas and need <= min_replicas:
            why = f"below min_replicas ({min_replicas})"
        elif o.replicas == 0:
            why = f"cold start: {o.load} request(s) waiting at zero replicas"
        else:
            why = f"{o.load} request(s) in flight or waiting, target {target} per replica"
        return Decision(want_up, f"{why}: {o.replicas} → {want_up}")
    recent = o.since_request_s is not None and o.since_request_s < idle_s
    floor = max(min_replicas, need, 1 if recent else 0)
    if floor >= o.replicas:
        return None
    settled = all(x is None or x >= idle_s for x in (o.since_change_s, o.since_busy_s))
    if not settled:
        return None
    if floor == 0:
        idle = "never used" if o.since_request_s is None else f"no request for {o.since_request_s:.0f} s"
        return Decision(0, f"idle ({idle}, idle_s {idle_s:g}): {o.replicas} → 0")
    return Decision(floor, f"{o.load} request(s) in flight need {need} at target {target}, for {idle_s:g} s: "
                           f"{o.replicas} → {floor}")  # fmt: skip
