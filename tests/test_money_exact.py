"""Issue: money was floating point on SQLite (NUMERIC affinity stores REAL, and `balance + amount` ran in SQL), so
a top-up of 999999989.99999999 was stored as 1000000000 and twenty top-ups of 0.00000001 vanished while the ledger
check said ok. Amounts are exact on both databases now; the attacks first."""

from __future__ import annotations

from decimal import Decimal

from fastapi.testclient import TestClient
from sqlalchemy import text

from suanli.db.engine import Database
from suanli.db.migrate import migrate
from tests.control_plane import admin_token, bearer, signup

API = "/api/v1"


def _exact(api: TestClient, who: object) -> Decimal:
    r = api.get(f"{API}/orgs/{who.org_id}/balance", headers=who.headers)  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    return Decimal(r.json()["exact"])


def _topup(api: TestClient, adm: dict[str, str], org: str, amount: str) -> None:
    r = api.post(f"{API}/admin/orgs/{org}/transactions", json={"kind": "topup", "amount": amount}, headers=adm)
    assert r.status_code == 201, r.text


def test_a_large_top_up_keeps_its_last_digit(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    who = signup(api, "rich@example.com")
    before = _exact(api, who)
    _topup(api, adm, who.org_id, "999999989.99999999")
    assert _exact(api, who) - before == Decimal("999999989.99999999")


def test_twenty_smallest_top_ups_all_arrive_and_the_check_compares_exactly(api: TestClient) -> None:
    adm = bearer(admin_token(api))
    who = signup(api, "tiny@example.com")
    _topup(api, adm, who.org_id, "999999989.99999999")  # a big balance: a float would drop 1e-8 steps
    before = _exact(api, who)
    for _ in range(20):
        _topup(api, adm, who.org_id, "0.00000001")
    assert _exact(api, who) - before == Decimal("0.00000020")
    check = api.get(f"{API}/admin/ledger/check", headers=adm).json()
    assert check["ok"] and check["mismatches"] == {}, check


def test_amounts_are_stored_as_exact_values_not_floats(api: TestClient) -> None:
    """What the database itself holds: integers of 1e-8 on SQLite, NUMERIC on PostgreSQL; never REAL."""
    adm = bearer(admin_token(api))
    who = signup(api, "stored@example.com")
    _topup(api, adm, who.org_id, "0.10000001")
    db: Database = api.app.state.server.db  # type: ignore[attr-defined]
    with db.engine.connect() as c:
        if db.engine.dialect.name == "sqlite":
            kinds = c.execute(text("SELECT DISTINCT typeof(amount) FROM ledger_entries")).scalars().all()
            assert kinds == ["integer"], kinds
            assert c.execute(text("SELECT DISTINCT typeof(balance) FROM account_balances")).scalars().all() == [
                "integer"
            ]
        else:
            kinds = c.execute(text("SELECT DISTINCT pg_typeof(amount)::text FROM ledger_entries")).scalars().all()
            assert kinds == ["numeric"], kinds


def test_the_migration_turns_stored_reals_into_exact_units(empty_db_url: str) -> None:
    """A database from before: amounts stored as REAL on SQLite; the migration rounds each to the nearest 1e-8."""
    db = Database(empty_db_url)
    try:
        migrate(db.engine, "0011")
        with db.engine.begin() as c:
            c.execute(text("INSERT INTO account_balances (account, balance) VALUES ('org:o', 12.34567891)"))
        migrate(db.engine)
        with db.engine.connect() as c:
            raw = c.execute(text("SELECT balance FROM account_balances WHERE account = 'org:o'")).scalar_one()
        assert Decimal(raw) == (Decimal("1234567891") if db.engine.dialect.name == "sqlite" else Decimal("12.34567891"))
    finally:
        db.dispose()
