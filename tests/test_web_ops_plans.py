"""Plans on /ops/prices: add, change and retire a plan through `PUT /admin/prices` (the book in force with that
plan changed), exact decimal strings, the API's 422 at the field, CSRF, tenants refused; SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, admin_token, bearer
from tests.web_helpers import Console, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)


@pytest.fixture
def ops(api: Any) -> Console:
    c = Console(api)
    c.login(ADMIN_EMAIL, ADMIN_PASSWORD)
    return c


def _book(api: Any) -> dict[str, Any]:
    return api.get("/api/v1/prices", headers=bearer(admin_token(api))).json()


def test_add_change_and_retire_a_plan_keeps_the_rest_of_the_book(api: Any, ops: Console) -> None:
    before = _book(api)
    r = ops.post("/ops/prices/plan", {"name": "fortnight", "hours": "336", "discount": "0.12345678"},
                 csrf_from="/ops/prices")  # fmt: skip
    assert r.status_code == 303, r.text
    after = _book(api)
    assert after["version"] > before["version"]
    assert after["plans"]["fortnight"]["hours"] == 336
    assert after["plans"]["fortnight"]["discount"] in ("0.12345678", "0.1234567800")  # exact, never via a float
    assert {k: v for k, v in after.items() if k not in ("version", "plans")} == {
        k: v for k, v in before.items() if k not in ("version", "plans")}  # fmt: skip
    assert {k: v for k, v in after["plans"].items() if k != "fortnight"} == before["plans"]
    page = ops.get("/ops/prices", headers={"Accept-Language": "en"})
    assert 'data-plan="fortnight"' in page.text and "0.12345678" in page.text
    r = ops.post("/ops/prices/plan", {"name": "fortnight", "hours": "24", "discount": "0.5"}, csrf_from="/ops/prices")
    assert r.status_code == 303
    assert _book(api)["plans"]["fortnight"]["hours"] == 24
    r = ops.post("/ops/prices/plan", {"name": "fortnight", "retire": "1"}, csrf_from="/ops/prices")
    assert r.status_code == 303
    assert "fortnight" not in _book(api)["plans"] and _book(api)["plans"] == before["plans"]
    assert 'data-plan="fortnight"' not in ops.get("/ops/prices").text


@pytest.mark.parametrize(("form", "field"), [
    ({"name": "p", "hours": "0", "discount": "0.1"}, "hours"),
    ({"name": "p", "hours": "abc", "discount": "0.1"}, "hours"),
    ({"name": "p", "hours": "99999999", "discount": "0.1"}, "hours"),
    ({"name": "p", "hours": "24", "discount": "1"}, "discount"),
    ({"name": "p", "hours": "24", "discount": "-0.1"}, "discount"),
    ({"name": "p", "hours": "24", "discount": "0.1e1000"}, "discount"),
    ({"name": "p", "hours": "24", "discount": "0.123456789"}, "discount"),  # more places than money keeps
    ({"name": "p", "hours": "24", "discount": "NaN"}, "discount"),
    ({"name": "x" * 33, "hours": "24", "discount": "0.1"}, "name"),
    ({"name": " ", "hours": "24", "discount": "0.1"}, "name"),
    ({"name": "never-was", "retire": "1"}, "name"),
])  # fmt: skip
def test_bad_plan_input_shows_the_field_message_and_changes_nothing(
    api: Any, ops: Console, form: dict[str, str], field: str
) -> None:
    before = _book(api)
    r = ops.post("/ops/prices/plan", form, csrf_from="/ops/prices")
    assert r.status_code == 422, r.text
    assert f'data-field="{field}"' in r.text, r.text
    assert _book(api) == before


def test_plan_form_needs_csrf_and_an_operator(api: Any, ops: Console) -> None:
    before = _book(api)
    form = {"name": "sneaky", "hours": "24", "discount": "0.99"}
    assert ops.c.post("/ops/prices/plan", data=form, follow_redirects=False).status_code == 403
    assert ops.c.post("/ops/prices/plan", data={"csrf": "0" * 40, **form}, follow_redirects=False).status_code == 403
    tenant = Console(type(api)(api.app))
    tenant.signup("planner@example.com")
    assert tenant.post("/ops/prices/plan", form).status_code == 403  # its own valid CSRF token: still refused
    assert tenant.post("/ops/prices/plan", {"name": "weekly", "retire": "1"}).status_code == 403
    assert _book(api) == before
