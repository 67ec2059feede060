"""One top-up code redeemed by many requests at once, against a real server of two worker processes, on both
databases: exactly one credit, every other request 409; the credit survives the server's kill -9."""

from __future__ import annotations

import os
import signal
import threading
from decimal import Decimal
from pathlib import Path

import httpx

from tests.control_plane import admin_token, bearer, live_server, signup, spawned

RACERS = 8


def test_concurrent_redemptions_of_one_code_credit_once_and_survive_kill_9(db_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    with live_server(home, db_url, args=("--workers", "2")) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        adm = bearer(admin_token(http))
        r = http.post("/api/v1/admin/topup-codes", json={"amount": "33.33", "count": 1, "note": "race"}, headers=adm)
        assert r.status_code == 201, r.text
        code = r.json()["codes"][0]["code"]
        tenant = signup(http, "racer@example.com")
        before = Decimal(http.get(f"/api/v1/orgs/{tenant.org_id}/balance", headers=tenant.headers).json()["exact"])
        start, statuses = threading.Barrier(RACERS), []

        def race() -> None:
            with httpx.Client(base_url=srv.url, timeout=60) as mine:
                start.wait()
                r = mine.post(f"/api/v1/orgs/{tenant.org_id}/redeem", json={"code": code}, headers=tenant.headers)
                statuses.append(r.status_code)

        threads = [threading.Thread(target=race) for _ in range(RACERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(statuses) == [200] + [409] * (RACERS - 1), statuses
        for pid in spawned(srv.proc.pid):  # its workers and loop process too: the host lost power
            os.kill(pid, signal.SIGKILL)
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait()
    with live_server(home, db_url) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        after = Decimal(http.get(f"/api/v1/orgs/{tenant.org_id}/balance", headers=tenant.headers).json()["exact"])
        assert after - before == Decimal("33.33")
        rows = http.get(f"/api/v1/orgs/{tenant.org_id}/statement", headers=tenant.headers).json()["rows"]
        assert [r["amount"] for r in rows if r["kind"] == "topup"] == ["33.33000000"]
        check = http.get("/api/v1/admin/ledger/check", headers=bearer(admin_token(http))).json()
        assert check["ok"], check
