"""The scheduler's clock: `sched/` counts time in seconds since the Unix epoch; rows hold UTC datetimes."""

from __future__ import annotations

from datetime import UTC, datetime

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def seconds(t: datetime) -> float:
    return (t - EPOCH).total_seconds()
