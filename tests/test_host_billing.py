"""Host CPU and memory on the server, both databases: allocations priced GPUs + cores x core-hour + GiB x GiB-hour
and charged by the second; org quotas for cores and memory refused by name at submission and at placement; the
prices in offers, quotes, the SDK and the CLI; books stored before host prices; the migration that adds them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text

import suanli.client
from suanli.billing.ledger import org_account
from suanli.billing.metering import cost_of
from suanli.cli.common import EXIT_BAD_INPUT
from suanli.client import Client, Offer, WorkloadQuote
from suanli.control.ids import utcnow
from suanli.control.money import metering
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.db.engine import Database
from suanli.db.migrate import migrate
from suanli.db.models import Allocation, LedgerEntry, LedgerTransaction, PriceBookVersion
from tests.cli_helpers import invoke
from tests.control_plane import Tenant, admin_token, bearer, signup

API = "/api/v1"


@dataclass
class Market:
    api: TestClient
    admin: dict[str, str]
    tenant: Tenant

    @property
    def db(self) -> Database:
        return self.api.app.state.server.db  # type: ignore[attr-defined,no-any-return]

    def call(self, method: str, path: str, body: Any = None, *, admin: bool = False, status: int = 200) -> Any:
        r = self.api.request(method, f"{API}{path}", json=body, headers=self.admin if admin else self.tenant.headers)
        assert r.status_code == status, r.text
        return r.json()

    def submit(self, spec: dict[str, Any], status: int = 201) -> Any:
        return self.call("POST", "/workloads", {"spec": spec}, status=status)

    def place(self, at: Any = None) -> Any:
        """One scheduling pass at `at` (default now): places what fits, opening allocations at that moment."""
        now = at or utcnow()
        SchedulingPass().run(self.db, now)
        return now

    def allocation(self, workload_id: str) -> Allocation:
        with self.db.read() as s:
            return s.scalars(select(Allocation).where(Allocation.workload == workload_id)).one()


@pytest.fixture
def market(api: TestClient) -> Market:
    """16 virtual H20 GPUs (CPU-only work goes to a virtual node: no local host), a tenant with ¥1,000."""
    admin = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20"}, headers=admin).status_code == 201
    m = Market(api, admin, signup(api, "tenant@example.com"))
    m.call("POST", f"/admin/orgs/{m.tenant.org_id}/transactions", {"kind": "topup", "amount": "990"}, admin=True,
           status=201)  # fmt: skip
    return m


def cpu_job(name: str, **resources: Any) -> dict[str, Any]:
    return {"name": name, "command": "x", "duration": 3600, "resources": {"gpus": 0, **resources}}


# ---- the rate and the charges -----------------------------------------------------------------------------------
def test_a_cpu_only_job_is_charged_its_cores_and_memory_by_the_second(market: Market) -> None:
    book = market.call("PUT", "/admin/prices/host", {"cpu_core_hour": "0.07", "memory_gib_hour": "0.013"}, admin=True)
    assert (book["cpu_core_hour"], book["memory_gib_hour"]) == ("0.07000000", "0.01300000")
    assert book["gpu_hour"]["H20"] == "8.50000000"  # the rest of the book is kept
    w = market.submit(cpu_job("crunch", cpus=3, memory="1536Mi"))
    t0 = market.place()
    placed = market.call("GET", f"/workloads/{w['id']}")
    a = placed["allocation"]
    # 3 x 0.07 + 1.5 x 0.013 = 0.2295 an hour, all of it host
    assert (a["cpu_milli"], a["memory_mib"], a["rate_per_hour"], a["host_rate_per_hour"]) == (
        3000, 1536, "0.22950000", "0.22950000")  # fmt: skip
    assert "no GPUs with 3 cores, 1.5 GiB on" in placed["events"][-1]["reason"]
    before = Decimal(market.call("GET", f"/orgs/{market.tenant.org_id}/balance")["exact"])
    with market.db.write() as s, s.begin():
        metering.close_allocation(s, a["id"], t0 + timedelta(seconds=125.6))
    metering.meter(market.db, "test", t0 + timedelta(seconds=300), window_s=60)
    row = market.allocation(w["id"])
    with market.db.read() as s:
        posted = s.scalars(
            select(LedgerEntry.amount).join(LedgerTransaction)
            .where(LedgerTransaction.allocation_id == a["id"], LedgerEntry.account == org_account(market.tenant.org_id))
        ).all()  # fmt: skip
    expected = (Decimal("0.2295") * 126 / 3600).quantize(Decimal("0.00000001"))  # 125.6 s: 126 to the nearest second
    assert (row.settled, row.metered_until_s, row.charged) == (True, 126, expected)
    assert expected == cost_of(Decimal("0.2295"), 126) == Decimal("0.00803250")
    assert len(posted) == 3 and -sum(posted, Decimal(0)) == expected  # windows 0-60, 60-120, 120-126
    after = Decimal(market.call("GET", f"/orgs/{market.tenant.org_id}/balance")["exact"])
    assert before - after == expected
    [usage] = market.call("GET", f"/orgs/{market.tenant.org_id}/usage")
    assert (usage["cpu_milli"], usage["memory_mib"], usage["host_rate_per_hour"], usage["cost"]) == (
        3000, 1536, "0.22950000", "0.00803250")  # fmt: skip


def test_cpu_only_work_that_asks_nothing_gets_and_pays_for_one_core_and_2_gib(market: Market) -> None:
    w = market.submit(cpu_job("small"))
    assert (w["spec"]["resources"]["cpus"], w["spec"]["resources"]["memory"]) == (1.0, "2Gi")  # stored: describe
    market.place()
    a = market.call("GET", f"/workloads/{w['id']}")["allocation"]
    assert (a["cpu_milli"], a["memory_mib"], a["rate_per_hour"]) == (1000, 2048, "0.15000000")
    assert Decimal(market.call("GET", f"/orgs/{market.tenant.org_id}/balance")["held_per_hour"]) == Decimal("0.15")


def test_gpu_work_pays_for_the_host_share_it_asks_for_with_the_spot_factor_too(market: Market) -> None:
    jobs = {
        "spot": {"gpu": "H20", "gpus": 2, "cpus": 8, "memory": "32Gi"},  # (17.00 + 0.80 + 0.80) x 0.40
        "demand": {"gpu": "H20", "gpus": 1, "cpus": 2},  # 8.50 + 0.20
        "bare": {"gpu": "H20", "gpus": 1},  # asks no host: its GPU's price only
    }
    ids = {}
    for name, res in jobs.items():
        spec = {"name": name, "command": "x", "duration": 600, "resources": res}
        ids[name] = market.submit({**spec, "billing": "spot"} if name == "spot" else spec)["id"]
    market.place()
    got = {n: market.allocation(i) for n, i in ids.items()}
    assert {n: (a.rate_per_hour, a.host_rate_per_hour, a.cpu_milli, a.memory_mib) for n, a in got.items()} == {
        "spot": (Decimal("7.44"), Decimal("0.64"), 8000, 32768),
        "demand": (Decimal("8.70"), Decimal("0.20"), 2000, 0),
        "bare": (Decimal("8.50"), Decimal(0), 0, 0),
    }
    assert all(isinstance(a.rate_per_hour, Decimal) for a in got.values())


def test_a_price_ceiling_counts_the_host_part(market: Market) -> None:
    r = market.submit({**cpu_job("pricey", cpus=4), "max_price_per_hour": "0.4"}, status=422)  # 0.40 + 0.05
    assert r["detail"].startswith("max_price_per_hour: 4 cores, 2 GiB cost 0.45/h"), r
    gpu = {"name": "g", "command": "x", "max_price_per_hour": "8.55", "resources": {"gpu": "H20", "gpus": 1, "cpus": 1}}
    assert market.submit(gpu, status=422)["detail"].startswith("max_price_per_hour: 1 x H20 with 1 core, 0 GiB")


# ---- quotas ----------------------------------------------------------------------------------------------------
def test_core_and_memory_quotas_refuse_by_name_at_submission_and_at_placement(market: Market) -> None:
    org = market.tenant.org_id
    o = market.call("PUT", f"/admin/orgs/{org}/quota", {"cpus": 2}, admin=True)
    assert (o["quota_gpus"], o["quota_cpus"], o["quota_memory_gib"]) == (None, 2, None)
    r = market.submit(cpu_job("wide", cpus=4), status=409)
    assert r["detail"] == "resources.cpus: tenant@example.com may hold 2 CPU cores at once; this asks for 4"
    o = market.call("PUT", f"/admin/orgs/{org}/quota", {"memory_gib": 1}, admin=True)
    assert (o["quota_cpus"], o["quota_memory_gib"]) == (2, 1)  # only what the body names changes
    r = market.submit(cpu_job("default"), status=409)  # 2 GiB by default
    assert r["detail"] == "resources.memory: tenant@example.com may hold 1 GiB of memory at once; this asks for 2 GiB"
    gpu = {"name": "g", "command": "x", "resources": {"gpu": "H20", "gpus": 1, "cpus": 3}}
    assert market.submit(gpu, status=409)["detail"].startswith("resources.cpus: ")  # GPU work's host share counts

    o = market.call("PUT", f"/admin/orgs/{org}/quota", {"cpus": 3, "memory_gib": None}, admin=True)
    assert (o["quota_cpus"], o["quota_memory_gib"]) == (3, None)
    first, second = market.submit(cpu_job("first", cpus=2)), market.submit(cpu_job("second", cpus=2))
    market.place()
    states = {w["id"]: market.call("GET", f"/workloads/{w['id']}") for w in (first, second)}
    assert states[first["id"]]["state"] == "scheduled"
    waiting = states[second["id"]]
    assert waiting["state"] == "pending"
    assert waiting["pending"]["reason"] == (
        "waiting for quota: tenant@example.com may hold 3 CPU cores at once; it holds 2, asks 2 (counting its work "
        "queued ahead)"
    )
    o = market.call("PUT", f"/admin/orgs/{org}/quota", {"gpus": 4}, admin=True)
    assert (o["quota_gpus"], o["quota_cpus"]) == (4, 3)


# ---- prices in force, offers and quotes ----------------------------------------------------------------------------
def test_a_price_book_stored_before_host_prices_still_loads_with_the_defaults(market: Market) -> None:
    old = {"currency": "CNY", "gpu_hour": {"H20": "9.00"}, "spot_factor": "0.40", "slice_premium": "1.10",
           "storage_gb_month": "0.30", "plans": {}}  # fmt: skip
    with market.db.write() as s, s.begin():
        s.add(PriceBookVersion(body=old, created_at=utcnow(), created_by=None))
    book = market.call("GET", "/prices")
    assert (book["gpu_hour"], book["cpu_core_hour"], book["memory_gib_hour"]) == (
        {"H20": "9.00000000"}, "0.10000000", "0.02500000")  # fmt: skip
    [q] = market.call("POST", "/quotes/workload", {"spec": cpu_job("q")})
    assert q["rate_per_hour"] == "0.15000000"
    w = market.submit(cpu_job("runs"))
    market.place()
    assert market.allocation(w["id"]).rate_per_hour == Decimal("0.15")


def test_offers_and_quotes_show_and_include_the_host_prices(market: Market) -> None:
    [h20] = market.call("GET", "/offers")
    assert (h20["cpu_per_core_hour"], h20["memory_per_gib_hour"]) == ("0.10000000", "0.02500000")

    base = {"model": "llama3.1-8b", "tokens": 1e9, "gpus": 8}
    [bare] = market.call("POST", "/quotes", base)
    [hosted] = market.call("POST", "/quotes", {**base, "cpus_per_gpu": 4, "memory_per_gpu": "16Gi"})
    assert (bare["rate_per_hour"], bare["host_rate_per_hour"]) == ("68.00000000", "0.00000000")
    assert (hosted["rate_per_hour"], hosted["host_rate_per_hour"]) == ("74.40000000", "6.40000000")  # 8 x (0.4+0.4)
    assert Decimal(hosted["cost"]) > Decimal(bare["cost"])

    [cpu] = market.call("POST", "/quotes/workload", {"spec": {**cpu_job("q", cpus=2, memory="3Gi"), "duration": "2h"}})
    assert cpu == {"gpu": None, "gpus": 0, "cpu_milli": 2000, "memory_mib": 3072, "billing_mode": "on-demand",
                   "gpu_rate_per_hour": "0.00000000", "host_rate_per_hour": "0.27500000",
                   "rate_per_hour": "0.27500000", "duration_s": 7200.0, "cost": "0.55000000", "currency": "CNY",
                   "floor_rate_per_hour": None, "floor_cost": None}  # fmt: skip
    spot = {"name": "s", "command": "x", "billing": "spot", "max_duration": "30m",
            "resources": {"gpu": "H20", "gpus": 2, "cpus": 4}}  # fmt: skip
    [q] = market.call("POST", "/quotes/workload", {"spec_yaml": json.dumps(spot)})  # JSON is YAML
    assert (q["gpu"], q["gpu_rate_per_hour"], q["host_rate_per_hour"], q["rate_per_hour"], q["cost"]) == (
        "H20", "6.80000000", "0.16000000", "6.96000000", "3.48000000")  # fmt: skip
    forever = market.call(
        "POST", "/quotes/workload", {"spec": {"name": "i", "kind": "instance", "resources": {"gpus": 0}}}
    )
    assert (forever[0]["duration_s"], forever[0]["cost"]) == (None, None)
    r = market.call("POST", "/quotes/workload", {"spec": {**spot, "resources": {"gpu": "B200"}}}, status=422)
    assert r["detail"].startswith("resources.gpu: no registered node has B200")


# ---- the SDK and the CLI, against this same server --------------------------------------------------------------
def forwarding(api: TestClient) -> httpx.MockTransport:
    """An httpx transport that hands each request to the in-process app."""

    def handle(request: httpx.Request) -> httpx.Response:
        headers = {
            k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type", "if-match")
        }
        r = api.request(request.method, request.url.path, params=request.url.params, content=request.content,
                        headers=headers)  # fmt: skip
        return httpx.Response(r.status_code, headers={"content-type": r.headers.get("content-type", "")},
                              content=r.content)  # fmt: skip

    return httpx.MockTransport(handle)


@pytest.fixture
def as_admin(market: Market, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Market]:
    """The CLI's and the SDK's Client talk to the in-process app, logged in as the operator."""
    transport = forwarding(market.api)

    class Forwarded(Client):
        def __init__(self, server: str | None = None, token: str | None = None, **kw: Any) -> None:
            super().__init__(server, token, transport=transport)

    monkeypatch.setattr(suanli.client, "Client", Forwarded)
    monkeypatch.setenv("SUANLI_HOME", str(tmp_path / "cli-home"))
    monkeypatch.setenv("SUANLI_SERVER", "http://suanli.test")
    monkeypatch.setenv("SUANLI_TOKEN", market.admin["Authorization"].removeprefix("Bearer "))
    monkeypatch.setenv("COLUMNS", "220")
    yield market


def test_the_sdk_sets_reads_and_quotes_host_prices(as_admin: Market) -> None:
    m = as_admin
    ops = suanli.client.Client("http://suanli.test", m.admin["Authorization"].removeprefix("Bearer "))
    tenant = suanli.client.Client("http://suanli.test", m.tenant.token)
    book = ops.admin_set_host_prices(cpu_core_hour="0.2")
    assert (book["cpu_core_hour"], book["memory_gib_hour"]) == ("0.20000000", "0.02500000")
    with pytest.raises(TypeError):
        ops.admin_set_host_prices(memory_gib_hour=0.1)  # type: ignore[arg-type]  # floats never carry money
    [offer] = tenant.offers()
    assert isinstance(offer, Offer) and (offer.cpu_per_core_hour, offer.memory_per_gib_hour) == (
        Decimal("0.2"), Decimal("0.025"))  # fmt: skip
    [q] = tenant.quote_workload("name: q\ncommand: x\nduration: 1h\nresources: {gpus: 0, cpus: 2}\n")
    assert isinstance(q, WorkloadQuote) and (q.gpu, q.rate_per_hour, q.cost) == (None, Decimal("0.45"), Decimal("0.45"))
    [tq] = tenant.quote("llama3.1-8b", tokens=1e9, gpus=8, cpus_per_gpu="1.5", memory_per_gpu="8Gi")
    assert tq.host_rate_per_hour == Decimal("4.0")  # 8 x (1.5 x 0.2 + 8 x 0.025)
    org = ops.admin_set_quota(m.tenant.email, cpus=64, memory_gib=512)
    assert (org.quota_gpus, org.quota_cpus, org.quota_memory_gib) == (None, 64, 512)
    org = ops.admin_set_quota(m.tenant.email, 8)
    assert (org.quota_gpus, org.quota_cpus, org.quota_memory_gib) == (8, 64, 512)
    assert ops.admin_set_quota(m.tenant.email, memory_gib=None).quota_memory_gib is None
    w = tenant.submit({"name": "w", "command": "x", "resources": {"gpus": 0, "cpus": 2}})
    m.place()
    alloc = tenant.workload(w.id).allocation
    assert alloc is not None and (alloc.cpu_milli, alloc.memory_mib, alloc.host_rate_per_hour) == (
        2000, 2048, Decimal("0.45"))  # fmt: skip


def test_the_cli_sets_and_retires_one_plan_and_loads_a_book_only_over_the_version_it_was_made_from(
    as_admin: Market, tmp_path: Path
) -> None:
    out = invoke(["admin", "prices", "plan", "set", "季付", "--hours", "2160", "--discount", "0.15"]).stdout
    assert "季付: 2160 h at 15% off" in out
    book = json.loads(invoke(["admin", "prices", "--json"]).stdout)
    assert book["plans"]["季付"] == {"hours": 2160, "discount": "0.15"}, book["plans"]
    bad = invoke(["admin", "prices", "plan", "set", "x", "--hours", "0", "--discount", "0.1"], code=EXIT_BAD_INPUT)
    assert "hours" in bad.stderr  # the server's bound, by name
    assert "季付" in invoke(["admin", "prices", "plan", "retire", "季付"]).stdout
    assert "季付" not in json.loads(invoke(["admin", "prices", "--json"]).stdout)["plans"]
    assert "no plan" in invoke(["admin", "prices", "plan", "retire", "季付"], code=EXIT_BAD_INPUT).stderr.lower()

    # a book dumped, edited and loaded replaces the version it was dumped from, and nothing newer
    dumped = json.loads(invoke(["admin", "prices", "--json"]).stdout)
    dumped["gpu_hour"]["H20"] = "7.77"
    path = tmp_path / "book.json"
    path.write_text(json.dumps(dumped))
    invoke(["admin", "prices", "set", "H100", "21.00"])  # another operator's edit, made since the dump
    stale = invoke(["admin", "prices", "load", str(path)], code=EXIT_BAD_INPUT).stderr
    assert f"version {dumped['version']}" in stale and "--force" in stale, stale
    now = json.loads(invoke(["admin", "prices", "--json"]).stdout)
    assert now["gpu_hour"].get("H100-SXM") == "21.00000000" and now["gpu_hour"]["H20"] != "7.77000000", now["gpu_hour"]
    assert "GPU models priced" in invoke(["admin", "prices", "load", str(path), "--force"]).stdout
    assert json.loads(invoke(["admin", "prices", "--json"]).stdout)["gpu_hour"]["H20"] == "7.77000000"
    fresh = json.loads(invoke(["admin", "prices", "--json"]).stdout)
    path.write_text(json.dumps({**fresh, "spot_factor": "0.5"}))
    assert "GPU models priced" in invoke(["admin", "prices", "load", str(path)]).stdout  # made from the book in force
    assert "--if-version" in invoke(["admin", "prices", "load", str(path), "--if-version", "1", "--force"],
                                    code=EXIT_BAD_INPUT).stderr  # fmt: skip


def test_the_cli_sets_and_shows_host_prices_quotas_and_quotes(as_admin: Market, tmp_path: Path) -> None:
    m = as_admin
    out = invoke(["admin", "prices", "set-host", "--cpu-core-hour", "0.12", "--memory-gib-hour", "0.03"]).stdout
    assert "CPU 0.12 CNY/core-hour, memory 0.03 CNY/GiB-hour" in out
    assert "host: CPU 0.12/core-hour, memory 0.03/GiB-hour" in invoke(["admin", "prices"]).stdout
    assert "host CPU 0.12 CNY per core-hour, memory 0.03 CNY per GiB-hour" in invoke(["offers"]).stdout
    bad = invoke(["admin", "prices", "set-host", "--cpu-core-hour", "-1"], code=EXIT_BAD_INPUT)
    assert "--cpu-core-hour" in bad.stderr
    bad = invoke(["admin", "prices", "set-host", "--memory-gib-hour", "1e9"], code=EXIT_BAD_INPUT)
    assert "memory_gib_hour" in bad.stderr  # the server's bound, by name
    assert "give --cpu-core-hour" in invoke(["admin", "prices", "set-host"], code=EXIT_BAD_INPUT).stderr

    out = invoke(["admin", "quotas", "set", m.tenant.email, "--cpus", "64", "--memory-gib", "256"]).stdout
    assert "GPU quota none, CPU quota 64 cores, memory quota 256 GiB" in out
    out = invoke(["admin", "quotas", "set", m.tenant.email, "16", "--memory-gib", "none"]).stdout
    assert "GPU quota 16, CPU quota 64 cores, memory quota none" in out
    assert "--cpus" in invoke(["admin", "quotas", "set", m.tenant.email, "--cpus", "many"], code=EXIT_BAD_INPUT).stderr
    assert "64 cores" in invoke(["admin", "orgs"]).stdout

    spec = tmp_path / "cpu.yaml"
    spec.write_text("name: crunch\ncommand: x\nduration: 2h\nresources: {gpus: 0, cpus: 4, memory: 8Gi}\n")
    out = invoke(["quote", "--spec", str(spec)]).stdout
    assert "- (CPU only)" in out and "4 cores, 8 GiB" in out and "0.72" in out and "1.44" in out  # 0.48+0.24 /h
    assert invoke(["quote", "--spec", str(spec), "--json"]).stdout.count('"rate_per_hour": "0.72000000"') == 1
    assert "exactly one of --model" in invoke(["quote"], code=EXIT_BAD_INPUT).stderr
    out = invoke(["quote", "--model", "llama3.1-8b", "--tokens", "1e9", "--gpus", "8", "--cpus-per-gpu", "2"]).stdout
    assert "host/h" in out and "1.92" in out  # 8 x 2 x 0.12


# ---- the migration --------------------------------------------------------------------------------------------
def test_migration_0008_adds_host_columns_keeping_allocations_and_their_rates(empty_db_url: str) -> None:
    """Plain ADD COLUMNs on a database with money in it: old allocations hold no host CPU or memory on the bill
    (0), keep their rate, and orgs get no host quota; down and up again keeps the rows."""
    from alembic import command

    from suanli.db.migrate import alembic_config

    db = Database(empty_db_url)
    try:
        migrate(db.engine, "0007")
        with db.engine.begin() as c:
            c.execute(text("INSERT INTO orgs (id, name, personal, quota_gpus, created_at) "
                           "VALUES ('o', 'o', true, 8, :t)"), {"t": "2026-01-01 00:00:00"})  # fmt: skip
            c.execute(text("INSERT INTO users (id, email, password_hash, is_admin, personal_org_id, created_at) "
                           "VALUES ('u', 'u@example.com', 'x', false, 'o', :t)"), {"t": "2026-01-01 00:00:00"})  # fmt: skip
            c.execute(
                text("INSERT INTO allocations (id, org_id, user_id, workload, gpu_model, gpus, milli, billing_mode, "
                     "rate_per_hour, placement, started_at, metered_until_s, settled, charged) VALUES ('a', 'o', 'u', "
                     "'w', 'H20', 2, 1000, 'on-demand', 17.5, '{}', :t, 60, false, 0.29166667)"),
                {"t": "2026-01-01 00:00:00"},
            )  # fmt: skip
        migrate(db.engine, "0008")  # (0012 then turns SQLite's REALs into integer units: tests/test_money_exact.py)

        def rows() -> tuple[Any, Any]:
            with db.engine.connect() as c:
                a = c.execute(text("SELECT rate_per_hour, charged, cpu_milli, memory_mib, host_rate_per_hour "
                                   "FROM allocations")).one()  # fmt: skip
                o = c.execute(text("SELECT quota_gpus, quota_cpus, quota_memory_gib FROM orgs")).one()
            return tuple(a), tuple(o)

        a, o = rows()
        money = [Decimal(str(v)) for v in (a[0], a[1], a[4])]  # raw SQL: SQLite hands back floats
        assert (money[0], money[1], a[2], a[3], money[2]) == (
            Decimal("17.5"), Decimal("0.29166667"), 0, 0, 0)  # fmt: skip
        assert o == (8, None, None)
        command.downgrade(alembic_config(db.engine), "0007")
        with db.engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM allocations")).scalar_one() == 1
        migrate(db.engine)
        assert rows()[0][2:4] == (0, 0)
    finally:
        db.dispose()
