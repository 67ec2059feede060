"""Health rules over GPU samples: which readings mean a GPU (or a node) must stop taking work, and why.

Pure and deterministic: no I/O, no clock (the caller passes `now`). `HealthJudge` keeps only the little memory the
rules need between calls (consecutive hot samples and the last double-bit ECC count per GPU), so judging 10,000
samples is one pass over them.

`Finding.fatal` is what a caller acts on: the GPU (or, for a heartbeat, the node) is unhealthy and should take no
work. A non-fatal finding is advice for people and dashboards: today only a GPU running at its slowdown temperature
for fewer than `overtemp_samples` samples in a row, so one spike is visible without draining a node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from suanli import catalog
from suanli.telemetry.samples import GpuSample

# XIDs NVIDIA's Xid catalog (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, and the older
# "XID Errors" guide) resolves with a GPU reset or node reboot, or service; a drained node is the safe answer.
# Kept to codes whose meaning is stable across driver generations. Application XIDs (13 graphics exception,
# 31 MMU fault, 43 stopped processing, 45 preemptive cleanup) leave the GPU healthy and are deliberately absent.
NVIDIA_RESET_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement / row remapping recorded, reset to activate",
    64: "ECC page retirement / row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
_APP_XIDS = {13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing", 45: "cleanup"}
_XID_NAMES: dict[int, str] = {**_APP_XIDS, **NVIDIA_RESET_XIDS}


class HealthRules(BaseModel):
    """Thresholds of the health rules; the defaults follow NVIDIA's guidance where there is some."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    overtemp_margin_c: float = Field(0.0, ge=0, description="fire when temp >= slowdown_C - margin")
    overtemp_samples: int = Field(2, ge=1, description="consecutive hot samples needed: one spike drains nothing")
    fatal_xids: tuple[int, ...] = tuple(NVIDIA_RESET_XIDS)
    ecc_dbe: bool = True  # any increase of the volatile double-bit ECC counter is fatal
    nvml_errors: bool = True  # a sample carrying `error` (GPU lost, unreadable) marks the GPU unhealthy
    heartbeat_timeout_s: float = Field(60.0, gt=0, description="a node whose last sample is older is unhealthy")
    default_slowdown_c: float = Field(90.0, gt=0, description="for models without thermal limits in the catalog")


@dataclass(frozen=True, slots=True)
class Finding:
    """One rule firing for one GPU (or a whole node when `gpu` is None)."""

    node: str
    gpu: int | None
    rule: str  # "overtemp" | "xid" | "ecc_dbe" | "nvml_error" | "heartbeat"
    reason: str  # for humans: "GPU 3 at 93 °C ≥ H100-SXM slowdown 89 °C for 2 samples"
    fatal: bool  # act on it (see the module docstring); False: a warning only


def slowdown_c(model: str | None, rules: HealthRules) -> float:
    """The temperature at which `model` starts hardware slowdown, from the catalog; the rules' default when the
    model is unknown or the catalog has no thermal limits for it (health must never fail on a name)."""
    if not model:
        return rules.default_slowdown_c
    try:
        thermal = catalog.gpu(model).thermal
    except catalog.CatalogError:
        return rules.default_slowdown_c
    return thermal.slowdown_C if thermal is not None else rules.default_slowdown_c


def xid_name(xid: int) -> str:
    """A short description of a well-known XID, "" otherwise."""
    return _XID_NAMES.get(xid, "")


class HealthJudge:
    """Applies `HealthRules` to batches of samples. Overtemperature is level-triggered: reported on every hot
    sample, as a warning until `overtemp_samples` in a row were hot and fatal from then on. XIDs and ECC errors are
    reported on the sample that carries them or the sample where the counter rose."""

    def __init__(self, rules: HealthRules | None = None) -> None:
        self.rules = rules or HealthRules()
        self._fatal_xids = frozenset(self.rules.fatal_xids)
        self._hot: dict[tuple[str, int], int] = {}  # consecutive samples at or above the threshold
        self._dbe: dict[tuple[str, int], int] = {}  # last double-bit count seen
        self._slowdown: dict[str, float] = {}  # per model, so 10,000 samples cost one catalog lookup per model

    def _threshold(self, model: str) -> float:
        value = self._slowdown.get(model)
        if value is None:
            value = self._slowdown[model] = slowdown_c(model, self.rules)
        return value - self.rules.overtemp_margin_c

    def judge(self, samples: Sequence[GpuSample], models: Mapping[tuple[str, int], str]) -> list[Finding]:
        """Findings for these samples, in sample order. `models` gives each GPU's catalog model for its thermal
        threshold; a GPU missing from it uses `default_slowdown_c`. Samples must arrive in time order per GPU."""
        rules = self.rules
        out: list[Finding] = []
        for s in samples:
            key = (s.node, s.gpu)
            if s.error:
                if rules.nvml_errors:
                    out.append(Finding(s.node, s.gpu, "nvml_error", f"GPU {s.gpu} unreadable: {s.error}", True))
            else:
                out.extend(self._readings(s, key, models.get(key, "")))
            if s.xid and s.xid in self._fatal_xids:
                name = xid_name(s.xid)
                what = f"XID {s.xid} ({name})" if name else f"XID {s.xid}"
                out.append(Finding(s.node, s.gpu, "xid", f"GPU {s.gpu} reported {what}", True))
        return out

    def _readings(self, s: GpuSample, key: tuple[str, int], model: str) -> list[Finding]:
        rules = self.rules
        out: list[Finding] = []
        limit = self._threshold(model)
        hot = self._hot.get(key, 0) + 1 if s.temp_c >= limit else 0
        self._hot[key] = hot
        if hot:
            slowdown = f"{model + ' ' if model else ''}slowdown {limit + rules.overtemp_margin_c:g} °C"
            if rules.overtemp_margin_c:
                slowdown = f"{limit:g} °C ({slowdown} − {rules.overtemp_margin_c:g})"
            of = "" if hot >= rules.overtemp_samples else f" of {rules.overtemp_samples}"
            reason = f"GPU {s.gpu} at {s.temp_c:g} °C ≥ {slowdown} for {hot}{of} samples"
            out.append(Finding(s.node, s.gpu, "overtemp", reason, hot >= rules.overtemp_samples))
        # A volatile counter only falls when the driver reloads or the GPU resets: a new baseline, not an event.
        # The first sample of a GPU compares against 0: a non-zero volatile count means a DBE since the last reset.
        before = self._dbe.get(key, 0)
        self._dbe[key] = s.ecc_dbe
        if rules.ecc_dbe and s.ecc_dbe > before:
            reason = f"GPU {s.gpu} double-bit ECC errors rose {before} → {s.ecc_dbe}"
            out.append(Finding(s.node, s.gpu, "ecc_dbe", reason, True))
        return out

    def heartbeats(self, last_seen: Mapping[str, float], now: float) -> list[Finding]:
        """A finding per node whose last sample (epoch seconds) is more than `heartbeat_timeout_s` before `now`."""
        timeout = self.rules.heartbeat_timeout_s
        return [
            Finding(node, None, "heartbeat", f"node {node} last reported {now - t:.0f} s ago (> {timeout:g} s)", True)
            for node, t in last_seen.items()
            if now - t > timeout
        ]

    def memory(self) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        """What the judge remembers between calls, to `restore` when acting on its findings failed."""
        return dict(self._hot), dict(self._dbe)

    def restore(self, memory: tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]) -> None:
        self._hot, self._dbe = dict(memory[0]), dict(memory[1])

    def forget(self, node: str) -> None:
        """Drop the memory kept for a node's GPUs (node removed, or its GPUs reset: counters start again)."""
        for table in (self._hot, self._dbe):
            for key in [k for k in table if k[0] == node]:
                del table[key]
