"""Analytic performance model: collectives, training step time, memory and plan search. Pure."""

from suanli.perf.collectives import OPS, CollectiveEstimate, bus_factor, estimate, sweep
from suanli.perf.inference import ServeEstimate, ServeWorkload, serve
from suanli.perf.models import TransformerArch, model_preset
from suanli.perf.plan import Placement, candidate_plans, default_global_batch, evaluate, search
from suanli.perf.presets import MODEL_PRESETS
from suanli.perf.serve_shape import SERVE_PRECISIONS, Layout, ServeError, ServeShape, shape_of
from suanli.perf.training import Plan, PlanError, TrainEstimate, TrainJob, memory_per_gpu, step_time

__all__ = [
    "MODEL_PRESETS",
    "OPS",
    "SERVE_PRECISIONS",
    "CollectiveEstimate",
    "Layout",
    "Placement",
    "Plan",
    "PlanError",
    "ServeError",
    "ServeEstimate",
    "ServeShape",
    "ServeWorkload",
    "TrainEstimate",
    "TrainJob",
    "TransformerArch",
    "bus_factor",
    "candidate_plans",
    "default_global_batch",
    "estimate",
    "evaluate",
    "memory_per_gpu",
    "model_preset",
    "search",
    "serve",
    "shape_of",
    "step_time",
    "sweep",
]
