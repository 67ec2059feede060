"""An allocation whose end is corrected twice after it was settled is given back twice, each what it owes. Found by
a hostile review: the first settle gave back the seconds charged past the stop it knew under the key
`usage-credit:<allocation>`; a later `stop_earlier` (the executor's record of an even earlier end) computed a second,
different credit under the same key, which the ledger refused (409): the supervisor's pass failed on it every time,
and the tenant kept paying for seconds after the run's true end. Both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from suanli.billing.metering import cost_of
from suanli.control.accounts import accounts
from suanli.control.money import ledger, metering
from suanli.db.engine import Database
from suanli.db.models import Allocation

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


@pytest.fixture
def tenant(db: Database) -> tuple[str, str]:
    with db.write() as s, s.begin():
        user, org = accounts.create_user(s, "settle@example.com", "password123", T0)
        return org.id, user.id


def test_a_second_correction_of_a_settled_stop_gives_the_rest_back(db: Database, tenant: tuple[str, str]) -> None:
    rate = Decimal("36")  # 0.01 a second
    with db.write() as s, s.begin():
        a = metering.open_allocation(s, org_id=tenant[0], user_id=tenant[1], workload="job", gpu_model=None, gpus=0,
                                     placement={}, now=at(0), hold_minutes=0)  # fmt: skip
        a.rate_per_hour = rate
        alloc = a.id
    metering.meter(db, "w", at(181), window_s=60)  # running: 180 s charged
    with db.write() as s, s.begin():
        metering.close_allocation(s, alloc, at(100))  # its end learned late
    metering.meter(db, "w", at(200), window_s=60)  # settled: 80 s given back (usage-credit:<alloc>)
    error = None
    try:
        with db.write() as s, s.begin():
            metering.stop_earlier(s, alloc, at(50), at(300))  # the executor says it ended even earlier
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    with db.read() as s:
        row = s.get_one(Allocation, alloc)
        net = -sum((ledger.net_for_org(t, tenant[0]) for t in ledger.transactions(s, tenant[0], limit=100)
                    if t.allocation_id == alloc), Decimal(0))  # fmt: skip
    assert error is None, error
    assert net == cost_of(rate, 50) and row.charged == net, (net, row.charged, row.stopped_at)
    with db.write() as s, s.begin():
        metering.stop_earlier(s, alloc, at(50), at(400))  # the same record again: nothing more
    with db.read() as s:
        again = -sum((ledger.net_for_org(t, tenant[0]) for t in ledger.transactions(s, tenant[0], limit=100)
                      if t.allocation_id == alloc), Decimal(0))  # fmt: skip
    assert again == net
