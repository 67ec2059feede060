"""Several server processes on one database: start-up work (migrations, seeding, the first admin, virtual
nodes) happens once, and the processes serve the same state."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.control_plane import admin_token, bearer, live_server, signup


def test_workers_starting_together_bootstrap_once_and_share_state(db_url: str, tmp_path: Path) -> None:
    args = ("--workers", "3", "--virtual", "4x8:H100")
    with live_server(tmp_path / "home", db_url, args=args) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        admin = bearer(admin_token(c))
        users = c.get("/api/v1/admin/users", headers=admin).json()
        assert [u["email"] for u in users] == ["ops@example.com"]
        clusters = c.get("/api/v1/admin/clusters", headers=admin).json()
        assert [(x["name"], x["gpus"]) for x in clusters] == [("4x8:H100-SXM", 32)]
        assert c.get("/api/v1/prices", headers=admin).json()["version"] == 1
        # Requests land on different workers; every one sees the tenant the first one created.
        t = signup(c, "t@example.com")
        for _ in range(12):
            r = httpx.get(f"{srv.url}/api/v1/orgs/{t.org_id}/balance", headers=t.headers, timeout=30)
            assert r.status_code == 200 and r.json()["balance"] == "10.00"
    assert "Traceback" not in srv.log.read_text(errors="replace")
