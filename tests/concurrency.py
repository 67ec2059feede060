"""Calls made at the same moment from threads, for race tests: each waits at one barrier, then runs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def at_once(*calls: Callable[[], T], timeout_s: float = 120) -> tuple[list[T], list[BaseException]]:
    """Run every call in its own thread, all released together. What they returned (in the order they ended) and
    what they raised: a race test asserts on both."""
    start = threading.Barrier(len(calls))
    results: list[T] = []
    errors: list[BaseException] = []

    def run(call: Callable[[], T]) -> None:
        start.wait()
        try:
            results.append(call())
        except BaseException as e:  # the finding, reported to the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    return results, errors
