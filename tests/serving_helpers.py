"""Helpers for the serving tests: a published environment holding the fake runtime as `vllm` and `transformers`,
a hub model, a tenant with money, waiting for an endpoint's replicas, and finding a replica's runtime process."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import httpx

from suanli.control.ids import utcnow
from suanli.control.storage import hub
from suanli.db.engine import Database
from tests.control_plane import Tenant, signup

FAKE = Path(__file__).parent / "fixtures" / "fake_openai_runtime.py"
FAST = {"SUANLI_SCHEDULE_INTERVAL_S": "0.2", "SUANLI_METER_INTERVAL_S": "0.5", "SUANLI_STOP_GRACE_S": "2"}


def fake_environment(root: Path) -> Path:
    """A prefix whose bin has the fake runtime as both runtimes' names, readable by any sandbox uid."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("vllm", "transformers"):
        shutil.copy(FAKE, bin_dir / name)
        os.chmod(bin_dir / name, 0o755)
        (bin_dir / f"{name}.checks-replica-key").write_text("")  # it checks REPLICA_KEY itself (no console script)
    (bin_dir / "python3").symlink_to("/usr/bin/python3")  # the replica guard runs in the Python beside the runtime
    for d in (root, bin_dir):
        os.chmod(d, 0o755)
    p = root
    while p != p.parent:  # the sandbox binds it at its own path: every parent must be traversable
        p = p.parent
        if p.stat().st_mode & 0o111 != 0o111 and str(p).startswith("/tmp/"):
            os.chmod(p, p.stat().st_mode | 0o111)
    return root


def add_hub_model(db_url: str, home: Path, name: str, repo_id: str, source: Path) -> None:
    db = Database(db_url)
    try:
        hub.add(db, hub.store_of(None, home), "model", name, str(source), utcnow(), repo_id=repo_id)
    finally:
        db.dispose()


def minimal_model(out: Path) -> Path:
    out.mkdir(parents=True)
    (out / "config.json").write_text('{"model_type": "fake"}')
    return out


def describe(http: httpx.Client, who: Tenant, ref: str) -> dict:
    r = http.get(f"/api/v1/endpoints/{ref}", headers=who.headers)
    assert r.status_code == 200, r.text
    return r.json()


def wait_ready(http: httpx.Client, who: Tenant, ref: str, count: int, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        ep = describe(http, who, ref)
        if sum(r["ready"] for r in ep["replicas"]) >= count:
            return ep
        assert time.monotonic() < deadline, ep
        time.sleep(0.2)


def runtime_pid(port: int) -> int | None:
    """The process of the runtime serving on `port` (its command line has `--port PORT`)."""
    want = b"--port\x00" + str(port).encode() + b"\x00"
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if want in cmd + b"\x00" and b"serve\x00" in cmd:
            return int(d.name)
    return None


def stop_all(http: httpx.Client, tenants: list[Tenant], timeout: float = 60) -> None:
    """Remove every endpoint and wait until its replicas have stopped: a replica's processes outlive the server
    process (a restarted server re-attaches to them), so a test must stop them before its server goes."""
    for who in tenants:
        for e in http.get("/api/v1/endpoints", headers=who.headers).json():
            http.delete(f"/api/v1/endpoints/{e['id']}", headers=who.headers)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        active = [w for who in tenants for w in http.get("/api/v1/workloads", headers=who.headers).json()
                  if w["state"] in ("pending", "scheduled", "starting", "running")]  # fmt: skip
        if not active:
            return
        time.sleep(0.3)


def platform_with_model(api: Any, tmp_path: Path) -> Any:
    """`test_workloads_api.make_platform` with the hub model `tiny` (a llama config) that endpoints deploy."""
    from tests.test_workloads_api import make_platform

    p = make_platform(api)
    src = tmp_path / "tiny"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "llama"}')
    hub.add(p.db, hub.store_of(None, api.app.state.server.settings.home), "model", "tiny", str(src), utcnow(),
            repo_id="acme/tiny")  # fmt: skip
    return p


def funded_tenants(http: httpx.Client, operator: dict[str, str], *emails: str, amount: str = "100") -> list[Tenant]:
    """Tenants signed up on a live server, each topped up by the operator."""
    out = []
    for email in emails:
        who = signup(http, email)
        r = http.post(f"/api/v1/admin/orgs/{who.org_id}/transactions", json={"kind": "topup", "amount": amount},
                      headers=operator)  # fmt: skip
        assert r.status_code == 201, r.text
        out.append(who)
    return out
