"""Pay by compute used over HTTP, on SQLite and PostgreSQL: offers and both kinds of quote show the usage price (a
quote as the range from GPUs idle to fully active), the operator sets usage prices and the floor, a usage submission
holds its full-activity rate and keeps its idle rate, and what cannot be billed by usage is refused naming the field."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import suanli.client
from suanli.billing.metering import cost_of
from suanli.cli.common import EXIT_BAD_INPUT
from suanli.client import Client
from suanli.control.ids import utcnow
from suanli.control.money import metering
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.db.engine import Database
from suanli.db.migrate import migrate
from suanli.db.models import Allocation
from tests.cli_helpers import invoke
from tests.control_plane import Tenant, admin_token, bearer, signup
from tests.test_host_billing import forwarding

API = "/api/v1"
JOB = {"model": "llama3.1-8b", "seq_len": 4096, "global_batch": 256, "tokens": 1e9}


@pytest.fixture
def market(api: Any) -> tuple[Any, dict[str, str], Tenant]:
    adm = bearer(admin_token(api))
    r = api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20"}, headers=adm)
    assert r.status_code == 201, r.text
    return api, adm, signup(api, "usage-api@example.com")


def _ok(r: Any, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json()


def _book(api: Any, t: Tenant) -> dict[str, Any]:
    return _ok(api.get(f"{API}/prices", headers=t.headers))


def test_offers_show_the_usage_price_busy_and_idle_from_the_book(market: tuple[Any, dict[str, str], Tenant]) -> None:
    api, _, t = market
    book = _book(api, t)
    usage, floor = Decimal(book["usage_gpu_hour"]["H20"]), Decimal(book["usage_floor"])
    assert (usage, floor) == (Decimal("10.625"), Decimal("0.2"))
    [o] = [o for o in _ok(api.get(f"{API}/offers", headers=t.headers)) if o["gpu"] == "H20"]
    assert Decimal(o["usage_per_gpu_hour"]) == usage
    assert Decimal(o["usage_floor_per_gpu_hour"]) == usage * floor == Decimal("2.125")
    assert Decimal(o["usage_floor_per_gpu_hour"]) < Decimal(o["on_demand_per_gpu_hour"]) < usage


def test_a_training_quote_by_usage_is_the_range_from_idle_to_fully_active(
    market: tuple[Any, dict[str, str], Tenant],
) -> None:
    api, _, t = market
    on_demand = _ok(api.post(f"{API}/quotes", json={**JOB, "gpus": 8}, headers=t.headers))
    by_usage = _ok(api.post(f"{API}/quotes", json={**JOB, "gpus": 8, "billing_mode": "usage", "cpus_per_gpu": 2},
                            headers=t.headers))  # fmt: skip
    assert on_demand and by_usage and all(q["floor_rate_per_hour"] is None for q in on_demand)
    q = by_usage[0]
    host = Decimal(q["host_rate_per_hour"])
    assert host == 16 * Decimal("0.10")  # 2 cores a GPU, on demand
    assert Decimal(q["rate_per_hour"]) == 8 * Decimal("10.625") + host
    assert Decimal(q["floor_rate_per_hour"]) == 8 * Decimal("2.125") + host
    assert Decimal(q["floor_cost"]) < Decimal(q["cost"])
    seconds = Decimal(str(q["total_time_s"]))
    assert abs(Decimal(q["cost"]) - Decimal(q["rate_per_hour"]) * seconds / 3600) < Decimal("0.02")
    assert abs(Decimal(q["floor_cost"]) - Decimal(q["floor_rate_per_hour"]) * seconds / 3600) < Decimal("0.02")


def test_a_workload_quote_by_usage_is_the_range_and_others_have_none(
    market: tuple[Any, dict[str, str], Tenant],
) -> None:
    api, _, t = market
    spec = {"name": "q", "command": "c", "resources": {"gpu": "H20", "gpus": 4, "cpus": 8}, "duration": "90m"}
    [q] = _ok(api.post(f"{API}/quotes/workload", json={"spec": {**spec, "billing": "usage"}}, headers=t.headers))
    host = Decimal(q["host_rate_per_hour"])
    assert (q["billing_mode"], host) == ("usage", Decimal("0.8"))
    rate, floor = Decimal(q["rate_per_hour"]), Decimal(q["floor_rate_per_hour"])
    assert (rate, floor) == (4 * Decimal("10.625") + host, 4 * Decimal("2.125") + host)
    assert (Decimal(q["cost"]), Decimal(q["floor_cost"])) == (cost_of(rate, 5400), cost_of(floor, 5400))
    [plain] = _ok(api.post(f"{API}/quotes/workload", json={"spec": spec}, headers=t.headers))
    assert (plain["floor_rate_per_hour"], plain["floor_cost"]) == (None, None)


def test_the_operator_sets_usage_prices_and_the_floor_and_tenants_see_them(
    market: tuple[Any, dict[str, str], Tenant],
) -> None:
    api, adm, t = market
    book = _ok(api.put(f"{API}/admin/prices/usage", json={"gpu_hour": {"h20": "12.5"}, "floor": "0.3"}, headers=adm))
    assert (book["usage_gpu_hour"]["H20"], book["usage_floor"]) == ("12.50000000", "0.30000000")
    [o] = [o for o in _ok(api.get(f"{API}/offers", headers=t.headers)) if o["gpu"] == "H20"]
    assert (Decimal(o["usage_per_gpu_hour"]), Decimal(o["usage_floor_per_gpu_hour"])) == (Decimal("12.5"),
                                                                                          Decimal("3.75"))  # fmt: skip
    assert api.put(f"{API}/admin/prices/usage", json={"floor": "0.5"}, headers=t.headers).status_code == 403

    book = _ok(api.put(f"{API}/admin/prices/usage", json={"gpu_hour": {"H20": None}}, headers=adm))
    assert "H20" not in book["usage_gpu_hour"] and book["usage_floor"] == "0.30000000"
    [o] = [o for o in _ok(api.get(f"{API}/offers", headers=t.headers)) if o["gpu"] == "H20"]
    assert (o["usage_per_gpu_hour"], o["usage_floor_per_gpu_hour"]) == (None, None)
    assert o["on_demand_per_gpu_hour"] is not None  # still for rent on demand
    spec = {"name": "u", "command": "c", "resources": {"gpu": "H20", "gpus": 1}, "billing": "usage"}
    r = api.post(f"{API}/workloads", json={"spec": spec}, headers=t.headers)
    assert r.status_code == 422 and r.json()["detail"].startswith("resources.gpu: H20 has no usage price"), r.text
    assert _ok(api.post(f"{API}/quotes", json={**JOB, "billing_mode": "usage"}, headers=t.headers)) == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"floor": "1.5"}, "floor"), ({"floor": "-0.1"}, "floor"), ({"floor": 0.5}, "floor"),
        ({"gpu_hour": {"H20": "-1"}}, "gpu_hour"), ({"gpu_hour": {"H20": "1e6"}}, "gpu_hour"), ({}, "body"),
        ({"gpu_hour": {"nonsense": "1"}}, "gpu_hour.nonsense"), ({"gpu_hour": {"B200": "50"}}, "gpu_hour.B200"),
    ],
)  # fmt: skip
def test_bad_usage_prices_are_refused_naming_the_field_and_change_nothing(
    market: tuple[Any, dict[str, str], Tenant], body: dict[str, Any], field: str
) -> None:
    api, adm, t = market
    before = _book(api, t)
    if field == "gpu_hour.B200":  # B200 has no on-demand price in this book: usage is offered beside it
        _ok(api.put(f"{API}/admin/prices/gpus/B200", json={"remove": True}, headers=adm))
        before = _book(api, t)
    r = api.put(f"{API}/admin/prices/usage", json=body, headers=adm)
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"], r.text
    assert _book(api, t) == before


def test_a_usage_submission_holds_its_full_rate_and_keeps_its_idle_rate(
    market: tuple[Any, dict[str, str], Tenant],
) -> None:
    api, adm, t = market
    _ok(api.post(f"{API}/admin/orgs/{t.org_id}/transactions", json={"kind": "topup", "amount": "1000"}, headers=adm),
        201)  # fmt: skip
    spec = {"name": "u", "command": "c", "resources": {"gpu": "H20", "gpus": 2}, "billing": "usage"}
    w = _ok(api.post(f"{API}/workloads", json={"spec": spec}, headers=t.headers), 201)
    srv = api.app.state.server
    SchedulingPass().run(srv.db, utcnow())
    w = _ok(api.get(f"{API}/workloads/{w['id']}", headers=t.headers))
    assert w["allocation"]["billing_mode"] == "usage"
    assert Decimal(w["allocation"]["rate_per_hour"]) == 2 * Decimal("10.625")  # held and shown fully active
    with srv.db.read() as s:
        a = s.get_one(Allocation, w["allocation"]["id"])
        assert (a.floor_rate_per_hour, a.activity_permille_s, a.charged) == (Decimal("4.25"), 0, 0)
    metering.meter(srv.db, "t", a.started_at + timedelta(seconds=89))  # window 0 ends at 60 s: charged at 90 s
    with srv.db.read() as s:
        assert s.get_one(Allocation, a.id).metered_until_s == 0


@pytest.mark.parametrize(
    ("resources", "why"),
    [({"gpus": 0}, "CPU-only"), ({"gpu": "H100-SXM", "slice": "1g.10gb"}, "slice")],
)
def test_what_has_no_gpu_activity_of_its_own_cannot_be_billed_by_usage(
    market: tuple[Any, dict[str, str], Tenant], resources: dict[str, Any], why: str
) -> None:
    api, _, t = market
    spec = {"name": "u", "command": "c", "resources": resources, "billing": "usage"}
    for path in ("/workloads", "/quotes/workload"):
        r = api.post(f"{API}{path}", json={"spec": spec}, headers=t.headers)
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith("billing: usage is billed by whole GPUs") and why in r.json()["detail"]


# ---- the SDK and the CLI, against this same server --------------------------------------------------------------
@pytest.fixture
def as_admin(market: tuple[Any, dict[str, str], Tenant], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The CLI's and the SDK's Client talk to the in-process app, logged in as the operator."""
    api, adm, _ = market
    transport = forwarding(api)

    class Forwarded(Client):
        def __init__(self, server: str | None = None, token: str | None = None, **kw: Any) -> None:
            super().__init__(server, token, transport=transport)

    monkeypatch.setattr(suanli.client, "Client", Forwarded)
    monkeypatch.setenv("SUANLI_HOME", str(tmp_path / "cli-home"))
    monkeypatch.setenv("SUANLI_SERVER", "http://suanli.test")
    monkeypatch.setenv("SUANLI_TOKEN", adm["Authorization"].removeprefix("Bearer "))
    monkeypatch.setenv("COLUMNS", "240")
    return market


def test_the_sdk_and_the_cli_set_and_show_usage_prices_and_ranges(as_admin: Any, tmp_path: Path) -> None:
    _, adm, t = as_admin
    ops = suanli.client.Client("http://suanli.test", adm["Authorization"].removeprefix("Bearer "))
    tenant = suanli.client.Client("http://suanli.test", t.token)
    book = ops.admin_set_usage_prices({"H20": "12"}, floor="0.25")
    assert (book["usage_gpu_hour"]["H20"], book["usage_floor"]) == ("12.00000000", "0.25000000")
    with pytest.raises(TypeError):
        ops.admin_set_usage_prices(floor=0.3)  # type: ignore[arg-type]  # floats never carry money
    [offer] = tenant.offers()
    assert (offer.usage_per_gpu_hour, offer.usage_floor_per_gpu_hour) == (Decimal(12), Decimal(3))
    [q] = tenant.quote("llama3.1-8b", tokens=1e9, gpus=8, billing_mode="usage")
    assert (q.rate_per_hour, q.floor_rate_per_hour) == (Decimal(96), Decimal(24)) and q.floor_cost < q.cost
    [wq] = tenant.quote_workload("name: q\ncommand: x\nduration: 1h\nbilling: usage\nresources: {gpu: H20, gpus: 2}\n")
    assert (wq.rate_per_hour, wq.floor_rate_per_hour, wq.cost, wq.floor_cost) == (Decimal(24), Decimal(6),
                                                                                  Decimal(24), Decimal(6))  # fmt: skip

    out = invoke(["admin", "prices", "set-usage", "H20", "10", "--floor", "0.3"]).stdout
    assert "H20 10.00 CNY/GPU-hour fully active" in out and "an idle GPU-hour costs 0.30000000" in out
    assert "10.00 (3.00)" in invoke(["admin", "prices"]).stdout
    assert "3.00-10.00" in invoke(["offers"]).stdout
    out = invoke(["quote", "--model", "llama3.1-8b", "--tokens", "1e9", "--gpus", "8", "--usage"]).stdout
    assert "by usage" in out and "24.00-80.00" in out
    spec = tmp_path / "u.yaml"
    spec.write_text("name: u\ncommand: x\nduration: 2h\nbilling: usage\nresources: {gpu: H20, gpus: 2}\n")
    out = invoke(["quote", "--spec", str(spec)]).stdout
    assert "6.00-20.00" in out and "12.00-40.00" in out  # per hour, and for its 2 hours
    assert "no longer billed by usage" in invoke(["admin", "prices", "set-usage", "H20", "none"]).stdout
    assert '"usage_per_gpu_hour": null' in invoke(["offers", "--json"]).stdout
    for args, why in ((["H20"], "GPU and PRICE together"), ([], "give GPU PRICE, --floor"),
                      (["H20", "ten"], "invalid PRICE 'ten'"), (["--floor", "x"], "--floor")):  # fmt: skip
        assert why in invoke(["admin", "prices", "set-usage", *args], code=EXIT_BAD_INPUT).stderr
    bad = invoke(["admin", "prices", "set-usage", "--floor", "2"], code=EXIT_BAD_INPUT)
    assert "floor" in bad.stderr  # the server's bound, by name
    assert "at most one of --spot and --usage" in invoke(
        ["quote", "--model", "llama3.1-8b", "--tokens", "1e9", "--spot", "--usage"], code=EXIT_BAD_INPUT).stderr  # fmt: skip


# ---- the migration --------------------------------------------------------------------------------------------
def test_migration_0014_adds_usage_columns_keeping_allocations_billed_by_time(empty_db_url: str) -> None:
    """Plain ADD COLUMNs on a database with money in it: old allocations are not billed by usage (no floor rate, no
    activity) and keep their rate; down and up again keeps the rows."""
    from alembic import command

    from suanli.db.migrate import alembic_config

    db = Database(empty_db_url)
    try:
        migrate(db.engine, "0012")
        with db.engine.begin() as c:
            c.execute(text("INSERT INTO orgs (id, name, personal, created_at) VALUES ('o', 'o', true, :t)"),
                      {"t": "2026-01-01 00:00:00"})  # fmt: skip
            c.execute(text("INSERT INTO users (id, email, password_hash, is_admin, personal_org_id, created_at) "
                           "VALUES ('u', 'u@example.com', 'x', false, 'o', :t)"), {"t": "2026-01-01 00:00:00"})  # fmt: skip
            c.execute(
                text("INSERT INTO allocations (id, org_id, user_id, workload, gpu_model, gpus, milli, billing_mode, "
                     "rate_per_hour, placement, started_at, metered_until_s, settled, charged) VALUES ('a', 'o', 'u', "
                     "'w', 'H20', 2, 1000, 'on-demand', :rate, '{}', :t, 60, false, :charged)"),
                {"t": "2026-01-01 00:00:00", "rate": 17.5 if db.engine.dialect.name != "sqlite" else 1_750_000_000,
                 "charged": Decimal("0.29166667") if db.engine.dialect.name != "sqlite" else 29_166_667},
            )  # fmt: skip
        migrate(db.engine, "0014")
        with db.read() as s:
            a = s.get_one(Allocation, "a")
            assert (a.rate_per_hour, a.charged, a.floor_rate_per_hour, a.activity_permille_s) == (
                Decimal("17.5"), Decimal("0.29166667"), None, 0)  # fmt: skip
        command.downgrade(alembic_config(db.engine), "0012")
        with db.engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM allocations")).scalar_one() == 1
        migrate(db.engine)
        with db.read() as s:
            assert s.get_one(Allocation, "a").activity_permille_s == 0
    finally:
        db.dispose()
