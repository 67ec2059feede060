"""Trace-driven discrete-event simulation of the scheduler (`suanli sim`)."""

from suanli.sim.engine import SimConfig, Simulation, simulate
from suanli.sim.metrics import JobRecord, SimResult
from suanli.sim.runtime import RuntimeModel
from suanli.sim.workload import TraceJob

__all__ = ["JobRecord", "RuntimeModel", "SimConfig", "SimResult", "Simulation", "TraceJob", "simulate"]
