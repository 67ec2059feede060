"""Top-up codes through the SDK and the CLI (`suanli admin codes …`, `suanli redeem`), in-process on both databases:
the codes printed once (table, CSV), listed without them, voided, redeemed once."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient

from suanli.client import ApiError, Client
from tests.cli_helpers import act_as, invoke, logged_in
from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, signup


def _client(api: TestClient, email: str, password: str) -> Client:
    return logged_in(api, email, password)


def _as(monkeypatch: pytest.MonkeyPatch, c: Client) -> None:
    act_as(monkeypatch, c)


def test_the_sdk_makes_lists_voids_and_redeems(api: TestClient) -> None:
    adm = _client(api, ADMIN_EMAIL, ADMIN_PASSWORD)
    signup(api, "sdk@example.com")
    me = _client(api, "sdk@example.com", "tenant-password")
    made = adm.admin_topup_codes_create("25.50", 2, note="sdk")
    assert made.batch.amount == Decimal("25.50") and len(made.codes) == 2
    with pytest.raises(TypeError):
        adm.admin_topup_codes_create(0.1, 1)  # type: ignore[arg-type]
    r = me.redeem(made.codes[0].code)
    assert r.amount == Decimal("25.50") and r.exact_balance == Decimal("35.50")
    with pytest.raises(ApiError) as e:
        me.redeem(made.codes[0].code)
    assert e.value.status == 409
    assert adm.admin_topup_codes_void(made.batch.id).voided == 1
    detail = adm.admin_topup_batch(made.batch.id)
    assert sorted(c.state for c in detail.codes) == ["redeemed", "voided"]
    assert [b.id for b in adm.admin_topup_batches()] == [made.batch.id]
    with pytest.raises(ApiError) as e:
        me.admin_topup_batches()
    assert e.value.status == 403


def test_the_cli_prints_codes_once_and_a_tenant_redeems_one(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    adm = _client(api, ADMIN_EMAIL, ADMIN_PASSWORD)
    _as(monkeypatch, adm)
    out = invoke(["admin", "codes", "create", "--amount", "100", "--count", "3", "--expires", "2030-01-31",
                  "--note", "=cmd|' /C calc'!A0", "--csv"]).stdout  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 3 and {r["amount"] for r in rows} == {"100.00000000"}
    assert rows[0]["expires_at"].startswith("2030-02-01T00:00:00")  # through the end of the day named, UTC
    assert all(not r["note"].startswith("=") for r in rows)  # a note cannot become a spreadsheet formula
    batch = rows[0]["batch"]
    table = invoke(["admin", "codes", "create", "--amount", "1", "--count", "1"]).stdout
    assert "shown only now" in table
    listed = invoke(["admin", "codes", "list", batch]).stdout + invoke(["admin", "codes", "list"]).stdout
    assert batch in listed and all(r["code"] not in listed for r in rows)
    signup(api, "cli@example.com")
    _as(monkeypatch, _client(api, "cli@example.com", "tenant-password"))
    assert "redeemed 100.00" in invoke(["redeem", rows[0]["code"]]).stdout
    err = invoke(["redeem", rows[0]["code"]], code=2).stderr
    assert "redeemed already" in err
    assert "operator" in invoke(["admin", "codes", "list"], code=2).stderr
    _as(monkeypatch, adm)
    assert "1 voided" in invoke(["admin", "codes", "void", batch, rows[1]["code_id"]]).stdout
    codes = json.loads(invoke(["admin", "codes", "list", batch, "--json"]).stdout)["codes"]
    assert sorted(c["state"] for c in codes) == ["redeemed", "unused", "voided"]
    invoke(["admin", "codes", "create", "--amount", "5", "--count", "1", "--expires", "someday"], code=2)
