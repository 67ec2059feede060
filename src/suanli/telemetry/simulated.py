"""Simulated GPU telemetry for `virtual` nodes: plausible readings and injected faults, with no hardware.

Deterministic: no I/O, no wall clock, no global RNG. Time and seed are arguments, and the collector's only state is
per-GPU (temperature, ECC counters, the faults seen last call), so the same seed and the same call sequence give
the same samples. One call for 10,000 GPUs is a handful of NumPy array operations plus building the samples.

The physics is deliberately simple and documented constant by constant; figures marked "judgement" are round
numbers chosen to look like `nvidia-smi` on a healthy air- or liquid-cooled server, not measurements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass, fields
from typing import Literal

import numpy as np

from suanli import catalog
from suanli.telemetry.samples import GpuSample

FaultKind = Literal["overtemp", "xid", "ecc_dbe", "off_bus", "silent"]

IDLE_POWER_FRACTION = 0.12  # idle draw / TDP; H100 SXM idles near 70-90 W of 700 W (judgement)
COMM_POWER_SHARE = 0.4  # a busy GPU waiting on communication draws this share of the dynamic power (judgement)
POWER_DEMAND_HEADROOM = 1.08  # full math load asks for more than TDP, so it runs power-capped as real ones do
RISE_AT_TDP_C = 45.0  # healthy cooling: steady state at TDP sits 45 K over inlet (R_th = 45 / TDP; judgement)
TAU_S = 45.0  # thermal time constant of die + heatsink, within the 30-60 s usually seen (judgement)
FAULT_RISE_C = 30.0  # a failed fan drives the target 30 K past slowdown; HW slowdown then holds it (judgement)
HW_SLOWDOWN_OVERSHOOT_C = 3.0  # how far past slowdown HW slowdown lets it run, at most half the gap to shutdown
SW_THERMAL_CLOCK = 0.9  # clock factor between max operating temperature and slowdown (judgement)
HW_SLOWDOWN_CLOCK = 0.5  # HW slowdown roughly halves clocks (NVIDIA: "reduces clocks by a factor of 2 or more")
POWER_CAP_CLOCK = 0.95  # power-capped boost (judgement)
UTIL_NOISE = 1.5  # percentage points, standard deviation (judgement)
POWER_NOISE = 0.01  # relative standard deviation of a power reading (judgement)
IDLE_MEM_MIB = 300  # memory used by nobody's process: context of the persistence daemon (judgement)
COOLING_SPREAD = (0.85, 1.15)  # per-GPU factor on R_th: airflow position in the chassis differs (judgement)
MEM_BUSY = (0.7, 0.9)  # share of memory an allocated GPU's job holds, fixed per GPU (judgement)
MEM_USABLE = 0.9956  # NVML total / nominal GiB (81559 MiB of an 80 GB H100, 143771 of a 141 GB H200)
DEFAULT_THERMAL_C = (85.0, 90.0, 95.0)  # max operating, slowdown, shutdown where the catalog has none (judgement)
# (boost, idle) SM clocks in MHz per architecture, from NVIDIA product pages and nvidia-smi idle readings (recalled)
CLOCKS_MHZ: dict[str, tuple[int, int]] = {
    "volta": (1530, 135),
    "turing": (1590, 300),
    "ampere": (1410, 210),
    "ada": (2520, 210),
    "hopper": (1980, 345),
    "blackwell": (1965, 345),
}
# Random faults: XIDs seen in production fleets, weighted towards the application ones (judgement).
RANDOM_XIDS = np.array([13, 31, 43, 48, 63, 74, 94])
RANDOM_XID_WEIGHTS = np.array([0.25, 0.25, 0.2, 0.05, 0.1, 0.1, 0.05])
DBE_XIDS = (48, 94)  # these also raise the double-bit ECC counter
LOST_ERROR = "GPU has fallen off the bus"  # the `error` of a lost GPU (NVML_ERROR_GPU_IS_LOST); XID 79 once
# NVML clocks-event reasons (pynvml nvmlClocksEventReason*)
GPU_IDLE, SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL = 0x01, 0x04, 0x08, 0x20, 0x40


@dataclass(frozen=True, slots=True)
class SimGpu:
    node: str
    gpu: int
    uuid: str
    model: str  # catalog name or alias


@dataclass(frozen=True, slots=True)
class Load:
    """What the allocation on a GPU does; a GPU absent from `loads` is unallocated."""

    busy: float  # 0..1, fraction of time kernels run
    compute: float = 1.0  # 0..1, share of busy time that is math (the rest: communication); drives power


@dataclass(frozen=True, slots=True)
class Fault:
    """An injected fault. `overtemp` (failed fan), `off_bus` (GPU lost) and `silent` (no samples at all, as if the
    node agent stopped) act while passed; `xid` reports its XID once and `ecc_dbe` raises the double-bit counter
    once, on the first call that passes them (pass them again after a call without them to repeat)."""

    kind: FaultKind
    node: str
    gpu: int
    xid: int = 0


@dataclass(frozen=True)
class _Model:
    tdp: float
    idle_w: float
    r_th: float  # K/W
    max_op: float
    slowdown: float
    cap: float  # highest temperature HW slowdown allows
    boost: int
    idle_clock: int
    mem_total: int


def _model(name: str) -> _Model:
    spec = catalog.gpu(name)
    t = spec.thermal
    max_op, slowdown, shutdown = (t.max_operating_C, t.slowdown_C, t.shutdown_C) if t else DEFAULT_THERMAL_C
    boost, idle_clock = CLOCKS_MHZ[spec.arch]
    return _Model(
        tdp=spec.tdp_W,
        idle_w=IDLE_POWER_FRACTION * spec.tdp_W,
        r_th=RISE_AT_TDP_C / spec.tdp_W,
        max_op=max_op,
        slowdown=slowdown,
        cap=slowdown + min(HW_SLOWDOWN_OVERSHOOT_C, (shutdown - slowdown) / 2),
        boost=boost,
        idle_clock=idle_clock,
        mem_total=int(spec.memory_GB * 1024 * MEM_USABLE),
    )


class SimulatedCollector:
    """Stateful, deterministic GPU sampler for virtual nodes (see the module docstring)."""

    def __init__(self, seed: int, ambient_c: float = 30.0, fault_rate_per_gpu_hour: float = 0.0) -> None:
        if not -20.0 <= ambient_c <= 60.0:
            raise ValueError(f"ambient_c must be within -20..60 °C (inlet air), got {ambient_c}")
        if fault_rate_per_gpu_hour < 0:
            raise ValueError(f"fault_rate_per_gpu_hour must be >= 0, got {fault_rate_per_gpu_hour}")
        self.ambient_c = ambient_c
        self.fault_rate_per_gpu_hour = fault_rate_per_gpu_hour
        self._rng = np.random.default_rng(seed)
        self._slot: dict[tuple[str, int], int] = {}
        self._temp = np.zeros(0)
        self._last_t = np.zeros(0)  # NaN: never sampled
        self._dbe = np.zeros(0, dtype=np.int64)
        self._mem_frac = np.zeros(0)
        self._cooling = np.zeros(0)  # per-GPU factor on the model's thermal resistance
        self._model_id: dict[str, int] = {}
        self._table = np.zeros((0, len(fields(_Model))))  # one row of `_Model` per model seen
        self._faults_before: dict[tuple[str, int], set[Fault]] = {}  # faults passed at each GPU's last sample

    def _slots(self, gpus: Sequence[SimGpu]) -> np.ndarray:
        """Slot per GPU in the state arrays, growing them for GPUs seen for the first time."""
        slot, new = self._slot, 0
        idx = np.empty(len(gpus), dtype=np.int64)
        for i, g in enumerate(gpus):
            s = slot.get((g.node, g.gpu))
            if s is None:
                s = slot[(g.node, g.gpu)] = len(slot)
                new += 1
            idx[i] = s
        if len(set(idx.tolist())) != len(idx):
            raise ValueError("a GPU is listed twice")
        if new:
            self._temp = np.concatenate([self._temp, np.zeros(new)])
            self._last_t = np.concatenate([self._last_t, np.full(new, np.nan)])
            self._dbe = np.concatenate([self._dbe, np.zeros(new, dtype=np.int64)])
            self._mem_frac = np.concatenate([self._mem_frac, self._rng.uniform(*MEM_BUSY, new)])
            self._cooling = np.concatenate([self._cooling, self._rng.uniform(*COOLING_SPREAD, new)])
        return idx

    def _model_ids(self, gpus: Sequence[SimGpu]) -> np.ndarray:
        ids = self._model_id
        for name in dict.fromkeys(g.model for g in gpus).keys() - ids.keys():
            ids[name] = len(ids)
            self._table = np.vstack([self._table, astuple(_model(name))])
        return np.fromiter((ids[g.model] for g in gpus), dtype=np.int64, count=len(gpus))

    def sample(
        self, gpus: Sequence[SimGpu], loads: Mapping[tuple[str, int], Load], faults: Sequence[Fault], t: float
    ) -> list[GpuSample]:
        """Read every GPU at time `t` (epoch seconds; the interval since a GPU's previous sample drives its
        temperature). `faults` are the faults active now (see `Fault`). GPUs under `silent` are left out."""
        n = len(gpus)
        idx = self._slots(gpus)
        # Fixed-size draws every call, whatever the loads and faults, so one GPU's events never shift another's.
        noise = self._rng.standard_normal((2, n))
        fault_u = self._rng.random(n)
        fault_xid = self._rng.choice(RANDOM_XIDS, size=n, p=RANDOM_XID_WEIGHTS)

        model_ids = self._model_ids(gpus)  # before reading `_table`: it may add rows
        tdp, idle_w, r_th, max_op, slowdown, cap, boost, idle_clock, mem_total = self._table[model_ids].T
        r_th = r_th * self._cooling[idx]
        busy, compute, allocated = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool)
        for i, g in enumerate(gpus):
            load = loads.get((g.node, g.gpu))
            if load is not None:
                allocated[i] = True
                busy[i] = min(max(load.busy, 0.0), 1.0)
                compute[i] = min(max(load.compute, 0.0), 1.0)

        # Which faults are new, per GPU sampled now: a caller may sample its GPUs in several calls.
        where = {(g.node, g.gpu): i for i, g in enumerate(gpus)}
        ordered = [f for f in dict.fromkeys(faults) if (f.node, f.gpu) in where]  # call order: deterministic
        active: dict[tuple[str, int], set[Fault]] = {}
        for f in ordered:
            active.setdefault((f.node, f.gpu), set()).add(f)
        before = self._faults_before
        rising = [f for f in ordered if f not in before.get((f.node, f.gpu), ())]
        for key in [k for k in before if k in where]:
            del before[key]
        before.update(active)
        hot, lost, silent = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        xid, lost_now = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
        for f in ordered:
            i = where[(f.node, f.gpu)]
            if f.kind == "overtemp":
                hot[i] = True
            elif f.kind == "off_bus":
                lost[i] = True
                lost_now[i] |= f in rising
            elif f.kind == "silent":
                silent[i] = True

        # Power: idle floor plus the dynamic part the load asks for, capped at the limit (= TDP).
        demand = busy * (COMM_POWER_SHARE + (1 - COMM_POWER_SHARE) * compute) * POWER_DEMAND_HEADROOM
        power = idle_w + (tdp - idle_w) * np.minimum(demand, 1.0)
        capped = demand > 1.0

        # Temperature: first-order lag towards ambient + R_th * P over the real interval; a failed fan raises the
        # target past slowdown, and hardware slowdown keeps the die from running away towards shutdown.
        target = self.ambient_c + r_th * power
        target = np.where(hot, np.maximum(target, slowdown + FAULT_RISE_C), target)
        last_t = self._last_t[idx]
        first = np.isnan(last_t)
        prev = np.where(first, self.ambient_c + r_th * idle_w, self._temp[idx])
        dt = np.where(first, 0.0, np.maximum(t - np.nan_to_num(last_t), 0.0))
        temp = np.minimum(target + (prev - target) * np.exp(-dt / TAU_S), np.maximum(cap, self.ambient_c))
        self._temp[idx] = temp
        self._last_t[idx] = t
        temp_c = np.round(temp)  # NVML reports whole degrees

        hw = temp_c >= slowdown
        sw = (temp_c >= max_op) & ~hw
        idle = busy <= 0
        throttle = (
            np.where(idle, GPU_IDLE, 0)
            | np.where(capped & ~hw, SW_POWER_CAP, 0)
            | np.where(sw, SW_THERMAL, 0)
            | np.where(hw, HW_SLOWDOWN | HW_THERMAL, 0)
        )
        clock_factor = np.where(hw, HW_SLOWDOWN_CLOCK, np.where(sw, SW_THERMAL_CLOCK, 1.0))
        clock_factor = clock_factor * np.where(capped & ~hw, POWER_CAP_CLOCK, 1.0)
        sm_clock = np.round(np.where(idle, idle_clock, boost * clock_factor)).astype(np.int64)
        power_w = idle_w + (power - idle_w) * np.where(hw, HW_SLOWDOWN_CLOCK, 1.0)
        power_w = np.round(np.minimum(power_w * (1 + POWER_NOISE * noise[1]), tdp), 1)
        util = np.where(idle, 0.0, np.round(np.clip(busy * 100 + UTIL_NOISE * noise[0], 0.0, 100.0), 1))
        mem_used = np.where(allocated, mem_total * self._mem_frac[idx], IDLE_MEM_MIB).astype(np.int64)

        # Random faults: Poisson arrivals per GPU over the interval; injected ones win.
        if self.fault_rate_per_gpu_hour > 0:
            p = -np.expm1(-self.fault_rate_per_gpu_hour * dt / 3600.0)
            xid = np.where(fault_u < p, fault_xid, 0)
        for f in rising:
            i = where[(f.node, f.gpu)]
            if f.kind == "xid":
                xid[i] = f.xid
            elif f.kind == "ecc_dbe":
                self._dbe[idx[i]] += 1
        xid = np.where(lost, np.where(lost_now, 79, 0), xid)
        self._dbe[idx] += np.isin(xid, DBE_XIDS)
        dbe = self._dbe[idx]

        cols = (util, mem_used, mem_total.astype(np.int64), temp_c, power_w, tdp, sm_clock, throttle, dbe, xid, lost)
        out: list[GpuSample] = []
        for g, (u, mu, mt, tc, pw, pl, clk, thr, d, x, is_lost), s in zip(
            gpus, zip(*(c.tolist() for c in cols), strict=True), silent.tolist(), strict=True
        ):
            if s:
                continue
            if is_lost:
                out.append(GpuSample(node=g.node, gpu=g.gpu, uuid=g.uuid, t=t, xid=x, error=LOST_ERROR))
                continue
            out.append(
                GpuSample(
                    node=g.node,
                    gpu=g.gpu,
                    uuid=g.uuid,
                    t=t,
                    util=u,
                    mem_used_mib=mu,
                    mem_total_mib=mt,
                    temp_c=tc,
                    power_w=pw,
                    power_limit_w=pl,
                    sm_clock_mhz=clk,
                    throttle=thr,
                    ecc_dbe=d,
                    xid=x,
                )
            )
        return out

    def rearm(self) -> None:
        """Forget which faults were already passed, so one-shot faults fire again on the next call: the caller
        could not record that they were reported (its transaction failed)."""
        self._faults_before = {}

    def forget(self, node: str) -> None:
        """Reset a node's GPUs (repair, reboot): they start again from idle with zeroed volatile counters."""
        for key, s in self._slot.items():
            if key[0] == node:
                self._last_t[s] = np.nan
                self._dbe[s] = 0
