"""Volumes are billed by the hour from the price book, exactly and once, on both databases; an org out of money
gets its volumes read-only after the grace period, never deleted, and writable again after a top-up."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.control.money import ledger
from suanli.control.storage import volume_billing, volumes
from suanli.db.models import LedgerTransaction
from suanli.db.volumes import Volume
from tests.control_plane import admin_token, bearer, signup

API = "/api/v1"
MiB = 1 << 20


@pytest.fixture
def api(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[TestClient]:
    from suanli.api.app import create_app
    from tests.control_plane import settings

    with TestClient(create_app(settings(tmp_path / "home", db_url, volume_max_bytes=1 << 40))) as client:
        r = client.post(f"{API}/admin/clusters", json={"local": True, "name": "this-host"},
                        headers=bearer(admin_token(client)))  # fmt: skip
        assert r.status_code == 201, r.text
        yield client


def test_hours_are_charged_exactly_once_and_money_never_deletes(api: TestClient) -> None:
    db = api.app.state.server.db  # type: ignore[attr-defined]
    t = signup(api, "a@example.com")
    vol = api.post(f"{API}/volumes", json={"name": "data", "size": "200Gi"}, headers=t.headers).json()
    with db.read() as s:
        start = s.get(Volume, vol["id"]).billed_until
    # 200 GiB at the default 0.30 per GB-month, one hour: 214.748364800 GB x 0.30 / 720, exact to 1e-8.
    hour = (Decimal(200 << 30) * Decimal("0.30") / (Decimal(10**9) * 720)).quantize(Decimal("1e-8"))
    for _ in range(2):  # a second pass (or another server) charges nothing again
        volume_billing.meter(db, start + timedelta(hours=3, minutes=59), grace_minutes=5)
    with db.read() as s:
        rows = list(s.scalars(select(LedgerTransaction).where(LedgerTransaction.key.like(f"volume:{vol['id']}:%"))))
        assert len(rows) == 3
        assert ledger.org_balance(s, t.org_id) == Decimal("10.00") - 3 * hour
    # The org's money runs out: after the grace period the volume is read-only, never removed.
    with db.write() as s, s.begin():
        left = ledger.org_balance(s, t.org_id)
        ledger.post(s, transfer("drain", "usage", org_account(t.org_id), REVENUE, left, "drain"), start,
                    org_id=t.org_id)  # fmt: skip
    volume_billing.meter(db, start + timedelta(hours=4, minutes=1), grace_minutes=5)
    assert api.get(f"{API}/volumes/data", headers=t.headers).json()["state"] == "ready"  # within the grace
    volume_billing.meter(db, start + timedelta(hours=5, minutes=2), grace_minutes=5)
    v = api.get(f"{API}/volumes/data", headers=t.headers).json()
    assert v["state"] == "read-only" and Decimal(v["price_per_hour"]) == hour
    r = api.put(f"{API}/volumes/data/files", params={"path": "x"}, content=b"x", headers=t.headers)
    assert r.status_code == 402 and "read-only" in r.json()["detail"]
    from suanli.workloads.volumes import VolumeMount

    with db.read() as s:
        (m,) = volumes.host_mounts(s, Path("/v"), t.org_id, (VolumeMount(name="data", path="/data"),))
    assert not m.writable and "balance" in m.note
    with db.read() as s:
        assert ledger.org_balance(s, t.org_id) < 0  # storage still accrues: the bytes are kept
    admin = bearer(admin_token(api))
    r = api.post(f"{API}/admin/orgs/{t.org_id}/transactions", json={"kind": "topup", "amount": "100"}, headers=admin)
    assert r.status_code == 201, r.text
    volume_billing.meter(db, start + timedelta(hours=5, minutes=30), grace_minutes=5)
    assert api.get(f"{API}/volumes/data", headers=t.headers).json()["state"] == "ready"
    assert (
        api.put(f"{API}/volumes/data/files", params={"path": "x"}, content=b"x", headers=t.headers).status_code == 200
    )


def test_a_volume_a_workload_filled_past_its_size_is_full_until_emptied(api: TestClient) -> None:
    from suanli.control.storage import volume_files
    from suanli.storage import volumes as store

    db = api.app.state.server.db  # type: ignore[attr-defined]
    root = api.app.state.server.settings.volumes_root  # type: ignore[attr-defined]
    t = signup(api, "a@example.com")
    vol = api.post(f"{API}/volumes", json={"name": "data", "size": "1Mi"}, headers=t.headers).json()
    job = {"name": "filler", "command": "sleep 60", "resources": {"gpus": 0},
           "volumes": [{"name": "data", "path": "/data"}]}  # fmt: skip
    assert api.post(f"{API}/workloads", json={"spec": job}, headers=t.headers).status_code == 201
    data = store.paths(root, vol["org_id"], vol["id"], None).data
    (data / "big").write_bytes(b"x" * (2 * MiB))  # what the job wrote inside its sandbox
    from suanli.control.ids import utcnow

    assert volume_files.measure_mounted(db, root, utcnow()) == 1
    v = api.get(f"{API}/volumes/data", headers=t.headers).json()
    assert v["state"] == "full" and v["used_bytes"] > MiB
    with db.read() as s:
        from suanli.workloads.volumes import VolumeMount

        (m,) = volumes.host_mounts(s, root, t.org_id, (VolumeMount(name="data", path="/data"),))
    assert not m.writable and "over its size" in m.note
    assert (
        api.put(f"{API}/volumes/data/files", params={"path": "y"}, content=b"y", headers=t.headers).status_code == 507
    )
    assert api.delete(f"{API}/volumes/data/files", params={"path": "big"}, headers=t.headers).status_code == 204
    assert api.get(f"{API}/volumes/data", headers=t.headers).json()["state"] == "ready"


def test_storage_is_its_own_lines_in_usage_and_quoted_exactly(api: TestClient) -> None:
    db = api.app.state.server.db  # type: ignore[attr-defined]
    t, other = signup(api, "a@example.com"), signup(api, "b@example.com")
    vol = api.post(f"{API}/volumes", json={"name": "data", "size": "200Gi"}, headers=t.headers).json()
    gone = api.post(f"{API}/volumes", json={"name": "old", "size": "1Gi"}, headers=t.headers).json()
    with db.read() as s:
        start = s.get(Volume, vol["id"]).billed_until
    volume_billing.meter(db, start + timedelta(hours=3, minutes=1), grace_minutes=5)
    assert api.delete(f"{API}/volumes/old", headers=t.headers).status_code == 204
    hour = (Decimal(200 << 30) * Decimal("0.30") / (Decimal(10**9) * 720)).quantize(Decimal("1e-8"))
    small = (Decimal(1 << 30) * Decimal("0.30") / (Decimal(10**9) * 720)).quantize(Decimal("1e-8"))
    url = f"{API}/orgs/{t.org_id}/usage/storage"
    r = api.get(url, headers=t.headers)
    assert r.status_code == 200, r.text
    data, old = r.json()
    assert (data["volume"], data["hours"], Decimal(data["cost"])) == ("data", 3, 3 * hour)
    assert data["size_bytes"] == 200 << 30 and Decimal(data["price_per_hour"]) == hour
    assert (old["volume_id"], old["volume"], old["hours"]) == (gone["id"], "old", 3)  # removed: still charged
    assert Decimal(old["cost"]) == 3 * small and old["size_bytes"] is None and old["price_per_hour"] is None
    # The hours that start in [since, until): the first and the last left out.
    first = data["first_hour"]
    since = (start + timedelta(hours=1)).isoformat()
    until = (start + timedelta(hours=2)).isoformat()
    (one, _) = api.get(url, params={"since": since, "until": until}, headers=t.headers).json()
    assert one["hours"] == 1 and Decimal(one["cost"]) == hour and one["first_hour"] > first
    assert api.get(url, headers=other.headers).status_code in (403, 404)  # another org's charges are not theirs
    # The statement's sum for storage is the ledger's: nothing computed apart from it.
    with db.read() as s:
        charged = sum(
            (-ledger.net_for_org(tx, t.org_id) for tx in s.scalars(select(LedgerTransaction).where(
                LedgerTransaction.key.like("volume:%")))), Decimal(0)
        )  # fmt: skip
    assert charged == 3 * hour + 3 * small
    # A quote: exactly what the hourly meter charges, from the price book in force.
    q = api.post(f"{API}/quotes/storage", json={"size": "200Gi", "hours": 720}, headers=t.headers)
    assert q.status_code == 200, q.text
    assert Decimal(q.json()["per_hour"]) == hour and Decimal(q.json()["cost"]) == 720 * hour
    assert q.json()["bytes"] == 200 << 30 and q.json()["currency"] == "CNY"
    for body, field in (({"size": "lots"}, "size"), ({"size": "9" * 40}, "size"), ({"size": 1.5}, "size"),
                        ({"size": "1Gi", "hours": 0}, "hours"), ({"size": "1Gi", "hours": 10**9}, "hours"),
                        ({"size": "1Gi", "hours": "1e3"}, "hours")):  # fmt: skip
        r = api.post(f"{API}/quotes/storage", json=body, headers=t.headers)
        assert r.status_code == 422 and field in r.text, (body, r.text)


def test_an_hour_is_paid_at_the_largest_size_it_held(api: TestClient) -> None:
    """The hour is charged once it ends, at the size the volume has then: a 1 TiB volume shrunk to 1 MiB (or removed)
    just before paid for 1 MiB (or nothing). A shrink or a removal now charges the hours begun at the size before."""
    db = api.app.state.server.db  # type: ignore[attr-defined]
    t = signup(api, "shrinker@example.com")
    for name in ("big", "gone"):
        assert api.post(f"{API}/volumes", json={"name": name, "size": "1Ti"}, headers=t.headers).status_code == 201
    book_hour = (Decimal(1 << 40) * Decimal("0.30") / (Decimal(10**9) * 720)).quantize(Decimal("1e-8"))
    with db.read() as s:
        start = s.get(Volume, api.get(f"{API}/volumes/big", headers=t.headers).json()["id"]).billed_until
    before = _balance(api, t)
    assert api.patch(f"{API}/volumes/big", json={"size": "1Mi"}, headers=t.headers).status_code == 200
    assert api.delete(f"{API}/volumes/gone", headers=t.headers).status_code == 204
    volume_billing.meter(db, start + timedelta(hours=1, minutes=1), grace_minutes=5)
    charged = before - _balance(api, t)
    assert charged >= 2 * book_hour, (charged, book_hour)  # each paid its first hour at 1 TiB
    volume_billing.meter(db, start + timedelta(hours=1, minutes=2), grace_minutes=5)
    assert before - _balance(api, t) == charged  # and only once


def _balance(api: TestClient, who: Any) -> Decimal:
    with api.app.state.server.db.read() as s:  # type: ignore[attr-defined]
        return ledger.org_balance(s, who.org_id)
