"""The payment webhook replayed concurrently (one event sent 12 times at once, from threads, each in
its own database transaction as the route runs it), beside other events and charges to the same org. Asserts the
safe behaviour: one credit, every other answer `duplicate`, no error, balances equal to their entries."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.control.errors import ServiceError
from suanli.control.ids import utcnow
from suanli.control.money import ledger, payments
from suanli.payments.hmac_provider import HEADER, sign
from tests.control_plane import settings, signup

SECRET = "whsec_" + "r" * 40
N = 12


@pytest.fixture
def pay(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Iterator[TestClient]:
    from suanli.api.app import create_app

    with TestClient(create_app(settings(tmp_path / "home", db_url, payment_hmac_secret=SECRET))) as client:
        yield client


def test_one_event_replayed_concurrently_credits_once_beside_charges(pay: TestClient) -> None:
    who = signup(pay, "racer@example.com")
    srv = pay.app.state.server  # type: ignore[attr-defined]
    db, cfg = srv.db, srv.settings
    with db.read() as s:
        before = ledger.org_balance(s, who.org_id)
    body = json.dumps({"id": "evt_race", "org": who.org_id, "amount": "50.00", "currency": "CNY"}).encode()
    others = [json.dumps({"id": f"evt_other_{i}", "org": who.org_id, "amount": "1.00", "currency": "CNY"}).encode()
              for i in range(4)]  # fmt: skip
    go = threading.Barrier(N + len(others) + 4)
    results: list[Any] = []
    lock = threading.Lock()

    def hook(b: bytes) -> None:
        go.wait()
        try:
            headers = {HEADER: sign(SECRET, b, int(time.time()))}
            out: Any = payments.receive(db, cfg, "hmac", headers, b, utcnow())
        except ServiceError as e:
            out = ("refused", e.status, e.message)
        except Exception as e:  # a 500
            out = ("error", type(e).__name__, str(e)[:300])
        with lock:
            results.append(out)

    def charge(i: int) -> None:
        go.wait()
        try:
            with db.write() as s, s.begin():
                tx = transfer(f"probe-charge:{i}", "usage", org_account(who.org_id), REVENUE, Decimal("0.01"), "p")
                ledger.post(s, tx, utcnow(), org_id=who.org_id, allow_negative=[org_account(who.org_id)])
            out: Any = ("charged", i)
        except Exception as e:
            out = ("error", type(e).__name__, str(e)[:300])
        with lock:
            results.append(out)

    threads = [threading.Thread(target=hook, args=(body,)) for _ in range(N)]
    threads += [threading.Thread(target=hook, args=(b,)) for b in others]
    threads += [threading.Thread(target=charge, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    errors = [r for r in results if isinstance(r, tuple) and r[0] in ("error", "refused")]
    assert not errors, errors
    race = [r for r in results if isinstance(r, payments.Payment) and r.event_id == "evt_race"]
    assert len(race) == N and sum(not r.duplicate for r in race) == 1, race
    assert len({r.transaction_id for r in race}) == 1
    with db.read() as s:
        after = ledger.org_balance(s, who.org_id)
        assert ledger.recompute(s) == {}
    assert after - before == Decimal("50.00") + 4 * Decimal("1.00") - 4 * Decimal("0.01"), after - before
