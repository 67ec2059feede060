"""Money under races (from a hostile review): stop requests, supervisor passes and metering passes racing on one running instance (threads
against the in-process app and its database, both backends): the run is charged exactly its seconds, once, and the
ledger stays balanced."""

from __future__ import annotations

import threading
from decimal import Decimal

from fastapi.testclient import TestClient
from sqlalchemy import select

from suanli.billing.metering import billable_seconds, cost_of
from suanli.control.money import ledger, metering
from suanli.db.models import Allocation, LedgerTransaction
from tests.test_resize_virtual import API, make_cluster


def test_racing_stops_finishes_and_meter_passes_charge_each_second_once(api: TestClient) -> None:
    c = make_cluster(api, preset="1x8:H20", top_up="100000")
    wids = [c.submit({"name": f"inst-{i}", "kind": "instance", "resources": {"gpu": "H20", "gpus": 1}}, t=0)
            for i in range(4)]  # fmt: skip
    c.tick(0)
    assert all(c.get(w)["state"] == "running" for w in wids)
    metering.meter(c.db, "m0", c.at(125), window_s=60)  # windows charged while running
    errors: list[BaseException] = []

    def guard(fn):  # type: ignore[no-untyped-def]
        def run() -> None:
            try:
                fn()
            except BaseException as e:
                errors.append(e)

        return run

    def stops() -> None:
        for w in wids:
            for _ in range(2):
                r = c.api.post(f"{API}/workloads/{w}/stop", headers=c.tenant.headers)
                assert r.status_code in (200, 409), r.text

    def sup(at: float) -> None:
        c.sup.run(c.db, c.at(at))

    def meter(owner: str, at: float) -> None:
        metering.meter(c.db, owner, c.at(at), window_s=60, lease_s=0.0)

    threads = [threading.Thread(target=guard(f)) for f in (
        stops, stops, lambda: sup(130), lambda: sup(131), lambda: meter("m1", 132), lambda: meter("m2", 133),
        lambda: sup(134), lambda: meter("m3", 135))]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for at in (140, 150, 160):
        c.sup.run(c.db, c.at(at))
    metering.meter(c.db, "m4", c.at(400), window_s=60)
    metering.meter(c.db, "m5", c.at(401), window_s=60)
    assert not [e for e in errors if not isinstance(e, AssertionError)], errors
    with c.db.read() as s:
        for w in wids:
            allocs = list(s.scalars(select(Allocation).where(Allocation.workload == w)))
            for a in allocs:
                assert a.stopped_at is not None and a.settled, (w, a.id)
                billed = billable_seconds((a.stopped_at - a.started_at).total_seconds(), True)
                net = -sum(
                    (
                        ledger.net_for_org(tx, a.org_id)
                        for tx in s.scalars(select(LedgerTransaction).where(LedgerTransaction.allocation_id == a.id))
                    ),
                    Decimal(0),
                )
                assert net == cost_of(a.rate_per_hour, billed), (a.id, net, billed)
        assert ledger.recompute(s) == {}
