"""How the workload commands show a workload: durations, prices, GPU labels, its age, why it waits, where it runs.

Shared by `suanli ps`, `describe`, `run --follow` and the admin views; plain text, no I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len

from suanli.cli.credentials import money

if TYPE_CHECKING:
    from suanli.client import Workload

SYMBOLS = {"CNY": "¥", "USD": "$", "EUR": "€"}


def span(seconds: float) -> str:
    """A compact duration: 45s, 3m12s, 2h05m, 3d04h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def elapsed(start: datetime | None, end: datetime | None) -> float | None:
    """Seconds from `start` to `end` (to now while it has not ended); None before it started."""
    if start is None:
        return None
    return (_utc(end or datetime.now(UTC)) - _utc(start)).total_seconds()


def price(amount: Decimal | None, currency: str) -> str:
    """¥1,234.50 for the currencies with a sign, else `1,234.50 XYZ`."""
    if amount is None:
        return "-"
    sign = SYMBOLS.get(currency)
    return f"{sign}{money(amount)}" if sign else f"{money(amount)} {currency}".strip()


def gpus_label(w: Workload) -> str:
    """16×H20; 0.5×A100 for a slice; 4×any before a GPU model is chosen; '-' for CPU-only work."""
    a = w.allocation
    if a is not None and a.gpus:
        count = f"{a.gpus * a.milli / 1000:g}" if a.milli != 1000 else str(a.gpus)
        return f"{count}×{a.gpu_model or w.gpu or '?'}"
    return f"{w.gpus}×{w.gpu or 'any'}" if w.gpus else "-"


def age(w: Workload) -> str:
    """How long it has run (or ran); for work that has not started, how long it has waited."""
    ran = elapsed(w.started_at, w.finished_at)
    if ran is not None:
        return span(ran)
    waited = elapsed(w.created_at, w.finished_at)
    return "-" if waited is None or w.finished else span(waited)


def why(w: Workload) -> str:
    """The scheduler's reason and queue place while pending, else the last transition's reason."""
    if w.pending is not None and w.state == "pending":
        place = f" (queue position {w.pending.position})" if w.pending.position else ""
        return f"{w.pending.reason}{place}"
    return w.reason


def where(nodes: dict[str, Any]) -> str:
    """Node names, or for many nodes their count and the first two."""
    names = list(nodes)
    return ", ".join(names) if len(names) <= 3 else f"{len(names)} nodes ({names[0]}, {names[1]}, …)"


def cut(text: str, width: int) -> str:
    """One line of at most `width` cells (CJK characters take two)."""
    text = " ".join(text.split())
    if cell_len(text) <= width:
        return text
    while cell_len(text) > width - 1:
        text = text[:-1]
    return text + "…"
