"""The node agent's loop: read this node's GPUs through NVML every interval and hand the batch on.

What to do with a batch (post it to the server's ingest route) is the caller's: the CLI's `suanli agent` passes
the SDK's `post_samples`, so this adapter knows nothing of HTTP. A batch that cannot be delivered (the server
restarting) is kept and sent with the next one, up to `MAX_PENDING` samples, so a short outage loses nothing and
a long one cannot fill the agent's memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from suanli.telemetry.samples import GpuSample

log = logging.getLogger("suanli.telemetry")
MAX_PENDING = 20_000  # the ingest route's batch limit


class Sampler:
    """What the loop reads: `NvmlSampler` or a stand-in with the same two members."""

    disabled_reason: str | None

    def sample(self, t: float) -> list[GpuSample]: ...


@dataclass
class AgentLoop:
    sampler: Sampler
    deliver: Callable[[list[GpuSample]], object]
    interval_s: float = 5.0
    clock: Callable[[], float] = time.time
    pending: list[GpuSample] = field(default_factory=list)
    sent: int = 0
    failures: int = 0

    def tick(self) -> bool:
        """One reading and delivery; whether everything read so far was delivered."""
        self.pending = (self.pending + self.sampler.sample(self.clock()))[-MAX_PENDING:]
        if not self.pending:
            return True
        try:
            self.deliver(self.pending)
        except Exception as e:  # the server is unreachable or refused: keep the batch for the next tick
            self.failures += 1
            log.warning("agent: could not deliver %d samples (kept for the next try): %s", len(self.pending), e)
            return False
        self.sent += len(self.pending)
        self.pending = []
        return True

    def run(self, stop: threading.Event, ticks: int | None = None) -> None:
        n = 0
        while not stop.is_set() and (ticks is None or n < ticks):
            self.tick()
            n += 1
            if ticks is None or n < ticks:
                stop.wait(self.interval_s)
