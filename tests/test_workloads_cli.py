"""The README's path, as real processes: `suanli up` (server, loops, this host as a node, the CLI logged in),
then `suanli run examples/hello.yaml --follow`, `ps`, `describe`, `logs`; and `suanli up --virtual` placing a
64-GPU job inside one leaf. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.control_plane import free_port, wait_healthy

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@contextmanager
def up(home: Path, db_url: str, *args: str) -> Iterator[dict[str, str]]:
    """`suanli up` on a free port; yields the environment a CLI call needs (SUANLI_HOME, SUANLI_SERVER)."""
    port = free_port()
    env = {**os.environ, "SUANLI_HOME": str(home), "SUANLI_SERVER": f"http://127.0.0.1:{port}",
           "SUANLI_SCHEDULE_INTERVAL_S": "0.2", "SUANLI_METER_INTERVAL_S": "0.5", "COLUMNS": "200"}  # fmt: skip
    env.pop("SUANLI_TOKEN", None)
    home.mkdir(parents=True, exist_ok=True)
    log = home / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "suanli.cli.main", "up", "--port", str(port), "--db", db_url,
                                 *args], env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_healthy(env["SUANLI_SERVER"], proc, log)
        yield env
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cli(env: dict[str, str], *args: str, code: int = 0, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "suanli.cli.main", *args], env=env, capture_output=True, text=True,
                       timeout=timeout)  # fmt: skip
    assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
    return r


def test_up_then_run_hello_follows_it_to_completion_with_logs_and_cost(tmp_path: Path, db_url: str) -> None:
    with up(tmp_path / "home", db_url) as env:
        r = cli(env, "run", str(EXAMPLES / "hello.yaml"), "--follow")
        assert "你好 from suanli" in r.stdout
        assert "step 3/3" in r.stdout and "done" in r.stdout
        assert "succeeded" in r.stdout + r.stderr and "cost" in r.stdout + r.stderr
        described: dict[str, Any] = json.loads(cli(env, "describe", "hello", "--json").stdout)
        assert described["state"] == "succeeded"
        assert [e["state"] for e in described["events"]][-1] == "succeeded"
        assert list(described["allocation"]["nodes"]) and described["cost"] is not None
        listed = json.loads(cli(env, "ps", "--all", "--json").stdout)
        assert [w["name"] for w in listed] == ["hello"]
        assert "step 2/3" in cli(env, "logs", "hello").stdout


def test_up_virtual_places_a_64_gpu_job_inside_one_leaf(tmp_path: Path, db_url: str) -> None:
    with up(tmp_path / "home", db_url, "--virtual", "h20-roce800-128") as env:
        cli(env, "admin", "topup", "operator@suanli.local", "1000")
        r = cli(env, "run", str(EXAMPLES / "leaf64.yaml"), "--json")
        wid = json.loads(r.stdout)["id"]
        deadline = time.monotonic() + 30
        while True:
            w = json.loads(cli(env, "describe", wid, "--json").stdout)
            if w["state"] == "running" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert w["state"] == "running", w
        nodes = w["allocation"]["nodes"]
        assert sum(len(g) for g in nodes.values()) == 64
        token = json.loads((Path(env["SUANLI_HOME"]) / "credentials.json").read_text())[env["SUANLI_SERVER"]]["token"]
        rows = httpx.get(f"{env['SUANLI_SERVER']}/api/v1/admin/nodes", params={"limit": 1000},
                         headers={"Authorization": f"Bearer {token}"}).json()  # fmt: skip
        leaf = {n["name"]: n["leaf"] for n in rows}
        assert len({leaf[n] for n in nodes}) == 1
        stopped = cli(env, "stop", wid)
        assert "stop" in stopped.stdout.lower()
