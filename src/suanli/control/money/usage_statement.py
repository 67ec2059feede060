"""The usage statement: an org's allocations, newest first, each with its GPUs, rate, seconds charged and what the
ledger charged for it (per workload and user), paged by allocation, and as CSV with formula-like text escaped."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from suanli.billing.money import exact
from suanli.control.errors import Invalid
from suanli.control.money import usage
from suanli.control.money.statement import cell as statement_cell
from suanli.db.models import Allocation, User, Workload

USAGE_PAGE = USAGE_MAX_PAGE = 10_000  # rows in a page of the usage statement (as many as before it was paged)
STATEMENT_FIELDS = (
    "allocation", "workload", "user", "gpu_model", "gpus", "milli", "billing_mode", "rate_per_hour", "started_at",
    "stopped_at", "seconds_charged", "cost", "cpu_milli", "memory_mib", "host_rate_per_hour", "activity",
)  # fmt: skip


STATEMENT_TEXT = ("allocation", "workload", "user", "gpu_model", "billing_mode")  # a formula-like start is escaped


def statement(
    s: Session,
    org_id: str,
    *,
    user_id: str | None = None,
    workload: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    after: str | None = None,
    limit: int = USAGE_PAGE,
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of usage per allocation (per workload and user), newest first (by start, then id), and the cursor of
    the next page (the last row's allocation; None on the last page); cost is what the ledger charged. `workload`
    is a workload's id or its name (all its runs of that name). `after` must be one of this org's allocations."""
    q = select(Allocation, User.email).join(User, User.id == Allocation.user_id).where(Allocation.org_id == org_id)
    if after is not None:
        mark = s.get(Allocation, after)
        if mark is None or mark.org_id != org_id:
            raise Invalid("after: not an allocation of this org's statement (give the previous page's X-Next-After)")
        q = q.where(or_(Allocation.started_at < mark.started_at,
                        and_(Allocation.started_at == mark.started_at, Allocation.id < mark.id)))  # fmt: skip
    if user_id:
        q = q.where(Allocation.user_id == user_id)
    if workload:  # an id, or a name: every run of that name in this org
        named = select(Workload.id).where(Workload.org_id == org_id, Workload.name == workload)
        q = q.where(or_(Allocation.workload == workload, Allocation.workload.in_(named)))
    if since:
        q = q.where(or_(Allocation.stopped_at.is_(None), Allocation.stopped_at >= since))
    if until:
        q = q.where(Allocation.started_at < until)
    out = []
    found = s.execute(q.order_by(Allocation.started_at.desc(), Allocation.id.desc()).limit(limit + 1)).all()
    for a, email in found[:limit]:
        out.append(
            {
                "allocation": a.id, "workload": a.workload, "user": email, "gpu_model": a.gpu_model, "gpus": a.gpus,
                "milli": a.milli, "billing_mode": a.billing_mode, "rate_per_hour": format(exact(a.rate_per_hour), "f"),
                "started_at": a.started_at.isoformat(),
                "stopped_at": a.stopped_at.isoformat() if a.stopped_at else None,
                "seconds_charged": a.metered_until_s, "cost": format(exact(a.charged), "f"),
                "cpu_milli": a.cpu_milli, "memory_mib": a.memory_mib,
                "host_rate_per_hour": format(exact(a.host_rate_per_hour), "f"),
                # billing: usage: the average activity its charged seconds were billed at (None in other modes)
                "activity": usage.share(a.activity_permille_s, a.gpus, a.metered_until_s)
                if a.billing_mode == usage.USAGE else None,
            }
        )  # fmt: skip
    return out, (out[-1]["allocation"] if len(found) > limit else None)


def statement_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=STATEMENT_FIELDS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if r[k] is None else statement_cell(r[k]) if k in STATEMENT_TEXT else r[k]
                    for k in STATEMENT_FIELDS})  # fmt: skip
    return buf.getvalue()
