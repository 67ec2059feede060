"""Money checks shared by the ledger and metering tests, and a worker process the process tests start.

`audit` is the oracle: it sums, from the ledger alone, what every allocation was charged (net of what settling gave
back) and compares it with `cost_of(rate, seconds)` for the seconds it must have paid (once settled, the elapsed
time to the nearest second, at least one, computed here with integer arithmetic rather than by the code under test;
`metered_until_s` while live), and the charge keys with the windows due, so a lost or doubled second anywhere shows
up as a named problem.

As a program (`python -m tests.money_worker ...`) it is one of the competing processes:

- `charge URL ORG KEYS`: posts each key as a usage charge (or, for keys starting `refund`, a refund), one
  database transaction each, and prints `{"created": [...], "existing": [...]}`.
- `meter URL OWNER`: runs `metering.meter` passes on the wall clock until `--seconds` have passed (or forever,
  to be killed) and prints a JSON report: claimed ids per pass, charges posted and found already posted.

Both print `ready` once connected; with `--wait` they then wait for a line on stdin, so two start together.

- `spawner`: imports everything once, prints `ready`, then on `spawn <meter args>` forks a metering worker
  (a new process in milliseconds, instead of a second of interpreter start-up) and answers its pid, and on
  `kill <pid>` sends it SIGKILL and answers whether it was still running and what ended it. The kill test
  uses it to crash a dozen workers in a few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Collection
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from suanli.billing.ledger import REVENUE, org_account, transfer
from suanli.billing.metering import cost_of
from suanli.billing.money import ZERO
from suanli.control.ids import utcnow
from suanli.control.money import ledger, metering
from suanli.db.engine import Database
from suanli.db.models import Allocation, LedgerEntry, LedgerTransaction


def amount_of(key: str) -> Decimal:
    """A deterministic amount per key (so both processes post the same transaction for a shared key)."""
    n = sum(ord(c) * (i + 1) for i, c in enumerate(key))
    return Decimal(n % 997 + 1) / 100 + Decimal(n % 89) / 10**8


def ms(t: datetime) -> datetime:
    """`t` on a millisecond grid: billed seconds are then exact integers (see `billed_seconds`)."""
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def billed_seconds(started: datetime, stopped: datetime) -> int:
    """The elapsed time to the nearest second (half up), at least one when not zero, by integer arithmetic on
    microseconds."""
    us = (stopped - started) // timedelta(microseconds=1)
    return 0 if us <= 0 else max(1, (us + 500_000) // 1_000_000)


CREDIT = "usage-credit:"  # the key of what settling gives back of an allocation charged past its end


def usage_by_allocation(s: Session) -> dict[str, tuple[Decimal, list[str]]]:
    """What the ledger charged each allocation net of what settling gave back (revenue side of its usage
    transactions and of its `usage-credit:` refund), and the keys of both."""
    rows = s.execute(
        select(LedgerTransaction.allocation_id, LedgerTransaction.key, LedgerEntry.amount)
        .join(LedgerEntry, LedgerEntry.tx_id == LedgerTransaction.id)
        .where(LedgerEntry.account == REVENUE)
        .where((LedgerTransaction.kind == "usage") | LedgerTransaction.key.startswith(CREDIT))
    ).all()
    out: dict[str, tuple[Decimal, list[str]]] = {}
    for alloc, key, amount in rows:
        total, keys = out.get(alloc, (ZERO, []))
        out[alloc] = (total + amount, [*keys, key])
    return out


def audit(s: Session, window_s: int, ids: Collection[str] | None = None) -> list[str]:
    """Every way the stored money can be wrong, in words; empty when all of it is right. `ids`: the allocations
    metered with `window_s` (default: all)."""
    problems = [f"recompute: {k} {v}" for k, v in ledger.recompute(s).items()]
    charged = usage_by_allocation(s)
    q = select(Allocation).order_by(Allocation.id)
    for a in s.scalars(q if ids is None else q.where(Allocation.id.in_(ids))):
        total, keys = charged.get(a.id, (ZERO, []))
        credits = [k for k in keys if k.startswith(CREDIT)]
        keys = [k for k in keys if not k.startswith(CREDIT)]
        if credits and (any(not k.startswith(f"{CREDIT}{a.id}:") for k in credits) or not a.settled):
            problems.append(f"{a.id}: credits {credits} (settled: {a.settled})")
        if a.charged != total:
            problems.append(f"{a.id}: charged column {a.charged} != ledger {total}")
        if len(keys) != len(set(keys)):
            problems.append(f"{a.id}: a charge key posted twice")
        # Settled: the run to the nearest second. Not yet: exactly the windows below `metered_until_s` (no charge
        # without the step that records it, and no step recorded without its charge).
        billed = billed_seconds(a.started_at, a.stopped_at) if a.settled and a.stopped_at else a.metered_until_s
        want = cost_of(a.rate_per_hour, billed)
        if total != want:
            problems.append(f"{a.id}: ledger charged {total} for {billed} s at {a.rate_per_hour}/h, want {want}")
        if a.settled and a.metered_until_s != billed:
            problems.append(f"{a.id}: metered_until_s {a.metered_until_s} != billed {billed}")
        if not a.settled and a.metered_until_s % window_s:
            problems.append(f"{a.id}: live metered_until_s {a.metered_until_s} is not whole windows")
        windows = range(-(-billed // window_s))
        due = {
            f"usage:{a.id}:{window_s}:{k}"
            for k in windows
            if cost_of(a.rate_per_hour, min((k + 1) * window_s, billed)) != cost_of(a.rate_per_hour, k * window_s)
        }
        if credits:  # windows were charged past the end: those due are there, and the ones after them
            over = {f"usage:{a.id}:{window_s}:{k}" for k in range(len(windows), len(windows) + len(keys))}
            if not due <= set(keys) or not set(keys) - due <= over:
                problems.append(f"{a.id}: charge keys before the credit differ from the windows due")
        elif set(keys) != due:
            problems.append(f"{a.id}: charge keys differ from the windows due: {sorted(set(keys) ^ due)[:4]}")
    return problems


# ---- the worker program ---------------------------------------------------------------------------------------
def _connect(url: str, wait: bool, announce: bool = True) -> Database:
    db = Database(url)
    with db.read() as s:
        s.execute(text("select 1"))
    if announce:
        print("ready", flush=True)
    if wait:
        sys.stdin.readline()
    return db


def charge(args: argparse.Namespace) -> dict[str, Any]:
    db = _connect(args.url, args.wait)
    created, existing = [], []
    for key in args.keys.split(","):
        org = org_account(args.org)
        if key.startswith("refund"):
            tx = transfer(key, "refund", REVENUE, org, amount_of(key), "refund")
        else:
            tx = transfer(key, "usage", org, REVENUE, amount_of(key), "usage")
        with db.write() as s, s.begin():
            _, new = ledger.post(s, tx, utcnow(), org_id=args.org, allow_negative=[org])
        (created if new else existing).append(key)
    return {"created": created, "existing": existing}


def meter(args: argparse.Namespace, announce: bool = True) -> dict[str, Any]:
    db = _connect(args.url, args.wait, announce)
    report: dict[str, Any] = {"owner": args.owner, "claimed": [], "posted": 0, "repeated": 0, "settled": 0}
    end = time.monotonic() + args.seconds if args.seconds else None
    while end is None or time.monotonic() < end:
        r = metering.meter(db, args.owner, utcnow(), window_s=args.window, lease_s=args.lease, batch=args.batch)
        report["claimed"].append(r.claimed)
        for k in ("posted", "repeated", "settled"):
            report[k] += getattr(r, k)
        if args.interval:
            time.sleep(args.interval)
    return report


def _reply(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def spawner(parser: argparse.ArgumentParser) -> None:
    """Fork metering workers on request and kill them; see the module docstring."""
    _reply({"ready": True})
    children: set[int] = set()
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "spawn":
            pid = os.fork()
            if pid == 0:  # the worker: never returns into this loop, never reads the shared stdin
                code = 0
                try:
                    meter(parser.parse_args(["meter", *rest]), announce=False)
                except BaseException:
                    traceback.print_exc()
                    code = 1
                finally:
                    os._exit(code)
            children.add(pid)
            _reply({"pid": pid})
        elif cmd == "kill":
            pid = int(rest[0])
            children.discard(pid)
            done, status = os.waitpid(pid, os.WNOHANG)
            alive = done == 0
            if alive:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
            died_of = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            _reply({"alive": alive, "signal": died_of, "exit": os.WEXITSTATUS(status) if died_of is None else None})
    for pid in children:  # the test ended early (it failed): leave no worker running
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.money_worker")
    p.add_argument("--wait", action="store_true", help="after 'ready', wait for a line on stdin")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("charge")
    c.add_argument("url")
    c.add_argument("org")
    c.add_argument("keys", help="comma-separated idempotency keys")
    m = sub.add_parser("meter")
    m.add_argument("url")
    m.add_argument("owner")
    m.add_argument("--window", type=int, default=1)
    m.add_argument("--lease", type=float, default=1.0)
    m.add_argument("--batch", type=int, default=200)
    m.add_argument("--seconds", type=float, default=0.0, help="0: run until killed")
    m.add_argument("--interval", type=float, default=0.0)
    sub.add_parser("spawner")
    args = p.parse_args(argv)
    if args.cmd == "spawner":
        spawner(p)
        return
    _reply(charge(args) if args.cmd == "charge" else meter(args))


if __name__ == "__main__":
    main()
