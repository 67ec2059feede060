"""Durations as people write them ("90s", "1h30m", "1.5h", "2d") and back, stored as float seconds."""

from __future__ import annotations

import math
import re

MAX_DURATION_S = 90 * 86400.0  # longer than any lease we sell in one go; a typo like "6000h" fails loudly
UNITS: dict[str, int] = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)")
_PART = re.compile(rf"({_NUMBER.pattern})([dhms])")
_HINT = "a number of seconds or text like '90s', '30m', '6h', '1h30m', '1.5h', '2d'"


def brief(value: object, limit: int = 60) -> str:
    """repr() of user input for an error message, cut short: messages must not echo a 256 KiB value back."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit else "a huge number"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_duration(value: object) -> float:
    """Seconds from a number of seconds or a string of number+unit parts (d, h, m, s), largest unit first.

    Raises ValueError naming the accepted forms; the result is > 0 and at most 90 days.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"must be {_HINT}")
    if isinstance(value, str):
        seconds = _parse_text(value)
    else:
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    if math.isnan(seconds) or seconds <= 0:
        raise ValueError("must be more than 0 seconds")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"must be at most 90d (got {brief(value)})")
    return seconds


def _parse_text(value: str) -> float:
    text = "".join(value.split()).lower()
    if _NUMBER.fullmatch(text):
        return float(text)
    total, pos, seen = 0.0, 0, ""
    for m in _PART.finditer(text):
        unit = m.group(2)
        if m.start() != pos or unit in seen or (seen and "dhms".index(unit) < "dhms".index(seen[-1])):
            break
        total += float(m.group(1)) * UNITS[unit]
        pos, seen = m.end(), seen + unit
    if not seen or pos != len(text):
        raise ValueError(f"must be {_HINT} (units largest first, each once); got {brief(value)}")
    return total


def format_duration(seconds: float) -> str:
    """The shortest parse_duration text for `seconds`, to the millisecond: 21600 → "6h", 5400 → "1h30m"."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"not a duration: {seconds!r}")
    ms_total = round(seconds * 1000)
    whole, ms = divmod(ms_total, 1000)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{u}" for n, u in ((days, "d"), (hours, "h"), (minutes, "m")) if n]
    if secs or ms or not parts:
        parts.append(f"{secs}.{ms:03d}".rstrip("0").rstrip(".") + "s")
    return "".join(parts)
