"""A fleet, a victim with a team and a priced endpoint, and an attacker with a token that never expires: the scene of
the hostile tests of operator routes, telemetry ingest and endpoint keys. No tests here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from suanli.control.ids import utcnow
from suanli.control.storage import hub
from tests.control_plane import Tenant, admin_token, bearer, signup

API = "/api/v1"
PASSWORD = "tenant-password"


@dataclass
class Scene:
    api: Any
    admin: dict[str, str]
    node: str
    victim: Tenant
    team: str
    endpoint: str
    attacker: Tenant
    attacker_forever: dict[str, str]  # a token of the attacker's that never expires (no password asked again)


def add_tiny_model(api: Any) -> None:
    srv = api.app.state.server
    src = srv.settings.home / "tiny-src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "config.json").write_text('{"model_type": "llama"}')
    hub.add(srv.db, hub.store_of(None, srv.settings.home), "model", "tiny", str(src), utcnow(), repo_id="acme/tiny")


def scene(api: Any, price: str | None = "1") -> Scene:
    adm = bearer(admin_token(api))
    r = api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20", "name": "shared"}, headers=adm)
    assert r.status_code == 201, r.text
    node = api.get(f"{API}/admin/nodes", headers=adm).json()[0]["name"]
    victim = signup(api, "victim@example.com", PASSWORD)
    team = api.post(f"{API}/orgs", json={"name": "victim-team"}, headers=victim.headers).json()["id"]
    r = api.post(f"{API}/admin/orgs/{team}/transactions", json={"amount": "1000", "key": "seed"}, headers=adm)
    assert r.status_code == 201, r.text
    add_tiny_model(api)
    spec: dict[str, Any] = {"name": "victim-chat", "kind": "service", "model": "tiny", "replicas": 0,
                            "resources": {"gpu": "H20", "gpus": 1}}  # fmt: skip
    if price is not None:
        spec["price_per_1m_tokens"] = price
    ep = api.post(f"{API}/endpoints", json={"spec": spec, "org": team}, headers=victim.headers)
    assert ep.status_code == 201, ep.text
    attacker = signup(api, "mallory@example.com", PASSWORD)
    r = api.post(f"{API}/tokens", json={"name": "forever", "password": PASSWORD}, headers=attacker.headers)
    assert r.status_code == 201, r.text
    return Scene(api, adm, node, victim, team, ep.json()["id"], attacker, bearer(r.json()["token"]))
