"""Route helpers: where a route body runs."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from suanli.api.deps import Caller, in_thread, short_read


def _run(route: Any, caller: Caller) -> tuple[int, int]:
    """(the event loop's thread, the thread the body ran in)."""
    ran: list[int] = []

    async def main() -> int:
        await route(ctx=caller, ran=ran)
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    return loop_thread, ran[0]


def _body(ctx: Caller, ran: list[int]) -> None:
    ran.append(threading.get_ident())


def test_a_short_read_runs_on_the_loop_only_when_the_database_is_embedded(db: Any) -> None:
    caller = Caller(who=None, srv=SimpleNamespace(db=db), now=datetime.now(UTC))  # type: ignore[arg-type]
    loop_thread, body_thread = _run(short_read(_body), caller)
    assert db.embedded == (db.dialect == "sqlite")
    assert (body_thread == loop_thread) == db.embedded
    loop_thread, body_thread = _run(in_thread(_body), caller)
    assert body_thread != loop_thread


def test_a_short_read_must_name_its_caller() -> None:
    with pytest.raises(TypeError, match="ctx"):
        short_read(lambda org_id: None)
