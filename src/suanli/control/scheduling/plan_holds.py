"""What a scheduling pass holds back for plans on each cluster it visits.

Active plans reserve, of a GPU model, the GPUs their work leaves idle (`plans.reservations`, per org): the pass keeps
that many of the model's GPUs for the plans' own work, counted over every cluster that has the model (a count, never
particular GPUs). Clusters are visited in turn, each cycle deciding on its own state; so each cluster holds back, of
each model, what the others cannot: the idle reservations less the free GPUs of that model on the clusters still to
come and on those already decided (as their cycles left them). The last cluster with the model thus holds whatever
is still short, and together the clusters leave at least the idle reservations free, or as many as were free. The
count a cluster holds is shared among the orgs in id order; an org's plan work may use its own share, and what it
is placed on counts against its org's idle reservation for the clusters after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from suanli.sched import ClusterState, CycleResult


@dataclass
class PlanHolds:
    idle: dict[str, dict[str, int]]  # GPU model -> org -> GPUs its active plans reserve and their work leaves idle
    ahead: dict[str, int] = field(default_factory=dict)  # free GPUs per model on the clusters still to visit
    behind: dict[str, int] = field(default_factory=dict)  # free GPUs per model on the clusters decided

    @classmethod
    def over(cls, idle: dict[str, dict[str, int]], states: list[ClusterState]) -> PlanHolds:
        """Holds for a pass over these clusters' states, in the order it visits them."""
        out = cls({m: dict(by) for m, by in idle.items()})
        for st in states:
            for m in st.models:
                out.ahead[m] = out.ahead.get(m, 0) + st.free_whole_of(m)
        return out

    def on(self, state: ClusterState) -> None:
        """Hold back on `state` (a cluster's, before its cycle) what the other clusters cannot hold of each model."""
        counts: dict[str, dict[str, int]] = {}
        for m in state.models:
            self.ahead[m] = self.ahead.get(m, 0) - state.free_whole_of(m)
            by_org = self.idle.get(m)
            if not by_org:
                continue
            short = max(0, sum(by_org.values()) - self.ahead[m] - self.behind.get(m, 0))
            share: dict[str, int] = {}
            for org in sorted(by_org):  # every org with a plan of the model, 0 where it holds nothing here
                share[org] = min(by_org[org], short)
                short -= share[org]
            counts[m] = share
        state.hold(counts)

    def after(self, state: ClusterState, result: CycleResult | None) -> None:
        """The cluster's cycle decided (None: no cycle ran) and left `state`: its free GPUs count for the clusters
        after it, and the plan work it placed uses its orgs' idle reservations."""
        for m in state.models:
            self.behind[m] = self.behind.get(m, 0) + state.free_whole_of(m)
        for p in result.placed if result is not None else ():
            a = state.allocations.get(p.request_id)
            if a is None or a.request.priority != "reserved":
                continue
            for m, n in state.per_model(a.gpus):
                by_org = self.idle.get(m, {})
                if a.request.tenant in by_org:
                    by_org[a.request.tenant] = max(0, by_org[a.request.tenant] - n)

    def signature(self) -> tuple[tuple[str, str, int], ...]:
        return tuple(sorted((m, org, n) for m, by in self.idle.items() for org, n in by.items()))
