"""Issue: JSON floats were accepted for money (`"amount": 1.5` → 201 while the docs say floats are refused),
and duplicate keys and a byte order mark passed silently (which `amount` counts depends on the parser). Attacks
first; in-process on both databases."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from tests.control_plane import admin_token, bearer, signup

API = "/api/v1"


def _post(api: TestClient, path: str, raw: bytes, headers: dict[str, str]) -> object:
    return api.post(f"{API}{path}", content=raw, headers={**headers, "content-type": "application/json"})


def test_a_json_float_is_refused_for_money_naming_the_field(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    who = signup(api, "tenant@example.com")
    path = f"/admin/orgs/{who.org_id}/transactions"
    r = api.post(f"{API}{path}", json={"kind": "topup", "amount": 1.5}, headers=adm)
    assert r.status_code == 422 and r.json()["detail"].startswith("amount"), r.text
    assert "string" in r.json()["detail"]
    assert api.post(f"{API}{path}", json={"kind": "topup", "amount": "1.5"}, headers=adm).status_code == 201
    assert api.post(f"{API}{path}", json={"kind": "topup", "amount": 2}, headers=adm).status_code == 201  # whole


def test_a_float_price_is_refused_too(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    r = api.put(f"{API}/admin/prices/gpus/H20", json={"on_demand": 0.1}, headers=adm)
    assert r.status_code == 422 and r.json()["detail"].startswith("on_demand"), r.text
    assert api.put(f"{API}/admin/prices/gpus/H20", json={"on_demand": "0.1"}, headers=adm).status_code == 200


def test_duplicate_keys_are_refused_naming_the_key(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    who = signup(api, "tenant@example.com")
    raw = b'{"kind": "topup", "amount": "1", "amount": "100000"}'
    r = _post(api, f"/admin/orgs/{who.org_id}/transactions", raw, adm)
    assert r.status_code == 422, r.text  # type: ignore[attr-defined]
    assert "duplicate key" in r.json()["detail"] and "amount" in r.json()["detail"]  # type: ignore[attr-defined]
    nested = json.dumps({"spec": {"name": "x", "command": "true"}}).replace('"name": "x"', '"name": "x", "name": "y"')
    r = _post(api, "/workloads", nested.encode(), who.headers)
    assert r.status_code == 422 and "duplicate key" in r.json()["detail"], r.text  # type: ignore[attr-defined]


def test_a_byte_order_mark_is_refused(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    who = signup(api, "tenant@example.com")
    raw = b'\xef\xbb\xbf{"kind": "topup", "amount": "1"}'
    r = _post(api, f"/admin/orgs/{who.org_id}/transactions", raw, adm)
    assert r.status_code == 422 and "byte order mark" in r.json()["detail"], r.text  # type: ignore[attr-defined]
    r = _post(api, f"/admin/orgs/{who.org_id}/transactions", raw[3:], adm)
    assert r.status_code == 201, r.text  # type: ignore[attr-defined]
