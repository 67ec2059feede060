"""A long-lived child process of the server, started again when it exits on its own (the background loops, the
SSH gateway): a crash in one never takes the API down, and a dead one does not stay dead."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("suanli.children")


class WatchedProcess:
    """`target(settings_json, server_pid)` in a spawned child; restarted RESTART_AFTER_S after it exits, unless its
    exit code is in `final` (it cannot work here: saying so again every 2 s helps nobody)."""

    RESTART_AFTER_S = 2.0

    def __init__(
        self, target: Callable[[str, int], None], settings_json: str, name: str, *, stop_timeout_s: float = 40.0,
        final: frozenset[int] = frozenset(),
    ) -> None:  # fmt: skip
        self.target, self.settings_json, self.name = target, settings_json, name
        self.stop_timeout_s, self.final = stop_timeout_s, final
        self.process = self._new()
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name=f"{name}-watch", daemon=True)

    def _new(self) -> Any:
        import multiprocessing as mp

        return mp.get_context("spawn").Process(
            target=self.target, args=(self.settings_json, os.getpid()), name=self.name, daemon=True
        )

    def start(self) -> None:
        self.process.start()
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stopping.wait(self.RESTART_AFTER_S):
            if self.process.is_alive() or self._stopping.is_set():
                continue
            if self.process.exitcode in self.final:
                return
            log.warning("%s exited (code %s); starting it again", self.name, self.process.exitcode)
            self.process = self._new()
            self.process.start()

    def stop(self) -> None:
        """SIGTERM (a loop finishes its pass and releases its lease), SIGKILL after the timeout."""
        self._stopping.set()
        if self._watcher.is_alive():
            self._watcher.join()
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=self.stop_timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
