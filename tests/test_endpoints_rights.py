"""A plain member (no `others` right) may not scale, remove, or revoke the keys of, an endpoint another member
deployed; an owner or admin may, as with another member's workloads. Found by a hostile review (both databases).

An endpoint's replicas are workloads of its deployer (`control.serving.endpoints`: submitted as `e.user_id`), so
scaling one up spends money charged to the deployer (and to the deployer's monthly spend limit), and removing it
deletes the deployer's keys. For workloads, `memberships.check_work` keeps "stop, start or scale other members'
work" to owners and admins (docs/control-plane.md's table); the endpoint routes asked only for `submit`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from suanli.control.ids import utcnow
from suanli.control.storage import hub
from tests.control_plane import admin_token, bearer, join, signup

API = "/api/v1"
SPEC = {"name": "team-chat", "kind": "service", "model": "tiny", "replicas": 0, "resources": {"gpu": "H20", "gpus": 1}}


@pytest.fixture
def team(api: Any) -> Any:
    adm = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20"}, headers=adm).status_code == 201
    owner, alice = signup(api, "owner@example.com"), signup(api, "alice@example.com")
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    join(api, owner, org, alice, "member")
    r = api.post(f"{API}/admin/orgs/{org}/transactions", json={"amount": "1000", "key": "seed"}, headers=adm)
    assert r.status_code == 201, r.text
    home: Path = api.app.state.server.settings.home
    src = home / "tiny-src"
    src.mkdir(parents=True)
    (src / "config.json").write_text('{"model_type": "llama"}')
    hub.add(api.app.state.server.db, hub.store_of(None, home), "model", "tiny", str(src), utcnow(),
            repo_id="acme/tiny")  # fmt: skip
    ep = api.post(f"{API}/endpoints", json={"spec": SPEC, "org": org}, headers=owner.headers)
    assert ep.status_code == 201, ep.text
    return owner, alice, org, ep.json()["id"]


def test_a_member_scales_only_their_own_endpoint_and_an_owner_any(api: Any, team: Any) -> None:
    owner, alice, org, ep = team
    r = api.post(f"{API}/endpoints/{ep}/scale", json={"replicas": 4}, headers=alice.headers)
    assert r.status_code == 403, (r.status_code, r.text)
    assert api.get(f"{API}/endpoints/{ep}", headers=owner.headers).json()["desired"] == 0
    mine = api.post(f"{API}/endpoints", json={"spec": {**SPEC, "name": "alices"}, "org": org}, headers=alice.headers)
    assert mine.status_code == 201, mine.text  # her own she scales
    assert api.post(f"{API}/endpoints/alices/scale", json={"replicas": 1}, headers=alice.headers).status_code == 200
    join_admin = api.post(f"{API}/endpoints/{ep}/scale", json={"replicas": 1}, headers=owner.headers)
    assert join_admin.status_code == 200  # the owner may scale anyone's


def test_a_member_cannot_remove_another_members_endpoint_or_revoke_their_key(api: Any, team: Any) -> None:
    owner, alice, _org, ep = team
    key = api.post(
        f"{API}/endpoints/{ep}/keys", json={"password": "tenant-password", "name": "prod"}, headers=owner.headers
    )
    assert key.status_code == 201, key.text
    r = api.delete(f"{API}/endpoints/{ep}", headers=alice.headers)
    assert r.status_code == 403, (r.status_code, r.text)
    assert api.get(f"{API}/endpoints/{ep}", headers=owner.headers).status_code == 200
    r = api.delete(f"{API}/endpoint-keys/{key.json()['id']}", headers=alice.headers)
    assert r.status_code in (403, 404), (r.status_code, r.text)
    keys = api.get(f"{API}/endpoints/{ep}/keys", headers=owner.headers).json()
    assert [k["revoked_at"] for k in keys] == [None]
