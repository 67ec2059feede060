"""Runtime estimates without clairvoyance: what the tenant declared, else what its own finished work took.

Helios, 3Sigma and Lucid predict a job's duration from the same user's past jobs; here the estimate is the median
duration of the tenant's recent finished work with the same model and GPU count, falling back to coarser groups
(same model, same GPU count, the tenant's, everyone's) when a group has fewer than `min_samples`. A declared duration
(the spec's `duration`) wins; `max_duration` caps the estimate (the work is stopped there anyway). Pure: the caller
feeds finished work in (`record`) and asks at submission (`estimate`); the simulator and the server's scheduling
pass use the same class.

The policy that reads estimates (`sched/policies.py`, `est_left`) must survive bad ones: work that runs past its
estimate is treated as long (its remaining service is taken to be what it has had), not as nearly done.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

Key = tuple[object, ...]


@dataclass
class RuntimeHistory:
    window: int = 64  # recent durations kept per group
    min_samples: int = 3  # a group with fewer says nothing
    _groups: dict[Key, deque[float]] = field(default_factory=dict, repr=False)
    _versions: dict[str, int] = field(default_factory=dict, repr=False)

    @staticmethod
    def keys(tenant: str, model: str | None, gpus: int) -> tuple[Key, ...]:
        """The groups a job belongs to, finest first."""
        return (("t", tenant, model, gpus), ("t", tenant, model), ("t", tenant, gpus), ("t", tenant), ("all",))

    def record(self, tenant: str, model: str | None, gpus: int, seconds: float) -> None:
        if seconds < 0 or seconds != seconds:  # negative or NaN: not a duration
            return
        for k in self.keys(tenant, model, gpus):
            group = self._groups.get(k)
            if group is None:
                group = self._groups[k] = deque(maxlen=self.window)
            group.append(float(seconds))
        self._versions[tenant] = self._versions.get(tenant, 0) + 1

    def version(self, tenant: str) -> int:
        """How many runs of the tenant's were recorded: an estimate taken at another version may be stale."""
        return self._versions.get(tenant, 0)

    def median(self, tenant: str, model: str | None, gpus: int) -> float | None:
        for k in self.keys(tenant, model, gpus):
            group = self._groups.get(k)
            if group is not None and len(group) >= self.min_samples:
                return float(statistics.median(group))
        return None

    def samples(self, tenant: str, model: str | None, gpus: int) -> tuple[float, ...]:
        """The finest group's recent run times, sorted (empty when no group has `min_samples`)."""
        for k in self.keys(tenant, model, gpus):
            group = self._groups.get(k)
            if group is not None and len(group) >= self.min_samples:
                return tuple(sorted(group))
        return ()

    def estimate(
        self,
        tenant: str,
        model: str | None,
        gpus: int,
        declared: float | None = None,
        limit: float | None = None,
    ) -> float | None:
        """Seconds the work is expected to run on a compact placement, or None when nothing is known."""
        est = declared if declared is not None else self.median(tenant, model, gpus)
        if limit is not None:
            est = limit if est is None else min(est, limit)
        return est


def run_seconds(seconds: float, longest: float) -> float | None:
    """A finished run's time as history takes it: None when it is no run at all (zero, negative, NaN: a clock
    that went back, a row nobody ran), capped at `longest` (a run can last no longer than any limit enforces, and
    one absurd sample must not stretch a tenant's estimates past every limit)."""
    if not seconds > 0:  # also NaN
        return None
    return min(float(seconds), longest)


def for_request(
    history: RuntimeHistory,
    tenant: str,
    model: str | None,
    gpus: int,
    declared: float | None = None,
    limit: float | None = None,
    with_samples: bool = True,
) -> tuple[float | None, tuple[float, ...]]:
    """(`est_runtime`, `est_samples`) for a request, from `RuntimeHistory.estimate` and `.samples` as the simulator
    asks them at an arrival (there nothing is declared and nothing limits, and this gives the same two values). A
    declared duration wins over the samples as over the median; `limit` (the spec's `max_duration`, enforced) caps
    each sample as it caps the estimate."""
    est = history.estimate(tenant, model, gpus, declared, limit)
    if declared is not None or not with_samples:
        return est, ()
    samples = history.samples(tenant, model, gpus)
    if limit is not None:
        samples = tuple(min(s, limit) for s in samples)
    return est, samples
