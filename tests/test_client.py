"""The Python SDK (`suanli.Client`) end to end: a real `suanli server` process, real HTTP, both databases."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

import suanli
from suanli.client import ApiError, Balance, Client, jsonable, load
from suanli.control.money.usage_statement import STATEMENT_FIELDS
from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, free_port, live_server
from tests.sqlite_only import sqlite_db_url  # noqa: F401  (the SDK's subject is not the database)

PRESET = "h20-roce800-128"


def _status(call: object) -> ApiError:
    """The ApiError a zero-argument call raises (it must raise one)."""
    with pytest.raises(ApiError) as e:
        call()  # type: ignore[operator]
    assert str(e.value) == e.value.message and e.value.message
    return e.value


def test_tenant_journey(db_url: str, tmp_path: Path) -> None:
    with (
        live_server(tmp_path / "home", db_url) as srv,
        Client(srv.url) as alice,
        Client(srv.url) as bob,
        Client(srv.url) as ops,
    ):
        s = alice.signup("Alice@Example.com", "alice-password")
        assert (s.balance, s.currency, s.user.email) == (Decimal("10.00"), "CNY", "alice@example.com")
        assert alice.token == s.token and s.token.startswith("sl_") and s.token not in repr(s)
        me = alice.me()
        assert me.user.id == s.user.id and [o.id for o in me.orgs] == [s.org.id] == [me.user.personal_org_id]
        bal = alice.balance()
        assert (bal.org_id, bal.balance, bal.exact, bal.held_per_hour) == (s.org.id, Decimal("10"), Decimal("10"), 0)

        # offers appear once an operator registers capacity
        assert alice.offers() == []
        ops.login(ADMIN_EMAIL, ADMIN_PASSWORD)
        cluster = ops.admin_register_cluster(preset=PRESET)
        assert (cluster.name, cluster.nodes, cluster.gpus) == (PRESET, 16, 128)
        [h20] = alice.offers()
        book = alice.prices()
        assert (h20.gpu, h20.total, h20.free, h20.nodes) == ("H20", 128, 128, 16)
        assert h20.on_demand_per_gpu_hour == Decimal(book["gpu_hour"]["H20"]) > 0
        assert h20.spot_per_gpu_hour == h20.on_demand_per_gpu_hour * Decimal(book["spot_factor"])

        # quotes: feasible, ranked, and priced at the offer's rate
        cheapest = alice.quote("llama3.1-8b", tokens=1e9, limit=5)
        assert 1 < len(cheapest) <= 5
        assert [q.cost for q in cheapest] == sorted(q.cost for q in cheapest)
        for q in cheapest:
            assert (q.cluster, q.gpu, q.currency) == (PRESET, "H20", "CNY") and q.gpus <= h20.free
            assert q.rate_per_hour == h20.on_demand_per_gpu_hour * q.gpus
            assert abs(q.cost - q.rate_per_hour * Decimal(str(q.total_time_s)) / 3600) <= Decimal("0.05")
            assert q.plan["dp"] * q.plan["tp"] * q.plan["pp"] * q.plan["cp"] == q.gpus
        fastest = alice.quote("llama3.1-8b", steps=100, rank="fastest", limit=3)
        assert [q.total_time_s for q in fastest] == sorted(q.total_time_s for q in fastest)
        assert {q.gpus for q in alice.quote("llama3.1-8b", tokens=1e9, gpus=8)} == {8}
        spot = alice.quote("llama3.1-8b", tokens=1e9, gpus=8, billing_mode="spot")
        assert spot[0].rate_per_hour == h20.spot_per_gpu_hour * 8
        bad = _status(lambda: alice.quote("nope", tokens=1e9))
        assert bad.status == 422 and bad.message.startswith("model:")
        assert _status(lambda: alice.quote("llama3.1-8b", tokens=-1)).errors[0]["loc"][-1] == "tokens"

        # API tokens: create, use, list, revoke; a revoked token is refused
        t = alice.tokens_create("ci", expires_in_days=7)
        assert t.token.startswith(t.prefix) and t.expires_at is not None and t.revoked_at is None
        with Client(srv.url, t.token) as ci:
            assert ci.me().user.id == s.user.id
            assert t.id in {x.id for x in alice.tokens_list()}
            assert alice.tokens_revoke(t.id).revoked_at is not None
            assert _status(ci.me).status == 401
        assert _status(lambda: alice.tokens_revoke("tok_missing")).status == 404

        # tenant isolation: another tenant cannot even see that alice's org exists
        b = bob.signup("bob@example.com", "bob-password")
        for call in (lambda: bob.balance(s.org.id), lambda: bob.transactions(s.org.id), lambda: bob.usage(s.org.id)):
            err = _status(call)
            assert err.status == 404 and s.org.id in err.message
        assert _status(bob.admin_users).status == 403

        # a team org shares its balance with its members
        team = alice.org_create("lab")
        assert (team.personal, team.role) == (False, "owner")
        sent = alice.invite(team.id, "bob@example.com", monthly_spend_limit="50")
        assert (sent.role, sent.state, sent.monthly_spend_limit) == ("member", "pending", Decimal(50)) and sent.code
        assert [i.id for i in alice.invitations(team.id)] == [sent.id] and "code" not in repr(sent)
        assert _status(lambda: bob.balance(team.id)).status == 404, "not a member before accepting"
        assert [(i.id, i.org_name, i.invited_by) for i in bob.invitations()] == [(sent.id, "lab", "alice@example.com")]
        assert bob.accept(sent.id).role == "member"
        assert {m.email for m in alice.members(team.id)} == {"alice@example.com", "bob@example.com"}
        assert bob.balance(team.id).balance == 0 and team.id in {o.id for o in bob.orgs()}
        assert _status(lambda: bob.invite(team.id, "carol@example.com")).status == 403
        m = alice.member_set(team.id, b.user.id, role="viewer")
        assert (m.role, m.monthly_spend_limit, m.month_to_date) == ("viewer", Decimal(50), Decimal(0))
        assert alice.member_set(team.id, b.user.id, monthly_spend_limit=None).monthly_spend_limit is None
        declined = alice.invite(team.id, "carol@example.com")
        assert alice.invitation_cancel(team.id, declined.id).state == "cancelled"
        alice.member_remove(team.id, b.user.id)
        assert _status(lambda: bob.balance(team.id)).status == 404

        # an operator top-up with an idempotency key posts once, however often it is retried
        first = ops.admin_move("alice@example.com", "25.50", memo="invoice 7", key="pay-1")
        again = ops.admin_move(s.org.id, Decimal("25.50"), memo="invoice 7", key="pay-1")
        assert first.id == again.id and first.amount == Decimal("25.50") and first.kind == "topup"
        assert alice.balance().balance == Decimal("35.50")
        kinds = [x.kind for x in alice.transactions()]
        assert sorted(kinds) == ["topup", "trial_credit"]
        with pytest.raises(TypeError):
            ops.admin_move(s.org.id, 1.5)  # type: ignore[arg-type]

        # usage statements: nothing ran yet, so the CSV is its header
        assert alice.usage() == []
        assert alice.usage_csv().splitlines() == [",".join(STATEMENT_FIELDS)]
        assert alice.usage_csv(user_id=s.user.id, since="2020-01-01T00:00:00").startswith("allocation,")

        # logging out revokes the token the client carried
        old = alice.token
        alice.logout()
        assert alice.token is None
        with Client(srv.url, old) as stale:
            assert _status(stale.me).status == 401
        assert _status(alice.me).status == 401  # no token at all


def test_operator_routes(db_url: str, tmp_path: Path) -> None:
    with live_server(tmp_path / "home", db_url) as srv, Client(srv.url) as ops:
        ops.login(ADMIN_EMAIL, ADMIN_PASSWORD)
        assert ops.health()["status"] == "ok"

        # users and orgs
        u = ops.admin_create_user("dev@example.com", "dev-password", trial_credit=True)
        assert not u.is_admin and u.email in {x.email for x in ops.admin_users()}
        assert ops.admin_set_admin(u.id, True).is_admin
        assert _status(lambda: ops.admin_create_user("dev@example.com", "dev-password")).status == 409
        assert {o.name for o in ops.admin_orgs()} >= {ADMIN_EMAIL, "dev@example.com"}
        assert ops.admin_set_quota("dev@example.com", 16).quota_gpus == 16
        assert ops.admin_set_quota(u.personal_org_id, None).quota_gpus is None
        assert _status(lambda: ops.admin_set_quota("nobody@example.com", 1)).status == 404
        credit = ops.admin_move("dev@example.com", 5, kind="credit")
        refund = ops.admin_move("dev@example.com", "2", kind="refund", memo="outage")
        assert credit.id != refund.id and (credit.amount, refund.amount) == (5, 2)
        with Client(srv.url) as dev:
            dev.login("dev@example.com", "dev-password")
            assert dev.balance().balance == Decimal("17.00")  # trial 10 + credit 5 + refund 2
        check = ops.admin_ledger_check()
        assert check.ok and check.mismatches == {}

        # prices: one GPU, then the whole book
        book = ops.admin_set_gpu_price("H20", "9.00")
        assert Decimal(book["gpu_hour"]["H20"]) == Decimal("9.00") and book["version"] == ops.prices()["version"]
        assert "H20" not in ops.admin_set_gpu_price("H20", remove=True)["gpu_hour"]
        assert _status(lambda: ops.admin_set_gpu_price("Z100", "1")).message.startswith("gpu:")
        read = ops.prices()
        replaced = ops.admin_set_prices({**read, "gpu_hour": {"h20": "7.25"}}, if_version=read["version"])
        assert _status(lambda: ops.admin_set_prices(read, if_version=read["version"])).status == 412  # stale now
        assert replaced["gpu_hour"] == {"H20": "7.25000000"} and replaced["version"] > book["version"]
        planned = ops.admin_set_plan("fortnight", 336, "0.12")
        assert (
            Decimal(planned["plans"]["fortnight"]["discount"]) == Decimal("0.12")
            and planned["version"] > replaced["version"]
        )
        assert "fortnight" not in ops.admin_retire_plan("fortnight")["plans"]
        assert _status(lambda: ops.admin_retire_plan("fortnight")).status == 404

        # clusters and nodes
        cl = ops.admin_register_cluster(preset=PRESET, name="east")
        spec = ops.admin_register_cluster(
            spec={
                "name": "tiny",
                "node_groups": [{"name": "h20", "count": 2, "gpu": "H20", "gpus_per_node": 8}],
                "fabric": "roce-800",
            }
        )
        assert (cl.name, cl.gpus, spec.nodes) == ("east", 128, 2)
        assert [c.name for c in ops.admin_clusters()] == ["east", "tiny"]
        assert _status(lambda: ops.admin_register_cluster(preset=PRESET, name="east")).status == 409
        assert _status(lambda: ops.admin_register_cluster(preset="nope")).status == 422
        nodes = ops.admin_nodes(cluster="east")
        assert len(nodes) == 16 and {n.state for n in nodes} == {"ready"}
        assert [n.name for n in ops.admin_nodes(cluster="east", limit=2, offset=1)] == [n.name for n in nodes[1:3]]
        one = ops.admin_node(nodes[0].name)
        assert len(one.gpus) == one.gpu_count == 8 and len({g.uuid for g in one.gpus}) == 8
        drained = ops.admin_set_node_state(one.name, "draining", "maintenance")
        assert (drained.state, drained.state_reason) == ("draining", "maintenance")
        assert [n.name for n in ops.admin_nodes(state="draining")] == [one.name]
        [h20] = ops.offers()
        assert (h20.total, h20.free) == (144, 136)
        ops.admin_set_node_state(one.name, "down")
        assert ops.offers()[0].total == 136
        assert ops.admin_set_node_state(one.name, "ready").state_reason == ""
        assert _status(lambda: ops.admin_set_node_state(one.name, "asleep")).status == 422
        ops.admin_remove_cluster("tiny")
        assert [c.name for c in ops.admin_clusters()] == ["east"]
        assert _status(lambda: ops.admin_remove_cluster("tiny")).status == 404


def test_unreachable_server_and_error_bodies() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url, "sl_whatever", timeout=5) as c:
        err = _status(c.me)
    assert err.status == 0 and f"cannot reach suanli server at {url}" in err.message and "suanli server" in str(err)

    def proxy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="<html><body>Bad Gateway</body></html>")

    with Client("example.invalid:8000", transport=httpx.MockTransport(proxy)) as c:
        assert c.server == "http://example.invalid:8000"
        err = _status(c.offers)
    assert err.status == 502 and err.message.startswith("HTTP 502 Bad Gateway")

    # money keeps its exact digits both ways, and never prints in exponent notation
    bal = load(Balance, {"org_id": "o", "balance": "0.00", "exact": "0E-8", "currency": "CNY",
                         "held_per_hour": "1.50", "added_later": 1})  # fmt: skip
    assert jsonable(bal) == {"org_id": "o", "balance": "0.00", "exact": "0.00000000", "currency": "CNY",
                             "held_per_hour": "1.50"}  # fmt: skip
    assert suanli.Client is Client and suanli.ApiError is ApiError


def test_reads_answered_503_are_tried_again_and_writes_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 503 says the server's database cannot serve right now: a read is sent again after Retry-After (at most
    READ_RETRIES times); a write is not, since it may have been applied before the connection broke."""
    from suanli.client import client as client_module

    slept: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    seen: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        if len(seen) <= 2 or request.method == "POST":
            return httpx.Response(503, json={"detail": "the database is unavailable right now; try again"},
                                  headers={"Retry-After": "2"})  # fmt: skip
        return httpx.Response(200, json={"status": "ok"})

    with Client("example.invalid:8000", transport=httpx.MockTransport(flaky)) as c:
        assert c.call("GET", "/healthz") == {"status": "ok"}
        assert (seen, slept) == (["GET"] * 3, [2.0, 2.0])
        seen.clear()
        err = _status(lambda: c.call("POST", "/workloads", {}))
    assert (err.status, seen) == (503, ["POST"]) and "try again" in err.message


def test_client_imports_no_server_code() -> None:
    """The SDK is an interface peer of the API: it must not pull in FastAPI, the services or the database."""
    code = "import sys, suanli; suanli.Client; print(sorted(m for m in sys.modules if m.split('.')[0] in " \
           "('fastapi', 'sqlalchemy', 'starlette') or m.startswith(('suanli.api', 'suanli.control', 'suanli.db'))))"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
