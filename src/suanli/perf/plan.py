"""Parallel-plan search and the bridge from a placement (cluster + GPU list) to the training model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from suanli.catalog import GPUSpec
from suanli.perf.train_plan import (
    GroupFn,
    Plan,
    PlanError,
    Recompute,
    TrainEstimate,
    TrainJob,
    overlap_gap,
    precision_gap,
)
from suanli.perf.training import step_time
from suanli.topology.model import Cluster, CommGroup


@dataclass(frozen=True)
class Placement:
    """GPUs (in rank order) of one cluster that a job runs on."""

    cluster: Cluster
    gpus: NDArray[np.int64]

    @property
    def n_gpus(self) -> int:
        return int(self.gpus.size)

    def group_fn(self) -> GroupFn:
        cache: dict[tuple[int, int], CommGroup] = {}

        def group(stride: int, size: int) -> CommGroup:
            key = (stride, size)
            if key not in cache:
                cache[key] = self.cluster.comm_group(self.gpus[0 : stride * size : stride])
            return cache[key]

        return group

    @property
    def gpu(self) -> GPUSpec:
        """The GPU model the placement starts on (plans assume one model)."""
        return self.cluster.group_of(int(self.cluster.gpu_node[self.gpus[0]])).gpu

    @property
    def domain_size(self) -> int:
        """GPUs per NVLink domain (node, for PCIe boxes) where this placement starts."""
        first_node = int(self.cluster.gpu_node[self.gpus[0]])
        grp = self.cluster.group_of(first_node)
        return grp.gpus_per_node * (grp.nvlink_domain_nodes if grp.has_nvlink_domain else 1)


def evaluate(job: TrainJob, plan: Plan, placement: Placement) -> TrainEstimate:
    return step_time(job, plan, placement.gpu, placement.n_gpus, placement.group_fn())


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in (1, 2, 4, 8, 16, 32, 64) if d <= cap and n % d == 0]


MOE_OPTIONS = ("moe_a2a_overlap", "moe_dispatcher", "fp8_attention", "recompute_modules")


def with_moe_options(plan: Plan, domain: int, fixed: dict[str, object] | None = None) -> Plan | None:
    """`plan` with the MoE and attention options a real Megatron run of it would choose, where `fixed` does not
    set them; None when a fixed option cannot run on this plan.

    * EP all-to-all overlap on wherever Megatron allows it (`overlap_gap`): it never lengthens a step here;
    * the flex dispatcher (DeepEP / HybridEP) when the EP group spans NVLink domains (`domain` GPUs each), the
      plain all-to-all inside one (the same cost there);
    * BF16 attention and no selective recompute modules: FP8 attention changes the numerics (most FP8 recipes
      leave it off), so only a caller turns it on."""
    fixed = fixed or {}
    overlap = fixed.get("moe_a2a_overlap")
    if overlap is None:
        overlap = overlap_gap(plan) is None
    elif overlap and overlap_gap(plan) is not None:
        return None
    dispatcher = fixed.get("moe_dispatcher") or (
        "flex" if plan.ep * plan.etp > domain or plan.ep <= 1 else "alltoall"  # (no dispatcher without EP)
    )
    return replace(
        plan,
        moe_a2a_overlap=bool(overlap),
        moe_dispatcher=dispatcher,  # type: ignore[arg-type]
        fp8_attention=bool(fixed.get("fp8_attention", False)),
        recompute_modules=tuple(fixed.get("recompute_modules", ())),  # type: ignore[call-overload]
    )


def candidate_plans(job: TrainJob, n_gpus: int, domain: int, fixed: dict[str, object] | None = None) -> Iterator[Plan]:
    """Every plan worth trying: TP inside one NVLink domain, PP over layers (Megatron's uneven splits
    included), CP over the sequence, EP over the experts (MoE models); each with the MoE options of
    `with_moe_options`."""
    fixed = {k: v for k, v in (fixed or {}).items() if v is not None}
    a = job.arch
    tps = [fixed["tp"]] if "tp" in fixed else _divisors(n_gpus, min(domain, 8, a.heads))
    pps = [fixed["pp"]] if "pp" in fixed else [d for d in (1, 2, 4, 8, 16, 32) if d <= a.layers]
    cps = [fixed["cp"]] if "cp" in fixed else [c for c in (1, 2, 4, 8) if job.seq_len >= 4096 * c or c == 1]
    mbss = [fixed["mbs"]] if "mbs" in fixed else [1, 2, 4]
    zeros = [fixed["zero"]] if "zero" in fixed else [1, 3]
    # selective recompute costs what none costs with flash attention (no s x s scores to keep): not searched
    recs: list[Recompute] = [fixed["recompute"]] if "recompute" in fixed else ["none", "full"]  # type: ignore[list-item]
    if fixed.get("recompute_modules") and "recompute" not in fixed:
        recs = ["selective"]  # named modules are selective recompute
    etps = [fixed["etp"]] if "etp" in fixed else [1]
    for tp in tps:
        for pp in pps:
            for cp in cps:
                if n_gpus % (tp * pp * cp):
                    continue
                dp = n_gpus // (tp * pp * cp)
                stage = tp * cp * dp
                if "ep" in fixed:
                    eps = [int(fixed["ep"])]  # type: ignore[call-overload]
                elif a.is_moe:
                    eps = [e for e in (1, 2, 4, 8, 16, 32, 64, 128) if a.experts % e == 0 and stage % e == 0]
                    eps = eps[-3:]  # the widest expert splits: fewer experts and less optimizer state per GPU
                else:
                    eps = [1]
                vps = [fixed["vp"]] if "vp" in fixed else sorted({1} | ({v for v in (2, 3, 4, 5, 6, 8) if pp > 1}))
                for vp in vps:
                    if pp > 1 and pp * vp > a.layers + 2:
                        continue  # more pipeline chunks than layers: Megatron cannot lay it out
                    if pp == 1 and vp != 1:
                        continue
                    for mbs in mbss:
                        if job.global_batch % (dp * mbs):
                            continue
                        for zero in zeros:
                            if zero >= 3 and pp > 1:
                                continue  # ZeRO-3 with pipelining is not a Megatron configuration
                            for ep in eps:
                                for etp in etps:
                                    if stage % (ep * etp):
                                        continue
                                    for rec in recs:
                                        plan = with_moe_options(
                                            Plan(tp=tp, pp=pp, cp=cp, vp=vp, mbs=mbs, zero=zero, recompute=rec,
                                                 dp=dp, ep=ep, etp=etp), domain, fixed)  # fmt: skip
                                        if plan is not None:
                                            yield plan


def _expert_split_gap(job: TrainJob, n_gpus: int, fixed: dict[str, object]) -> str | None:
    """Why a fixed expert split fits no plan, as Megatron would say it (else None: look at the batch)."""
    ep, etp = int(fixed.get("ep") or 1), int(fixed.get("etp") or 1)  # type: ignore[call-overload]
    if ep * etp == 1:
        return None
    if job.arch.is_moe and job.arch.experts % ep:
        return f"--ep {ep} must divide the model's {job.arch.experts} experts"
    pp = int(fixed.get("pp") or 1)  # type: ignore[call-overload]
    if n_gpus % pp or (n_gpus // pp) % (ep * etp):
        return (f"--ep {ep} x --etp {etp} must divide the GPUs of one pipeline stage ({n_gpus} GPUs / pp {pp} = "
                f"{n_gpus // pp if n_gpus % pp == 0 else n_gpus / pp:g})")  # fmt: skip
    return None


def default_global_batch(n_gpus: int) -> int:
    """Sequences per step when none is given: 256, or more at scale so every data-parallel rank still gets
    a few micro-batches (a quarter of the GPU count, a power of two: 4,096 on 16,384 GPUs, as Llama 3 405B
    trained with 16M-token batches)."""
    want = max(256, n_gpus // 4)
    return 1 << (want - 1).bit_length()


def search(
    job: TrainJob, placement: Placement, fixed: dict[str, object] | None = None, top: int = 5
) -> list[TrainEstimate]:
    """The fastest plans that fit in memory, best first (none fit → the smallest-memory plans, flagged)."""
    results: list[TrainEstimate] = []
    gpu = placement.gpu
    unsupported = precision_gap(gpu, job.precision)
    if unsupported:
        raise PlanError(unsupported)  # every caller skips such an offer or placement, as it skips a plan that fails
    group = placement.group_fn()
    memo: dict[object, object] = {}
    why: Counter[str] = Counter()
    for plan in candidate_plans(job, placement.n_gpus, placement.domain_size, fixed):
        try:
            results.append(step_time(job, plan, gpu, placement.n_gpus, group, memo))
        except PlanError as e:
            why[str(e)] += 1
    if not results and why:  # plans there were, and each was refused: say why (the batch was not the problem)
        raise PlanError(f"no parallel plan fits these GPUs, model and batch: {why.most_common(1)[0][0]}")
    gap = _expert_split_gap(job, placement.n_gpus, fixed or {})
    if not results and gap:
        raise PlanError(f"no parallel plan matches these GPUs and model: {gap}")
    if not results:
        raise PlanError(
            f"no parallel plan matches these GPUs, model and batch: global batch {job.global_batch} must be a "
            f"multiple of data-parallel size x micro-batch on {placement.n_gpus} GPUs (try --global-batch "
            f"{default_global_batch(placement.n_gpus * 4)} or fewer GPUs; check fixed sizes)"
        )
    fitting = sorted((r for r in results if r.fits), key=lambda r: r.step_time_s)
    if fitting:
        return fitting[:top]
    return sorted(results, key=lambda r: r.memory_bytes_per_gpu)[:top]
