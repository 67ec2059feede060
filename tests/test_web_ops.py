"""The operator's pages in-process, on SQLite and PostgreSQL: the cluster heat map's structure and live state, nodes
with drain/undrain and fault injection; bad input shows the API's message at the field, never a 500."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, admin_token, bearer
from tests.web_helpers import Console, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)


@pytest.fixture
def ops(api: Any) -> Console:
    c = Console(api)
    c.login(ADMIN_EMAIL, ADMIN_PASSWORD)
    return c


def _register(api: Any, preset: str, name: str) -> dict[str, Any]:
    r = api.post("/api/v1/admin/clusters", json={"preset": preset, "name": name}, headers=bearer(admin_token(api)))
    assert r.status_code == 201, r.text
    return r.json()


def _inline_state(html: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="heat-state">(.*?)</script>', html, re.S)
    assert m
    return json.loads(m.group(1))


def test_the_heat_map_draws_one_cell_per_gpu_inside_nodes_leaves_and_spines(api: Any, ops: Console) -> None:
    _register(api, "h20-roce800-128", "h20")
    _register(api, "gb300-nvl72", "nvl72")
    gpus = api.get("/api/v1/admin/gpus", headers=bearer(admin_token(api))).json()
    r = ops.get("/ops/cluster", headers={"Accept-Language": "en"})
    assert r.status_code == 200, r.text
    assert r.text.count("<i></i>") == len(gpus) == 128 + 72
    assert r.text.count('class="hm-node') == 16 + 18
    assert r.text.count('class="hm-dom multi"') == 1  # the NVL72 rack: 18 trays in one NVLink domain
    assert r.text.count('class="hm-leaf"') == 2 and r.text.count('class="hm-spine"') == 2
    assert 'href="/ops/nodes/' in r.text
    state = _inline_state(r.text)
    assert sum(len(v) for v in state["nodes"].values()) == len(gpus)
    live = ops.get("/ops/cluster/_/state")
    assert live.status_code == 200 and live.headers["content-type"].startswith("application/json")
    assert live.json()["v"] == state["v"]


def test_the_state_follows_health_and_the_wiring_digest_follows_the_nodes(api: Any, ops: Console) -> None:
    _register(api, "rtx4090-box", "box")
    before = ops.get("/ops/cluster/_/state").json()
    node = next(iter(before["nodes"]))
    assert [c[2] for c in before["nodes"][node]] == [0] * 8
    r = api.patch(f"/api/v1/admin/nodes/{node}", json={"state": "draining", "reason": "fan"},
                  headers=bearer(admin_token(api)))  # fmt: skip
    assert r.status_code == 200
    after = ops.get("/ops/cluster/_/state").json()
    assert [c[2] for c in after["nodes"][node]] == [1] * 8 and after["v"] == before["v"]
    _register(api, "rtx4090-box", "box2")
    assert ops.get("/ops/cluster/_/state").json()["v"] != before["v"]


def test_above_the_threshold_a_cell_is_a_node(api: Any, ops: Console, monkeypatch: pytest.MonkeyPatch) -> None:
    from suanli.web.pages import ops_cluster

    monkeypatch.setattr(ops_cluster, "AGGREGATE_ABOVE", 64)
    _register(api, "h20-roce800-128", "h20")
    r = ops.get("/ops/cluster")
    assert r.text.count("<i></i>") == 16
    assert all(len(v) == 1 for v in _inline_state(r.text)["nodes"].values())


def test_nodes_list_and_node_page_with_events(api: Any, ops: Console) -> None:
    _register(api, "rtx4090-box", "box")
    r = ops.get("/ops/nodes", headers={"Accept-Language": "en"})
    assert r.status_code == 200
    name = re.search(r'href="/ops/nodes/([^"?]+)"', r.text).group(1)
    page = ops.get(f"/ops/nodes/{name}", headers={"Accept-Language": "en"})
    assert page.status_code == 200 and page.text.count("<tr><td>") >= 8 and 'id="fault-form"' in page.text
    assert ops.get("/ops/nodes/no-such-node").status_code == 404


def test_drain_with_a_reason_then_undrain(api: Any, ops: Console) -> None:
    _register(api, "rtx4090-box", "box")
    name = api.get("/api/v1/admin/nodes", headers=bearer(admin_token(api))).json()[0]["name"]
    r = ops.post(f"/ops/nodes/{name}/state", {"state": "draining", "reason": "PSU swap"}, csrf_from="/ops/nodes")
    assert r.status_code == 303
    node = api.get(f"/api/v1/admin/nodes/{name}", headers=bearer(admin_token(api))).json()
    assert node["state"] == "draining" and node["state_reason"] == "PSU swap"
    assert "PSU swap" in ops.get(f"/ops/nodes/{name}").text
    assert (
        ops.post(f"/ops/nodes/{name}/state", {"state": "ready", "reason": ""}, csrf_from="/ops/nodes").status_code
        == 303
    )
    assert api.get(f"/api/v1/admin/nodes/{name}", headers=bearer(admin_token(api))).json()["state"] == "ready"


def test_bad_state_and_bad_fault_show_the_field_message(api: Any, ops: Console) -> None:
    _register(api, "rtx4090-box", "box")
    name = api.get("/api/v1/admin/nodes", headers=bearer(admin_token(api))).json()[0]["name"]
    r = ops.post(f"/ops/nodes/{name}/state", {"state": "melted"}, csrf_from="/ops/nodes")
    assert r.status_code == 422 and 'class="field-error"' in r.text
    r = ops.post(f"/ops/nodes/{name}/faults", {"gpu": "99", "kind": "overtemp"}, csrf_from="/ops/nodes")
    assert r.status_code == 422 and 'data-field="gpu"' in r.text and "GPUs 0-7" in r.text
    r = ops.post(f"/ops/nodes/{name}/faults", {"gpu": "x", "kind": "overtemp"}, csrf_from="/ops/nodes")
    assert r.status_code == 422 and 'data-field="gpu"' in r.text
    r = ops.post(f"/ops/nodes/{name}/faults", {"gpu": "1", "kind": "xid"}, csrf_from="/ops/nodes")
    assert r.status_code == 422 and 'data-field="xid"' in r.text
    r = ops.post(f"/ops/nodes/{name}/faults", {"gpu": "1", "kind": "xid", "xid": "79"}, csrf_from="/ops/nodes")
    assert r.status_code == 303
    assert "fault injected: xid 79" in ops.get(f"/ops/nodes/{name}").text
    assert ops.post("/ops/nodes/ghost/state", {"state": "ready"}, csrf_from="/ops/nodes").status_code == 404


def test_ops_forms_without_csrf_are_refused(api: Any, ops: Console) -> None:
    _register(api, "rtx4090-box", "box")
    name = api.get("/api/v1/admin/nodes", headers=bearer(admin_token(api))).json()[0]["name"]
    for path, data in (
        (f"/ops/nodes/{name}/state", {"state": "down"}),
        (f"/ops/nodes/{name}/faults", {"gpu": "0", "kind": "overtemp"}),
    ):
        assert ops.c.post(path, data=data, follow_redirects=False).status_code == 403
        assert ops.c.post(path, data={"csrf": "0" * 40, **data}, follow_redirects=False).status_code == 403
    assert api.get(f"/api/v1/admin/nodes/{name}", headers=bearer(admin_token(api))).json()["state"] == "ready"
    assert "injected" not in ops.get(f"/ops/nodes/{name}").text


def test_revenue_page_shows_exact_money_by_model_and_day(api: Any, db_url: str, ops: Console) -> None:
    from datetime import UTC, datetime

    from suanli.db.engine import Database
    from tests.control_plane import signup
    from tests.test_admin_reports import _charge

    t = signup(api, "rev@example.com")
    _charge(Database(db_url), t.org_id, t.user_id, "r1", "H100-SXM", "1234.565", datetime.now(UTC))
    r = ops.get("/ops/revenue?days=7", headers={"Accept-Language": "en"})
    assert r.status_code == 200, r.text
    assert '<th class="num">H100-SXM</th>' in r.text and "¥1,234.56" in r.text  # banker's rounding, as statements
    assert r.text.count("<tr><td>") == 7 and 'id="chart-data"' in r.text
    bad = ops.get("/ops/revenue?days=9999")
    assert bad.status_code == 422 and 'data-field="days"' in bad.text


def test_waste_page_shows_hours_and_refuses_a_bad_window(api: Any, ops: Console) -> None:
    _register(api, "rtx4090-box", "box")
    r = ops.get("/ops/waste?hours=6", headers={"Accept-Language": "en"})
    assert r.status_code == 200 and r.text.count("<tr><td>") == 6 and 'id="idle"' in r.text
    for hours in ("0", "abc", "100000"):
        bad = ops.get(f"/ops/waste?hours={hours}")
        assert bad.status_code == 422 and 'data-field="hours"' in bad.text, hours


def test_orgs_and_quotas_pages_set_a_quota_and_refuse_bad_input(api: Any, ops: Console) -> None:
    from tests.control_plane import signup

    t = signup(api, "quota@example.com")
    r = ops.get("/ops/orgs", headers={"Accept-Language": "en"})
    assert r.status_code == 200 and "quota@example.com" in r.text
    r = ops.post(f"/ops/quotas/{t.org_id}", {"gpus": "16", "cpus": "", "memory_gib": "512"}, csrf_from="/ops/quotas")
    assert r.status_code == 303
    org = next(o for o in api.get("/api/v1/admin/orgs", headers=bearer(admin_token(api))).json() if o["id"] == t.org_id)
    assert (org["quota_gpus"], org["quota_cpus"], org["quota_memory_gib"]) == (16, None, 512)
    r = ops.post(f"/ops/quotas/{t.org_id}", {"gpus": "-3", "cpus": "", "memory_gib": ""}, csrf_from="/ops/quotas")
    assert r.status_code == 422 and 'data-field="gpus"' in r.text
    r = ops.post(f"/ops/quotas/{t.org_id}", {"gpus": "lots", "cpus": "", "memory_gib": ""}, csrf_from="/ops/quotas")
    assert r.status_code == 422 and 'data-field="gpus"' in r.text
    assert ops.post("/ops/quotas/no-such-org", {"gpus": "1"}, csrf_from="/ops/quotas").status_code == 404
    org = next(o for o in api.get("/api/v1/admin/orgs", headers=bearer(admin_token(api))).json() if o["id"] == t.org_id)
    assert org["quota_gpus"] == 16  # the refused forms changed nothing


def test_prices_page_edits_a_gpu_price_and_host_prices_exactly(api: Any, ops: Console) -> None:
    r = ops.get("/ops/prices", headers={"Accept-Language": "en"})
    assert r.status_code == 200 and 'id="gpu-prices"' in r.text
    r = ops.post("/ops/prices/gpu", {"gpu": "H100-SXM", "on_demand": "12.34567891"}, csrf_from="/ops/prices")
    assert r.status_code == 303, r.text
    book = api.get("/api/v1/prices", headers=bearer(admin_token(api))).json()
    assert book["gpu_hour"]["H100-SXM"] in ("12.34567891", "12.34567891000")
    r = ops.post("/ops/prices/gpu", {"gpu": "H100-SXM", "on_demand": "0.1e1000"}, csrf_from="/ops/prices")
    assert r.status_code == 422 and 'data-field="on_demand"' in r.text
    r = ops.post("/ops/prices/gpu", {"gpu": "H100-SXM", "on_demand": "-1"}, csrf_from="/ops/prices")
    assert r.status_code == 422 and 'data-field="on_demand"' in r.text
    r = ops.post("/ops/prices/host", {"cpu_core_hour": "0.05", "memory_gib_hour": "abc"}, csrf_from="/ops/prices")
    assert r.status_code == 422 and 'data-field="memory_gib_hour"' in r.text
    r = ops.post("/ops/prices/host", {"cpu_core_hour": "0.05", "memory_gib_hour": "0.01"}, csrf_from="/ops/prices")
    assert r.status_code == 303
    book = api.get("/api/v1/prices", headers=bearer(admin_token(api))).json()
    assert book["cpu_core_hour"].startswith("0.05") and book["memory_gib_hour"].startswith("0.01")


def test_codes_generate_print_once_and_see_redemptions(api: Any, ops: Console) -> None:
    from datetime import UTC, datetime, timedelta

    from tests.control_plane import signup

    soon = (datetime.now(UTC) + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M")
    r = ops.post("/ops/codes", {"amount": "50.00", "count": "3", "expires_at": soon, "note": "expo"},
                 csrf_from="/ops/codes")  # fmt: skip
    assert r.status_code == 303, r.text
    r = ops.get(r.headers["location"])
    codes = re.findall(r'<code class="code">([^<]+)</code>', r.text)
    assert len(codes) == 3 and "¥50.00" in r.text
    listing = ops.get("/ops/codes")
    assert all(c not in listing.text for c in codes)  # the list never shows a plain code again
    batch = re.search(r'href="/ops/codes/([^"]+)"', listing.text).group(1)
    t = signup(api, "redeemer@example.com")
    r = api.post(f"/api/v1/orgs/{t.org_id}/redeem", json={"code": codes[1]}, headers=t.headers)
    assert r.status_code in (200, 201), r.text
    detail = ops.get(f"/ops/codes/{batch}")
    assert detail.status_code == 200 and "redeemer@example.com" in detail.text
    assert 'id="redeemed">1<' in detail.text and all(c not in detail.text for c in codes)
    assert ops.post(f"/ops/codes/{batch}/void", {}, csrf_from="/ops/codes").status_code == 303
    assert ops.get(f"/ops/codes/{batch}").text.count(">voided<") == 2
    assert ops.get("/ops/codes/no-such-batch").status_code == 404


def test_codes_bad_input_shows_the_field_message(api: Any, ops: Console) -> None:
    for data, field in (({"amount": "-5", "count": "3"}, "amount"), ({"amount": "10", "count": "0"}, "count"),
                        ({"amount": "10", "count": "x"}, "count"), ({"amount": "1.234", "count": "1"}, "amount"),
                        ({"amount": "10", "count": "1", "expires_at": "soon"}, "expires_at")):  # fmt: skip
        r = ops.post("/ops/codes", data, csrf_from="/ops/codes")
        assert r.status_code == 422 and f'data-field="{field}"' in r.text, (data, r.text[-800:])
    assert "No batches yet" in ops.get("/ops/codes", headers={"Accept-Language": "en"}).text
