"""Hostile numbers on the money routes a tenant with a trial credit reaches (from a hostile review): never a 5xx,
and never a 2xx that moved money on a nonsense amount. Raw JSON bodies, so numbers Python cannot hold as floats
(1e309, 10**400, NaN, Infinity) reach the server as written."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.control_plane import admin_token, bearer, join, signup

API = "/api/v1"
HOSTILE_NUMBERS = ["1e309", "-1e309", "NaN", "Infinity", "-Infinity", "1" + "0" * 400, "-1", "0", "1e-400",
                   '"1e309"', '"NaN"', '"Infinity"', '"-0"', '"1E+30"', '"0.000000001"', '"1e2"', '" 1"', '"1_0"',
                   "true", '"٣"', "1.5"]  # fmt: skip


def _raw(api: TestClient, method: str, path: str, body: str, headers: dict[str, str]) -> Any:
    return api.request(method, path, content=body.encode(), headers={**headers, "content-type": "application/json"})


@pytest.fixture
def world(api: TestClient) -> dict[str, Any]:
    adm = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "1x8:H20", "name": "c"}, headers=adm).status_code == 201
    t, other = signup(api, "hostile@example.com"), signup(api, "colleague@example.com")
    team = api.post(f"{API}/orgs", json={"name": "hostile-team"}, headers=t.headers).json()["id"]
    join(api, t, team, other)
    return {"t": t, "other": other, "team": team, "adm": adm}


def test_hostile_numbers_never_get_a_5xx_on_money_routes(api: TestClient, world: dict[str, Any]) -> None:
    t, team, other = world["t"], world["team"], world["other"]
    bad: list[str] = []
    for n in HOSTILE_NUMBERS:
        cases = [
            ("POST", f"{API}/orgs/{t.org_id}/plans", f'{{"plan": "hourly", "gpu": "H20", "gpus": {n}}}'),
            ("POST", f"{API}/quotes", f'{{"model": "llama3.1-8b", "tokens": {n}}}'),
            ("POST", f"{API}/quotes", f'{{"model": "llama3.1-8b", "steps": {n}}}'),
            ("POST", f"{API}/quotes", f'{{"model": "llama3.1-8b", "tokens": 1000, "cpus_per_gpu": {n}}}'),
            ("POST", f"{API}/quotes/serve", f'{{"model": "llama3.1-8b", "rps": {n}}}'),
            ("POST", f"{API}/quotes/serve", f'{{"model": "llama3.1-8b", "rps": 1, "slo_ttft_ms": {n}}}'),
            ("POST", f"{API}/quotes/serve", f'{{"model": "llama3.1-8b", "rps": 1, "cpus_per_replica": {n}}}'),
            (
                "POST",
                f"{API}/quotes/workload",
                f'{{"spec": {{"command": "x", "resources": {{"gpus": 1, "gpu": "H20"}}, "duration": {n}}}}}',
            ),
            (
                "POST",
                f"{API}/quotes/workload",
                f'{{"spec": {{"command": "x", "resources": {{"gpus": 1, "gpu": "H20"}}, "max_price_per_hour": {n}}}}}',
            ),
            (
                "POST",
                f"{API}/quotes/workload",
                f'{{"spec": {{"command": "x", "resources": {{"gpus": 1, "gpu": "H20", "cpus": {n}}}}}}}',
            ),
            ("POST", f"{API}/quotes/workload", f'{{"spec": {{"command": "x", "resources": {{"gpus": {n}}}}}}}'),
            (
                "POST",
                f"{API}/workloads",
                f'{{"spec": {{"name": "h", "command": "x", "resources": {{"gpus": 0, "cpus": {n}}}}}}}',
            ),
            (
                "POST",
                f"{API}/workloads",
                f'{{"spec": {{"name": "h", "command": "x", "resources": {{"gpus": 1}}, "max_price_per_hour": {n}}}}}',
            ),
            ("PATCH", f"{API}/orgs/{team}/members/{other.user_id}", f'{{"monthly_spend_limit": {n}}}'),
            ("POST", f"{API}/orgs/{t.org_id}/redeem", f'{{"code": {n}}}'),
        ]
        for method, path, body in cases:
            r = _raw(api, method, path, body, t.headers)
            if r.status_code >= 500:
                bad.append(f"{method} {path} {body} -> {r.status_code} {r.text[:120]}")
            if path.endswith("/plans") and r.status_code == 201 and r.json()["gpus"] < 1:
                bad.append(f"plan bought with gpus={n}: {r.text[:120]}")
    assert not bad, "\n".join(bad)
