"""Small helpers every part of the SDK uses to build a request (underscored: shared inside `suanli.client`, not its API): a path segment, an exact amount, query parameters,
and the marker of a setting left as it is."""

from __future__ import annotations

import os
from datetime import datetime
from decimal import Decimal
from pathlib import Path
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


def _spec_body(spec: str | dict[str, Any] | Path, org_id: str | None) -> dict[str, Any]:
    """A spec as the API takes it: YAML text (`spec_yaml`, also read from a Path) or a dict (`spec`)."""
    if isinstance(spec, os.PathLike):
        body: dict[str, Any] = {"spec_yaml": Path(spec).read_text(encoding="utf-8")}
    elif isinstance(spec, str):
        body = {"spec_yaml": spec}
    elif isinstance(spec, dict):
        body = {"spec": spec}
    else:
        raise TypeError(f"spec must be YAML text, a dict or a Path, not {type(spec).__name__}")
    if org_id:
        body["org"] = org_id
    return body
