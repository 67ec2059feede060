"""Form values on their way into the API's JSON."""

from __future__ import annotations

import re

INT_RE = re.compile(r"-?[0-9]{1,64}")  # the API says what bound a longer one is past (int() refuses 4,300+)


def as_int(value: str | None) -> int | str | None:
    """A form's whole number as JSON's number (the API parses strictly); anything else goes as typed, so the API
    names the field in its message. ASCII digits only: "²" and "①" pass `str.isdigit`, and `int()` raises on them."""
    text = (value or "").strip()
    return int(text) if INT_RE.fullmatch(text) else value
