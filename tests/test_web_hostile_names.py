"""Strings a stranger controls, shown on another tenant's endpoint pages and the operator's, stay inert (from a
hostile review of the console)."""

from __future__ import annotations

from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, signup
from tests.test_hardening_serving_money import (  # noqa: F401  (platform: the fixture)
    EP,
    SPEC,
    Replica,
    deploy_ready,
    platform,
    reports,
)
from tests.test_workloads_api import Platform
from tests.web_helpers import Console

XSS = "</script><script>alert(1)</script><img src=x onerror=alert(2)>\"'<!--"
HDRS = ("x-frame-options", "content-security-policy", "x-content-type-options")


def test_a_buyers_key_name_on_the_sellers_endpoint_page_is_inert(platform: Platform) -> None:  # noqa: F811
    replica = Replica(reports(1, 1))
    ep = deploy_ready(platform, replica.port, {**SPEC, "price_per_1m_tokens": "1"})
    buyer = signup(platform.api, "xss-buyer@example.com")
    r = platform.api.post(f"{EP}/{ep['id']}/keys", json={"password": "tenant-password", "name": XSS[:128]},
                          headers=buyer.headers)  # fmt: skip
    assert r.status_code == 201, r.text
    key = r.json()["key"]
    platform.api.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "chat", "messages": [{"role": "user", "content": XSS}]})  # fmt: skip
    platform.api.cookies.clear()
    c = Console(platform.api)
    c.login("tenant@example.com", "tenant-password")
    for path in ("/endpoints", f"/endpoints/{ep['id']}", "/", "/wallet"):
        page = c.get(path)
        assert page.status_code == 200, (path, page.status_code)
        assert "<script>alert" not in page.text and "<img src=x" not in page.text, path
        assert all(h in page.headers for h in HDRS), (path, dict(page.headers))
    platform.api.cookies.clear()
    ops = Console(platform.api)
    ops.login(ADMIN_EMAIL, ADMIN_PASSWORD)
    for path in ("/ops/orgs", "/ops/revenue", "/ops/nodes", "/ops/cluster"):
        page = ops.get(path)
        assert page.status_code < 500, path
        assert "<script>alert" not in page.text and "<img src=x" not in page.text, path
