"""Top-up codes: operators sell credit as printed codes, tenants redeem them into an org they may spend from.

A code is 20 Crockford base32 characters (100 random bits), shown once in four dashed groups of five (`7K2QD-…`), and typed back
in any case, with or without dashes or spaces (O reads as 0, I and L as 1). It is stored as the SHA-256 of its
normalised text, not with argon2: a password needs a slow, salted hash because people choose guessable ones, but a
code has 100 random bits, so there is no dictionary to run and a fast unsalted hash is as safe; and a deterministic
hash lets a redemption find its code by one index lookup, where a salted one would have to try every stored code.

Redeeming is one database transaction: the code's row is locked (`FOR UPDATE` on PostgreSQL; SQLite's writers are
serialised at BEGIN), checked, marked redeemed by a conditional UPDATE, and a `topup` ledger transaction keyed
`topup-code:<code id>` is posted from `external` to the org: two redemptions of one code at once credit once, and
the other gets 409. Attempts are throttled per user and per address before the code is looked up
(`throttle.begin_redeem`); `redeem_with_throttle` does all of it. The refusals (docs/payments.md) say what is
wrong with a real code (used 409, voided or expired 410, for another org 403), since only someone who holds one sees
them; a code that does not exist, or is not a code at all, is 404.

`create_batch`, `batches`, `batch`, `codes` and `void` are operators' actions: the caller checks the role first
(`accounts.require_admin`), as the API's /admin routes do. `redeem` checks the caller's role in the org itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import case, func, select, update
from sqlalchemy.orm import Session

from suanli.billing.money import ZERO, exact
from suanli.control.accounts import accounts, memberships, throttle
from suanli.control.accounts.accounts import Principal
from suanli.control.accounts.throttle import REDEEM_ADDRESS, REDEEM_USER
from suanli.control.errors import Conflict, Forbidden, Gone, Invalid, NotFound
from suanli.control.ids import CROCKFORD, new_code, new_id, utcnow
from suanli.control.money import ledger
from suanli.db.credit import TopupBatch, TopupCode
from suanli.db.engine import Database
from suanli.db.models import User

__all__ = ["MAX_AMOUNT", "MAX_COUNT", "REDEEM_ADDRESS", "REDEEM_USER", "BatchView", "CodeView", "Redemption",
           "batch", "batches", "codes", "create_batch", "normalise", "redeem", "redeem_with_throttle", "void"]  # fmt: skip

LENGTH = 20  # characters: 100 bits
MAX_AMOUNT = Decimal("1000000")  # one code
CENT = Decimal("0.01")
MAX_COUNT = 1000  # codes in one batch
MAX_DAYS = 3660  # the latest expiry: ten years on
NOTE_CHARS = 200
_READS = str.maketrans({"O": "0", "I": "1", "L": "1"})


def normalise(code: str) -> str | None:
    """The canonical text of a typed code (upper case, no dashes or spaces, O as 0, I and L as 1); None if it
    cannot be a code."""
    text = "".join(code.split()).replace("-", "").upper().translate(_READS)
    return text if len(text) == LENGTH and all(c in CROCKFORD for c in text) else None


def code_hash(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()


def _shown(canonical: str) -> str:
    return "-".join(canonical[i : i + 5] for i in range(0, LENGTH, 5))


@dataclass(frozen=True)
class BatchView:
    """A batch as operators list it (never its codes' text)."""

    id: str
    amount: Decimal
    count: int
    note: str
    org_id: str | None  # only this org may redeem its codes; None: any org
    created_by: str  # the operator's email
    created_at: datetime
    expires_at: datetime | None
    redeemed: int
    voided: int


@dataclass(frozen=True)
class CodeView:
    id: str
    batch_id: str
    hint: str  # the code's last 4 characters, to match a printed card to its row
    state: str  # unused | redeemed | voided | expired
    redeemed_at: datetime | None
    redeemed_by: str | None  # the user's email
    redeemed_org: str | None
    transaction_id: int | None
    voided_at: datetime | None


@dataclass(frozen=True)
class Redemption:
    code_id: str
    batch_id: str
    org_id: str
    amount: Decimal
    transaction_id: int
    transaction_key: str
    memo: str
    created_at: datetime
    balance: Decimal  # the org's balance after it


def create_batch(
    s: Session,
    who: Principal,
    amount: Decimal | str | int,
    count: int,
    now: datetime,
    *,
    expires_at: datetime | None = None,
    note: str = "",
    org: str | None = None,
) -> tuple[BatchView, list[tuple[str, str]]]:
    """A batch of `count` codes worth `amount` each (whole cents, 0 < amount <= MAX_AMOUNT), valid until
    `expires_at` (None: no expiry), for any org or only `org` (an id or a name). Returns the batch and
    `[(code id, plain code)]`: the only time the plain codes exist outside the cards they are printed on."""
    try:
        value = exact(amount)
    except (TypeError, ValueError) as e:
        raise Invalid(f"amount: {e}") from e
    if not ZERO < value <= MAX_AMOUNT or value != value.quantize(CENT):
        raise Invalid(f"amount: more than 0, at most {MAX_AMOUNT}, in whole cents")
    if not 1 <= count <= MAX_COUNT:
        raise Invalid(f"count: 1 to {MAX_COUNT}")
    if expires_at is not None and not now < expires_at <= now + timedelta(days=MAX_DAYS):
        raise Invalid(f"expires_at: after now and at most {MAX_DAYS} days on")
    if len(note) > NOTE_CHARS:
        raise Invalid(f"note: at most {NOTE_CHARS} characters")
    org_id = None
    if org is not None:
        try:
            org_id = accounts.org_by_ref(s, org).id
        except NotFound as e:
            raise NotFound(f"org: {e.message}") from None
    row = TopupBatch(id=new_id("batch"), amount=value, count=count, note=note, org_id=org_id, created_by=who.user_id,
                     created_at=now, expires_at=expires_at)  # fmt: skip
    s.add(row)
    s.flush()
    made = []
    for _ in range(count):
        plain = new_code(LENGTH)
        code = TopupCode(id=new_id("tc"), batch_id=row.id, code_hash=code_hash(plain), hint=plain[-4:])
        s.add(code)
        made.append((code.id, _shown(plain)))
    s.flush()
    return batch(s, row.id), made


def _batch_views(s: Session, where: object, limit: int) -> list[BatchView]:
    redeemed = func.sum(case((TopupCode.redeemed_at.is_not(None), 1), else_=0))
    voided = func.sum(case((TopupCode.voided_at.is_not(None), 1), else_=0))
    counts = (
        select(TopupCode.batch_id, redeemed.label("redeemed"), voided.label("voided"))
        .group_by(TopupCode.batch_id)
        .subquery()
    )
    q = (
        select(TopupBatch, User.email, counts.c.redeemed, counts.c.voided)
        .join(User, User.id == TopupBatch.created_by)
        .outerjoin(counts, counts.c.batch_id == TopupBatch.id)
        .where(where)  # type: ignore[arg-type]
        .order_by(TopupBatch.created_at.desc(), TopupBatch.id.desc())
        .limit(limit)
    )
    return [BatchView(b.id, exact(b.amount), b.count, b.note, b.org_id, email, b.created_at, b.expires_at,
                      int(r or 0), int(v or 0)) for b, email, r, v in s.execute(q)]  # fmt: skip


def batches(s: Session, limit: int = 100) -> list[BatchView]:
    """Every batch, newest first, with how many of its codes were redeemed and voided."""
    return _batch_views(s, TopupBatch.id.is_not(None), limit)


def batch(s: Session, batch_id: str) -> BatchView:
    found = _batch_views(s, TopupBatch.id == batch_id, 1)
    if not found:
        raise NotFound(f"batch: top-up code batch {batch_id} not found")
    return found[0]


def codes(s: Session, batch_id: str, now: datetime | None = None) -> list[CodeView]:
    """A batch's codes (hints, never the codes): which were redeemed, by whom, into which org, when."""
    b = s.get(TopupBatch, batch_id)
    if b is None:
        raise NotFound(f"batch: top-up code batch {batch_id} not found")
    now = now or utcnow()
    expired = b.expires_at is not None and b.expires_at <= now
    q = (
        select(TopupCode, User.email)
        .outerjoin(User, User.id == TopupCode.redeemed_by)
        .where(TopupCode.batch_id == batch_id)
        .order_by(TopupCode.id)
    )
    out = []
    for c, email in s.execute(q):
        state = ("redeemed" if c.redeemed_at is not None else "voided" if c.voided_at is not None
                 else "expired" if expired else "unused")  # fmt: skip
        out.append(CodeView(c.id, c.batch_id, c.hint, state, c.redeemed_at, email, c.redeemed_org, c.tx_id,
                            c.voided_at))  # fmt: skip
    return out


def void(s: Session, batch_id: str, now: datetime, code_ids: Sequence[str] | None = None) -> BatchView:
    """Void the batch's unredeemed codes (None), or only `code_ids` of it: nobody can redeem them from now on.
    A redeemed code cannot be voided (409: its money is the tenant's; refund it with a ledger movement)."""
    if s.get(TopupBatch, batch_id) is None:
        raise NotFound(f"batch: top-up code batch {batch_id} not found")
    q = select(TopupCode).where(TopupCode.batch_id == batch_id)
    if code_ids is not None:
        q = q.where(TopupCode.id.in_(list(code_ids)))
    rows = list(s.scalars(q.order_by(TopupCode.id).with_for_update()))
    if code_ids is not None:
        missing = set(code_ids) - {r.id for r in rows}
        if missing:
            raise NotFound(f"codes: {sorted(missing)[0]} is not a code of batch {batch_id}")
        used = [r.id for r in rows if r.redeemed_at is not None]
        if used:
            raise Conflict(f"codes: {used[0]} was redeemed already and cannot be voided")
    for r in rows:
        if r.redeemed_at is None and r.voided_at is None:
            r.voided_at = now
    s.flush()
    return batch(s, batch_id)


def redeem(s: Session, who: Principal, org_id: str, code: str, now: datetime) -> Redemption:
    """Redeem `code` into `org_id` (the caller must be a member who may spend there: owner, admin or member; or an
    operator): 404 unknown, 409 already redeemed, 410 voided or expired, 403 a code for another org. Call it inside
    the caller's write transaction, after `throttle.begin_redeem` (or use `redeem_with_throttle`)."""
    memberships.require(s, who, org_id, "spend")
    canonical = normalise(code)
    q = (
        select(TopupCode, TopupBatch)
        .join(TopupBatch, TopupBatch.id == TopupCode.batch_id)
        .where(TopupCode.code_hash == code_hash(canonical or ""))
        .with_for_update(of=TopupCode)
        .execution_options(populate_existing=True)
    )
    found = s.execute(q).first() if canonical else None
    if found is None:
        raise NotFound("code: no such top-up code (check how it was typed)")
    row, b = found
    if row.redeemed_at is not None:
        raise Conflict("code: this top-up code was redeemed already")
    if row.voided_at is not None:
        raise Gone("code: this top-up code was voided by the operator")
    if b.expires_at is not None and b.expires_at <= now:
        raise Gone(f"code: this top-up code expired at {b.expires_at.isoformat()}")
    if b.org_id is not None and b.org_id != org_id:
        raise Forbidden("code: this top-up code is for another organisation")
    taken = s.execute(
        update(TopupCode)
        .where(TopupCode.id == row.id, TopupCode.redeemed_at.is_(None), TopupCode.voided_at.is_(None))
        .values(redeemed_at=now, redeemed_by=who.user_id, redeemed_org=org_id)
        .execution_options(synchronize_session=False)
    )
    if taken.rowcount != 1:  # another transaction took it between our read and our write
        raise Conflict("code: this top-up code was redeemed already")
    memo = f"top-up code {row.id} (batch {b.id}{': ' + b.note if b.note else ''})"
    tx, _ = ledger.move(s, "topup", org_id, exact(b.amount), f"topup-code:{row.id}", now, memo, who.user_id)
    s.execute(update(TopupCode).where(TopupCode.id == row.id).values(tx_id=tx.id)
              .execution_options(synchronize_session=False))  # fmt: skip
    return Redemption(row.id, b.id, org_id, exact(b.amount), tx.id, tx.key, tx.memo, tx.created_at,
                      ledger.org_balance(s, org_id))  # fmt: skip


def redeem_with_throttle(
    db: Database, who: Principal, org_id: str, code: str, address: str, now: datetime | None = None
) -> Redemption:
    """What the API and the web console call: count the attempt against the caller's and the address's limits
    (429 past them) in a transaction of its own, so a refusal still counts, then redeem; a code that works takes
    its count back in the redemption's transaction."""
    now = now or utcnow()
    with db.write() as s, s.begin():
        attempt = throttle.begin_redeem(s, who.user_id, address, now)
    with db.write() as s, s.begin():
        done = redeem(s, who, org_id, code, now)
        throttle.redeem_succeeded(s, attempt, now)
    return done
