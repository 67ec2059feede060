"""Edits of the price book by more than one operator at once: none is lost.

Attack (on the operator's own books, by a second operator or a second tab): each partial edit (one GPU's price, the
host prices, one plan) reads the book in force and stores it changed as a new version. Two at once both read
version N and the later one stored N without the other's change. On PostgreSQL the server's own transactions did
it; the console's plan form did it on any database (it read the book in one request and wrote it in another).
Partial edits now take turns in the database, a plan has a route of its own, and a whole book can say which
version it replaces (`If-Match`)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from suanli.control.ids import utcnow
from suanli.control.money import prices
from tests.concurrency import at_once
from tests.control_plane import admin_token, bearer, signup

GPUS = ("H100-SXM", "H200", "H20", "A800", "RTX-4090", "L40S", "V100", "T4")


def _at_once(*edits: Any) -> None:
    _, errors = at_once(*edits)
    assert not errors, errors


def test_partial_edits_made_at_once_all_survive(db: Any) -> None:
    def gpu(name: str, price: str) -> Any:
        def edit() -> None:
            with db.write() as s, s.begin():
                prices.set_gpu_price(s, name, Decimal(price), utcnow(), None)

        return edit

    def plan(name: str, hours: int) -> Any:
        def edit() -> None:
            with db.write() as s, s.begin():
                prices.set_plan(s, name, hours, Decimal("0.05"), utcnow(), None)

        return edit

    for round_ in range(4):
        price = f"{round_ + 1}.25"
        _at_once(*(gpu(g, price) for g in GPUS), plan(f"p{round_}a", 24), plan(f"p{round_}b", 48))
        with db.read() as s:
            _, book = prices.current(s)
        assert {g: book.gpu_hour[g] for g in GPUS} == {g: Decimal(price) for g in GPUS}, round_
        assert {f"p{round_}a", f"p{round_}b"} <= set(book.plans), (round_, sorted(book.plans))


def test_a_plan_is_set_changed_and_retired_through_its_own_route(api: Any) -> None:
    adm = bearer(admin_token(api))
    r = api.put("/api/v1/admin/prices/plans/fortnight", json={"hours": 336, "discount": "0.12"}, headers=adm)
    assert r.status_code == 200, r.text
    v1 = r.json()["version"]
    assert r.json()["plans"]["fortnight"]["hours"] == 336
    assert Decimal(r.json()["plans"]["fortnight"]["discount"]) == Decimal("0.12")
    r = api.put("/api/v1/admin/prices/plans/fortnight", json={"hours": 336, "discount": "0.15"}, headers=adm)
    assert r.json()["version"] > v1 and Decimal(r.json()["plans"]["fortnight"]["discount"]) == Decimal("0.15")
    assert Decimal(api.get("/api/v1/prices", headers=adm).json()["plans"]["fortnight"]["discount"]) == Decimal("0.15")
    others = set(r.json()["plans"]) - {"fortnight"}
    r = api.delete("/api/v1/admin/prices/plans/fortnight", headers=adm)
    assert r.status_code == 200 and set(r.json()["plans"]) == others
    assert api.delete("/api/v1/admin/prices/plans/fortnight", headers=adm).status_code == 404
    # any name the whole book takes is a plan the route can change and retire (a Chinese name, spaces)
    for name in ("月付", "my plan"):
        r = api.put(f"/api/v1/admin/prices/plans/{name}", json={"hours": 720, "discount": "0.2"}, headers=adm)
        assert r.status_code == 200 and name in r.json()["plans"], r.text
        assert name not in api.delete(f"/api/v1/admin/prices/plans/{name}", headers=adm).json()["plans"]


def test_a_plan_edit_is_bounded_at_the_edge_naming_the_field(api: Any) -> None:
    adm = bearer(admin_token(api))
    for name, body, field in [
        ("x", {"hours": 0, "discount": "0.1"}, "hours"),
        ("x", {"hours": 10**9, "discount": "0.1"}, "hours"),
        ("x", {"hours": 24, "discount": "1"}, "discount"),
        ("x", {"hours": 24, "discount": "-0.1"}, "discount"),
        ("x", {"hours": 24, "discount": "0.123456789"}, "discount"),
        ("x", {"hours": 24}, "discount"),
        ("x", {"hours": 24, "discount": "0.1", "extra": 1}, "extra"),
        ("n" * 33, {"hours": 24, "discount": "0.1"}, "name"),
    ]:
        r = api.put(f"/api/v1/admin/prices/plans/{name}", json=body, headers=adm)
        assert r.status_code == 422 and field in r.text, (name, body, r.status_code, r.text)
    tenant = signup(api, "plan-thief@example.com")
    r = api.put("/api/v1/admin/prices/plans/free", json={"hours": 24, "discount": "0.99"}, headers=tenant.headers)
    assert r.status_code == 403
    assert api.delete("/api/v1/admin/prices/plans/daily", headers=tenant.headers).status_code == 403


def test_a_whole_book_may_name_the_version_it_replaces(api: Any) -> None:
    adm = bearer(admin_token(api))
    book = api.get("/api/v1/prices", headers=adm).json()
    seen = api.get("/api/v1/prices", headers=adm).headers["etag"]
    assert seen == f'"{book["version"]}"'
    # another operator changes one price after this one read the book
    assert api.put("/api/v1/admin/prices/gpus/T4", json={"on_demand": "0.90"}, headers=adm).status_code == 200
    stale = api.put("/api/v1/admin/prices", json={**book, "spot_factor": "0.5"}, headers={**adm, "If-Match": seen})
    assert stale.status_code == 412 and "version" in stale.json()["detail"], stale.text
    assert Decimal(api.get("/api/v1/prices", headers=adm).json()["gpu_hour"]["T4"]) == Decimal("0.9")  # it stands
    fresh = api.get("/api/v1/prices", headers=adm)
    r = api.put("/api/v1/admin/prices", json={**fresh.json(), "spot_factor": "0.5"},
                headers={**adm, "If-Match": fresh.headers["etag"]})  # fmt: skip
    assert r.status_code == 200 and Decimal(r.json()["spot_factor"]) == Decimal("0.5")
    for junk in ("*x", '"abc"', "1" * 40, "", '"\u00b2"', 'W/"1"', '"1", "2"'):
        r = api.put("/api/v1/admin/prices", json=fresh.json(), headers={**adm, "If-Match": junk.encode("latin-1")})  # type: ignore[dict-item]
        assert r.status_code in (412, 422), (junk, r.status_code, r.text)
    assert api.put("/api/v1/admin/prices", json=fresh.json(), headers={**adm, "If-Match": "*"}).status_code == 200
    # without If-Match a whole book replaces the one in force, as before
    assert api.put("/api/v1/admin/prices", json=fresh.json(), headers=adm).status_code == 200


def test_a_tenant_or_a_stranger_changes_no_price_and_odd_names_are_4xx(api: Any) -> None:
    """Attack: a ¥10 sign-up (and a caller with no token) on every new price route, with valid bodies and the
    book's current ETag; then names an operator might mistype or a script might forge."""
    adm = bearer(admin_token(api))
    before = api.get("/api/v1/prices", headers=adm)
    etag = before.headers["etag"]
    tenant = signup(api, "price-thief@example.com")
    for headers, status in ((tenant.headers, 403), ({}, 401)):
        calls = [
            api.put("/api/v1/admin/prices", json={**before.json(), "spot_factor": "0.01"},
                    headers={**headers, "If-Match": etag}),
            api.put("/api/v1/admin/prices/plans/daily", json={"hours": 24, "discount": "0.99"}, headers=headers),
            api.delete("/api/v1/admin/prices/plans/daily", headers=headers),
        ]  # fmt: skip
        assert [r.status_code for r in calls] == [status] * 3, [r.text for r in calls]
    after = api.get("/api/v1/prices", headers=adm)
    assert after.headers["etag"] == etag and after.json() == before.json()
    # a name with a slash is no plan route; NUL, an empty name: refused, never a 500, nothing changed
    for path in ("a%2Fb", "a/b", "%00", "x%00y", ""):
        r = api.put(f"/api/v1/admin/prices/plans/{path}", json={"hours": 24, "discount": "0.1"}, headers=adm)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
        r = api.delete(f"/api/v1/admin/prices/plans/{path}", headers=adm)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
    assert api.get("/api/v1/prices", headers=adm).headers["etag"] == etag
