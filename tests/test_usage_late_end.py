"""A run billed by usage whose end is learned after windows past it were charged pays only to its end.

Per-second metering gives back what was charged past a run's end once the end is known (`metering.settle_credit`);
usage metering did not (its branch returned before, and `stop_earlier` compared the charge with the full-activity
rate), so a usage run kept paying for seconds it did not run: 1.20 for a run that cost 1.00. Now
`usage.credit_past_end` gives back all but U(billed, A), A the activity charged up to fully active for those seconds.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from suanli.billing.metering import billable_seconds, cost_of
from suanli.control.accounts import accounts
from suanli.control.money import ledger, metering, usage
from suanli.db.engine import Database
from suanli.db.models import Allocation, ClusterRow, Gpu, Node
from suanli.db.telemetry import GpuSampleRow

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FULL = Decimal("36")  # a cent a second when fully active
FLOOR = Decimal("7.2")
WINDOW = 60
POLICY = usage.UsagePolicy(span_s=6, delay_s=30)


def _org(db: Database) -> tuple[str, str]:
    with db.write() as s, s.begin():
        user, org = accounts.create_user(s, "usage-late@example.com", "password123", T0)
        ledger.move(s, "topup", org.id, "100", "top", T0)
        return org.id, user.id


def _usage_alloc(db: Database, org: tuple[str, str], mode: str = "usage") -> str:
    """One GPU billed by usage; no readings at all (an unregistered GPU): every second counts as fully active, so
    the bill of a run of S seconds is exactly cost_of(FULL, S)."""
    with db.write() as s, s.begin():
        a = metering.open_allocation(s, org_id=org[0], user_id=org[1], workload="late", gpu_model=None, gpus=0,
                                     placement={}, now=T0, hold_minutes=0)  # fmt: skip
        a.billing_mode, a.gpus, a.rate_per_hour = mode, 1, FULL
        a.floor_rate_per_hour = FLOOR if mode == "usage" else None
        a.placement = {"nowhere": [0]}
        return a.id


def _net_charged(db: Database, org_id: str) -> Decimal:
    with db.read() as s:
        return Decimal("100") - ledger.org_balance(s, org_id)


def _meter(db: Database, at: datetime) -> None:
    metering.meter(db, "probe", at, window_s=WINDOW, usage_policy=POLICY)


def test_usage_run_whose_end_is_learned_late_pays_only_to_its_end(db: Database) -> None:
    """The run ends at 100 s; the metering loop (another process, or the server's loop while the supervisor waits out
    a dead leader's lease) charges windows to 120 s before the end is recorded (at 100 s, the executor's record).
    Per-second billing nets exactly cost_of(rate, 100 s); by usage, with every second fully active, the same."""
    org = _org(db)
    alloc = _usage_alloc(db, org)
    _meter(db, T0 + timedelta(seconds=200))  # visible to 170 s: windows [0,60) and [60,120) charged
    with db.write() as s, s.begin():
        metering.close_allocation(s, alloc, T0 + timedelta(seconds=100))  # the end, learned now
    _meter(db, T0 + timedelta(seconds=400))  # settled
    with db.read() as s:
        a = s.get_one(Allocation, alloc)
        assert a.settled
    ran = cost_of(FULL, billable_seconds(100.0, True))
    assert _net_charged(db, org[0]) == ran, f"charged {_net_charged(db, org[0])} for a run that cost {ran}"


def test_usage_run_settled_then_stopped_earlier_gets_the_seconds_back(db: Database) -> None:
    """`stop_earlier` (an end learned after settling: a preemption's close, then the executor's earlier record)
    gives usage work back what it paid past the true end, as it gives per-second work."""
    org = _org(db)
    alloc = _usage_alloc(db, org)
    with db.write() as s, s.begin():
        metering.close_allocation(s, alloc, T0 + timedelta(seconds=120))
    _meter(db, T0 + timedelta(seconds=400))  # settled at 120 s
    assert _net_charged(db, org[0]) == cost_of(FULL, 120)
    with db.write() as s, s.begin():
        metering.stop_earlier(s, alloc, T0 + timedelta(seconds=60), T0 + timedelta(seconds=401))
    _meter(db, T0 + timedelta(seconds=500))
    assert _net_charged(db, org[0]) == cost_of(FULL, 60), f"charged {_net_charged(db, org[0])} for 60 s"


def test_control_on_demand_run_whose_end_is_learned_late_pays_only_to_its_end(db: Database) -> None:
    """The same run billed on demand (the per-second path gives the 20 s back)."""
    org = _org(db)
    alloc = _usage_alloc(db, org, mode="on-demand")
    _meter(db, T0 + timedelta(seconds=200))
    with db.write() as s, s.begin():
        metering.close_allocation(s, alloc, T0 + timedelta(seconds=100))
    _meter(db, T0 + timedelta(seconds=400))
    assert _net_charged(db, org[0]) == cost_of(FULL, 100)


def _idle_gpu(db: Database, upto_s: int) -> None:
    """Register GPU 0 of node `idle-node` and post a 0 % reading for it every 5 s from T0 to `upto_s`."""
    with db.write() as s, s.begin():
        s.add(ClusterRow(id="cl_probe", name="probe", source="spec", spec={}, created_at=T0))
        s.flush()
        s.add(Node(id="nd_probe", cluster_id="cl_probe", index=0, name="idle-node", kind="virtual", gpu_model="H20",
                   gpu_count=1, nvlink_domain=0, leaf=0, spine=0, created_at=T0))  # fmt: skip
        s.flush()
        g = Gpu(node_id="nd_probe", index=0, uuid="GPU-probe", model="H20", memory_mib=1000)
        s.add(g)
        s.flush()
        t0 = usage.epoch_ms(T0)
        for k in range(upto_s // 5 + 1):
            s.add(GpuSampleRow(gpu_id=g.id, t_ms=t0 + 500 + 5000 * k, util=0.0, mem_used_mib=0, temp_c=30.0,
                               power_w=50.0, sm_clock_mhz=1000, throttle=0, ecc_sbe=0, ecc_dbe=0, xid=0, error="",
                               workload="late", org=""))  # fmt: skip


def test_idle_usage_run_settled_then_stopped_earlier_gets_the_seconds_back(db: Database) -> None:
    """As above, with the GPU idle throughout (readings at 0 %): the run was charged the floor for 120 s; its end
    moves back to 60 s, and it pays the rule's bill for 60 s (compared with the full rate, as before, nothing came
    back)."""
    org = _org(db)
    _idle_gpu(db, 400)
    alloc = _usage_alloc(db, org)
    with db.write() as s, s.begin():
        s.get_one(Allocation, alloc).placement = {"idle-node": [0]}
        metering.close_allocation(s, alloc, T0 + timedelta(seconds=120))
    _meter(db, T0 + timedelta(seconds=400))
    assert _net_charged(db, org[0]) == _idle_bill(120), "the rule's bill for 120 s"
    with db.write() as s, s.begin():
        metering.stop_earlier(s, alloc, T0 + timedelta(seconds=60), T0 + timedelta(seconds=401))
    _meter(db, T0 + timedelta(seconds=500))
    assert _net_charged(db, org[0]) == _idle_bill(60), (
        f"charged {_net_charged(db, org[0])} for 60 s; the rule's bill is {_idle_bill(60)}"
    )


def _idle_bill(seconds: int) -> Decimal:
    """billing/usage.py's own rule for a run of `seconds` with the readings `_idle_gpu` posts."""
    from suanli.billing.usage import UsageRates, activity, usage_cost

    readings = [(500 + 5000 * k, 0) for k in range(400 // 5 + 1)]
    act = activity([readings], 0, seconds, POLICY.span_s, seconds * 1000)
    return usage_cost(UsageRates(FULL, FLOOR, Decimal(0), 1), seconds, act)


def test_a_late_end_never_gives_back_more_than_was_charged_past_it(db: Database) -> None:
    """Idle before the end and no readings after it (its server was down): the seconds past the end count fully
    active in what was charged, and the correction takes the activity charged as the run's, up to fully active for
    its seconds; the net bill lies between the rule's exact bill and what was charged, and a second pass changes
    nothing."""
    org = _org(db)
    _idle_gpu(db, 55)
    alloc = _usage_alloc(db, org)
    with db.write() as s, s.begin():
        s.get_one(Allocation, alloc).placement = {"idle-node": [0]}
    _meter(db, T0 + timedelta(seconds=200))  # [0,60) idle, [60,120) no readings: charged as fully active
    charged = _net_charged(db, org[0])
    with db.write() as s, s.begin():
        metering.close_allocation(s, alloc, T0 + timedelta(seconds=60))
    _meter(db, T0 + timedelta(seconds=400))
    net = _net_charged(db, org[0])
    assert _idle_bill(60) <= net < charged, (net, charged)
    _meter(db, T0 + timedelta(seconds=500))
    with db.write() as s, s.begin():
        metering.stop_earlier(s, alloc, T0 + timedelta(seconds=60), T0 + timedelta(seconds=501))
    assert _net_charged(db, org[0]) == net
