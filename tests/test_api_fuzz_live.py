"""The schema-driven fuzzer of `tests/test_api_fuzz.py` against a real `suanli server` process over HTTP (two
worker processes, background loops running), as a tenant and as the operator: what the in-process run cannot
see — uvicorn's parsing, the body-size limit, the workers and the loop process sharing one database — must not
turn a request into a 5xx either, nor leave a traceback in the server's log.

Slow (every request crosses a socket and real password hashing runs), so it runs once, on SQLite."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx

from tests.control_plane import live_server
from tests.test_api_fuzz import API, Role, fuzz_api

# per operation, role and generation mode: ~2,000 requests, about a minute on 2 cores; more to explore further
EXAMPLES = int(os.environ.get("SUANLI_FUZZ_EXAMPLES", "8"))
FAST = {"SUANLI_SCHEDULE_INTERVAL_S": "0.2", "SUANLI_METER_INTERVAL_S": "0.5", "SUANLI_METER_WINDOW_S": "1"}


def test_a_live_server_answers_no_fuzzed_request_with_a_server_error(tmp_path: Path) -> None:
    db_url = f"sqlite+pysqlite:///{tmp_path}/suanli.db"
    with (
        live_server(tmp_path / "home", db_url, env=FAST, args=("--workers", "2")) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as api,
    ):
        openapi = api.get("/openapi.json").json()
        roles = fuzz_api(api, openapi, EXAMPLES)
        _stop_everything(api, roles)
    log = srv.log.read_text(errors="replace")
    assert "Traceback" not in log, log[log.index("Traceback") - 200 :][:3000]


def _stop_everything(api: httpx.Client, roles: list[Role]) -> None:
    """Stop what the fuzzed requests started (instances run until stopped), so no sandbox outlives the server."""
    deadline = time.monotonic() + 60
    while active := [(r, w["id"]) for r in roles for w in api.get(f"{API}/workloads", headers=r.headers).json()
                     if w["state"] not in ("succeeded", "failed", "stopped", "preempted")]:  # fmt: skip
        assert time.monotonic() < deadline, f"still running: {active}"
        for r, wid in active:
            api.post(f"{API}/workloads/{wid}/stop", headers=r.headers)
        time.sleep(0.5)
