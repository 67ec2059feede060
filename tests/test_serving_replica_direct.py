"""Another org's sandboxed job reaches a tenant's replica directly and is refused: the replica's runtime answers only
requests carrying its secret (the gateway's; `serving/replica_guard.py`, which the fake runtime mirrors).

Found by a hostile review: a replica listened on the host's loopback with no key (sandboxes share the host's
network by default, docs/isolation.md); a job of any org on the node read /proc/net/tcp, found the listeners and was
served completions, free and unlogged, past the gateway's key check, 402, per-token charge and caps."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.control_plane import admin_token, bearer, live_server
from tests.serving_helpers import (
    FAST,
    add_hub_model,
    fake_environment,
    funded_tenants,
    minimal_model,
    stop_all,
    wait_ready,
)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
                                reason="bubblewrap is not installed")  # fmt: skip
CPU = {"gpus": 0, "cpus": 0.25, "memory": "256Mi"}

SCAN = r"""
import json, urllib.error, urllib.request
ports = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        lines = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        f = line.split()
        if f[3] == "0A":
            ports.add(int(f[1].rsplit(":", 1)[1], 16))
print("listening ports seen:", len(ports), flush=True)
body = json.dumps({"model": "private-chat", "messages": [{"role": "user", "content": "secret?"}],
                   "max_tokens": 4}).encode()
for port in sorted(ports):
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        out = urllib.request.urlopen(req, timeout=1).read().decode()
    except urllib.error.HTTPError as e:
        print("DENIED", port, e.code, flush=True)
        continue
    except Exception:
        continue
    if "\"choices\"" in out:
        print("STOLEN", port, out[:300], flush=True)
print("scan done", flush=True)
"""


def _logs(http: httpx.Client, headers: dict, ref: str) -> str:
    out, offset = [], 0
    while True:
        chunk = http.get(f"/api/v1/workloads/{ref}/logs", params={"offset": offset}, headers=headers).json()
        out.append(chunk["data"])
        offset = chunk["next_offset"]
        if chunk["done"]:
            return "".join(out)
        time.sleep(0.1)


def test_another_orgs_job_is_refused_by_a_replica_it_finds_on_the_node(tmp_path: Path) -> None:
    env_dir = fake_environment(tmp_path / "fakert")
    db_url = f"sqlite+pysqlite:///{tmp_path / 'suanli.db'}"
    with live_server(tmp_path / "home", db_url, env={**FAST, "SUANLI_ENVIRONMENTS": f"fakert={env_dir}"}) as srv:
        http = httpx.Client(base_url=srv.url, timeout=30)
        adm = bearer(admin_token(http))
        assert http.post("/api/v1/admin/clusters", json={"local": True, "name": "this-host"},
                         headers=adm).status_code == 201  # fmt: skip
        add_hub_model(db_url, srv.home, "tiny", "acme/tiny", minimal_model(tmp_path / "model"))
        tenant, mallory = funded_tenants(http, adm, "tenant@example.com", "mallory@example.com")
        try:
            # the tenant's private endpoint (no price: no other org may even get a key for it)
            r = http.post("/api/v1/endpoints", headers=tenant.headers, json={"spec": {
                "name": "private-chat", "kind": "service", "model": "tiny", "runtime": "vllm", "image": "fakert",
                "resources": CPU, "replicas": 1}})  # fmt: skip
            assert r.status_code == 201, r.text
            port = wait_ready(http, tenant, "private-chat", 1)["replicas"][0]["port"]
            # mallory: an ordinary sandboxed job of another org, default spec (the host network)
            r = http.post("/api/v1/workloads", headers=mallory.headers, json={"spec": {
                "name": "scan", "kind": "job", "image": "fakert", "command": f"python3 -c '{SCAN}'",
                "resources": CPU}})  # fmt: skip
            assert r.status_code == 201, r.text
            wid = r.json()["id"]
            deadline = time.monotonic() + 90
            while http.get(f"/api/v1/workloads/{wid}", headers=mallory.headers).json()["state"] not in (
                "succeeded",
                "failed",
                "stopped",
            ):
                assert time.monotonic() < deadline
                time.sleep(0.3)
            out = _logs(http, mallory.headers, wid)
            assert "scan done" in out, out
            # (other listeners on the host, such as other tests' stub servers, answer as they will: the replica's
            # port is what counts)
            stolen = [line for line in out.splitlines() if line.startswith(f"STOLEN {port} ")]
            assert not stolen, f"mallory's job reached the tenant's replica on port {port} with no key: {stolen}"
            assert f"DENIED {port} 401" in out, out  # it found the replica and was refused
        finally:
            stop_all(http, [tenant, mallory])
