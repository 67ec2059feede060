"""Small helpers every part of the SDK uses to build a request (underscored: shared inside `suanli.client`, not its API): a path segment, an exact amount, query parameters,
and the marker of a setting left as it is."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import quote


def _seg(value: str) -> str:
    """One path segment (an org name may be an email address, a node name has dots)."""
    return quote(str(value), safe="@")


def _amount(value: Decimal | int | str) -> str:
    if isinstance(value, float):
        raise TypeError("amounts are Decimal, int or str, not float: floats cannot represent cents exactly")
    return str(Decimal(str(value)))


class Unchanged:
    """The default of an optional setting left as it is (None has a meaning of its own: no limit)."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()


def _params(**kw: Any) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in kw.items() if v is not None}
