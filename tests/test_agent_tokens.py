"""A node agent runs with a token for its own node, not an operator's (defence in depth: whoever escapes a sandbox on
a GPU node reads what that node holds, and an operator's token there opened the whole platform).

An agent token posts samples for its node and nothing else: another node's samples are 403 naming the sample, and
every other route refuses it. In-process on both databases, and the real agent loop over HTTP with one."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from suanli.client import Client
from suanli.db.telemetry import AgentToken
from suanli.telemetry.agent import AgentLoop
from suanli.telemetry.nvml_sampler import NvmlSampler
from tests.control_plane import admin_token, bearer, live_server, signup
from tests.test_api_isolation import api_routes
from tests.test_nvml_sampler import FakeNvml, gpu

API = "/api/v1"


@pytest.fixture
def fleet(api: Any) -> tuple[Any, dict[str, str], list[str]]:
    adm = bearer(admin_token(api))
    r = api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20", "name": "rack"}, headers=adm)
    assert r.status_code == 201, r.text
    nodes = sorted(n["name"] for n in api.get(f"{API}/admin/nodes", headers=adm).json())
    return api, adm, nodes


def _sample(node: str, t: float, gpu_index: int = 0, **extra: Any) -> dict[str, Any]:
    return {"node": node, "gpu": gpu_index, "t": t, "util": 50.0, **extra}


def _util(api: Any, adm: dict[str, str], node: str) -> list[Any]:
    return [g["util"] for g in api.get(f"{API}/admin/gpus", headers=adm).json() if g["node"] == node]


def test_an_agent_token_posts_its_own_nodes_samples_only(fleet: Any) -> None:
    api, adm, (mine, theirs) = fleet
    r = api.post(f"{API}/admin/nodes/{mine}/agent-tokens", json={}, headers=adm)
    assert r.status_code == 201, r.text
    token = r.json()["token"]
    assert token.startswith("sla_") and r.json()["node"] == mine
    agent = bearer(token)
    t = time.time()
    r = api.post(f"{API}/telemetry/samples", json={"samples": [_sample(mine, t, i) for i in range(8)]}, headers=agent)
    assert r.status_code == 200 and r.json()["stored"] == 8, r.text
    assert all(u == 50.0 for u in _util(api, adm, mine))
    bad = [_sample(mine, t + 1), _sample(theirs, t + 1, xid=79)]  # a fatal XID would drain their node
    r = api.post(f"{API}/telemetry/samples", json={"samples": bad}, headers=agent)
    assert r.status_code == 403 and "samples.1.node" in r.json()["detail"], r.text
    assert all(u is None for u in _util(api, adm, theirs))  # nothing of the batch was stored
    states = {n["name"]: n["state"] for n in api.get(f"{API}/admin/nodes", headers=adm).json()}
    assert states[theirs] == "ready"


def test_an_agent_token_opens_no_other_route(fleet: Any) -> None:
    api, adm, (node, _) = fleet
    agent = bearer(api.post(f"{API}/admin/nodes/{node}/agent-tokens", json={}, headers=adm).json()["token"])
    routes = [(m, re.sub(r"\{[^}]+\}", "x", p)) for m, p, _ in api_routes(api.app) if p.startswith(API)]
    assert len(routes) > 100
    public = 0
    for method, path in routes:
        if path == f"{API}/telemetry/samples":
            continue
        r = api.request(method, path, headers=agent, json={})
        if r.status_code < 400:  # a public route (sign-up pages, offers) answers anyone alike
            assert api.request(method, path, json={}).status_code == r.status_code, (method, path)
            public += 1
    assert public < 10
    assert api.get(f"{API}/me", headers=agent).status_code == 401
    assert api.get(f"{API}/admin/gpus", headers=agent).status_code == 401


def test_a_revoked_agent_token_posts_nothing(fleet: Any) -> None:
    api, adm, (node, _) = fleet
    made = api.post(f"{API}/admin/nodes/{node}/agent-tokens", json={}, headers=adm).json()
    listed = api.get(f"{API}/admin/agent-tokens", headers=adm).json()
    assert [(t["id"], t["node"], t["revoked_at"]) for t in listed] == [(made["id"], node, None)]
    assert all("token" not in t for t in listed)
    r = api.delete(f"{API}/admin/agent-tokens/{made['id']}", headers=adm)
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    r = api.post(f"{API}/telemetry/samples", json={"samples": [_sample(node, 1e9)]}, headers=bearer(made["token"]))
    assert r.status_code == 401, r.text
    r = api.post(f"{API}/telemetry/samples", json={"samples": []}, headers=bearer("sla_" + "x" * 43))
    assert r.status_code == 401


def test_only_operators_make_agent_tokens_and_only_their_hashes_are_kept(fleet: Any) -> None:
    api, adm, (node, _) = fleet
    tenant = signup(api, "tenant@example.com")
    assert api.post(f"{API}/admin/nodes/{node}/agent-tokens", json={}, headers=tenant.headers).status_code == 403
    assert api.get(f"{API}/admin/agent-tokens", headers=tenant.headers).status_code == 403
    r = api.post(f"{API}/admin/nodes/no-such-node/agent-tokens", json={}, headers=adm)
    assert r.status_code == 404
    made = [api.post(f"{API}/admin/nodes/{node}/agent-tokens", json={}, headers=adm) for _ in range(9)]
    assert [m.status_code for m in made] == [201] * 8 + [409], made[-1].text
    with api.app.state.server.db.read() as s:
        rows = list(s.scalars(select(AgentToken)))
    plain = {m.json()["token"] for m in made[:8]}
    assert len(rows) == 8 and not plain & {r.token_hash for r in rows}
    assert all(r.prefix == m.json()["token"][:10] for r, m in zip(
        sorted(rows, key=lambda r: r.id), sorted(made[:8], key=lambda m: m.json()["id"]), strict=True))  # fmt: skip


def test_the_agent_loop_runs_on_an_agent_token_over_http(tmp_path: Path) -> None:
    home, url = tmp_path / "home", f"sqlite+pysqlite:///{tmp_path / 'db'}"
    with (
        live_server(home, url, env={"SUANLI_TELEMETRY_INTERVAL_S": "3600"}) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as http,
    ):
        adm = bearer(admin_token(http))
        assert http.post(f"{API}/admin/clusters", json={"preset": "1x8:H100", "name": "box"},
                             headers=adm).status_code == 201  # fmt: skip
        node = http.get(f"{API}/admin/nodes", headers=adm).json()[0]["name"]
        token = http.post(f"{API}/admin/nodes/{node}/agent-tokens", json={}, headers=adm).json()["token"]
        with Client(srv.url, token) as c:
            loop = AgentLoop(NvmlSampler(node, FakeNvml([gpu(i) for i in range(8)])), c.post_samples,
                                 interval_s=0.05)  # fmt: skip
            loop.run(threading.Event(), ticks=2)
        assert (loop.sent, loop.failures) == (16, 0)
        gpus = [g for g in http.get(f"{API}/admin/gpus", headers=adm).json() if g["node"] == node]
        assert len(gpus) == 8 and all(g["util"] is not None for g in gpus)


def test_hostile_values_on_the_agent_token_routes_get_4xx_never_5xx(fleet: Any) -> None:
    """A ¥10 sign-up and malformed values: every answer a 4xx, nothing made, nothing revoked."""
    api, adm, (node, _) = fleet
    made = api.post(f"{API}/admin/nodes/{node}/agent-tokens", json={}, headers=adm).json()
    tenant = signup(api, "cheap@example.com")
    assert api.delete(f"{API}/admin/agent-tokens/{made['id']}", headers=tenant.headers).status_code == 403
    for path in (f"{API}/admin/nodes/{'n' * 300}/agent-tokens", f"{API}/admin/nodes/%00/agent-tokens",
                 f"{API}/admin/nodes/..%2F..%2Fx/agent-tokens", f"{API}/admin/nodes/{node}%0A/agent-tokens"):  # fmt: skip
        r = api.post(path, json={}, headers=adm)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
    extra = api.post(f"{API}/admin/nodes/{node}/agent-tokens", json={"node": "other"}, headers=adm)
    assert extra.status_code == 201 and extra.json()["node"] == node  # the path names the node; a body says nothing
    assert api.delete(f"{API}/admin/agent-tokens/{extra.json()['id']}", headers=adm).status_code == 200
    for bad in ("at_0000000000000000", "x" * 1000, "%00"):
        r = api.delete(f"{API}/admin/agent-tokens/{bad}", headers=adm)
        assert 400 <= r.status_code < 500, (bad, r.status_code)
    for token in ("sla_", "sla_" + "x" * 10_000, "sla_" + made["token"][4:] + "x"):
        r = api.post(f"{API}/telemetry/samples", json={"samples": []}, headers=bearer(token))
        assert r.status_code == 401, (token[:20], r.status_code)
    listed = api.get(f"{API}/admin/agent-tokens", headers=adm).json()
    assert [t["id"] for t in listed if t["revoked_at"] is None] == [made["id"]]
    r = api.post(f"{API}/telemetry/samples", json={"samples": []}, headers=bearer(made["token"]))
    assert r.status_code == 200, r.text  # the token still works
