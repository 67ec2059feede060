"""Topology-aware scheduling framework. Pure: no I/O, no wall clock; time and state are passed in."""

from suanli.sched.framework import Scheduler
from suanli.sched.placement import PLACEMENTS, PlacementResult, first_fit, place_slice, topology_aware
from suanli.sched.policies import KNOBS, POLICIES, Policy, SchedulerConfig, config_name, configured, policy
from suanli.sched.state import ClusterState, cluster_host, gpus_carried, host_capacity, host_share
from suanli.sched.types import (
    CLASS_RANK,
    FULL,
    Allocation,
    CycleResult,
    Decision,
    ModelHint,
    Pending,
    Place,
    Preempt,
    Request,
    Resize,
    mig_milli,
)

__all__ = [
    "CLASS_RANK",
    "FULL",
    "KNOBS",
    "PLACEMENTS",
    "POLICIES",
    "Allocation",
    "ClusterState",
    "CycleResult",
    "Decision",
    "ModelHint",
    "Pending",
    "Place",
    "PlacementResult",
    "Policy",
    "Preempt",
    "Request",
    "Resize",
    "Scheduler",
    "SchedulerConfig",
    "cluster_host",
    "config_name",
    "configured",
    "first_fit",
    "gpus_carried",
    "host_capacity",
    "host_share",
    "mig_milli",
    "place_slice",
    "policy",
    "topology_aware",
]
