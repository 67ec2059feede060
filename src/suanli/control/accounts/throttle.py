"""Login and signup throttling, kept in the database so every server process counts the same attempts.

Each bucket is a generic cell rate (a leaky bucket stored as one time, `tat`: when it is empty again). A bucket of
capacity C and period P takes C attempts at once and one more every P seconds; its level is `(tat - now) / P`.

A password login counts against three buckets *before* the password is checked (so concurrent guesses cannot
slip past the limit), and a correct password takes its count back:

- the account from this address (`PAIR`): 5 failures, then one more a minute;
- this address, any account (`ADDRESS`): 50 failures, then one more every 20 s;
- the account, any address (`ACCOUNT`): once it holds 20 failures the account is *under attack*, and then an
  address that has failed a login to it in the last `QUIET_S` (15 minutes) waits out the rest of that time;
  an address that has not is let through. The bucket holds at most 20 (one more failure a minute leaks away),
  so the state ends a minute after the failures stop: nobody can keep the account's owner out, and a botnet gets
  one guess per address per 15 minutes.

Emails that belong to nobody are counted exactly like real ones: a refusal says nothing about who is registered.
Signups count per address (`signup_bucket`). Top-up code redemptions count per user (`REDEEM_USER`: 10, then one more
a minute) and per address (`REDEEM_ADDRESS`: 30, then one more every 20 s) before the code is looked up, and a code
that works takes its count back (`begin_redeem`, `redeem_succeeded`). Other per-user limits (verification e-mails
asked for) use `count`. Keys are SHA-256 digests of the email and the address.

An address is counted as `counted_address` says: an IPv4 address as it is (also written as IPv6, `::ffff:a.b.c.d`),
an IPv6 address by its /64. A host is given a whole /64 and may use any address in it: counted one by one, it would
never meet a per-address limit.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from suanli.control.errors import ServiceError
from suanli.db.access import LoginThrottle


@dataclass(frozen=True)
class Bucket:
    capacity: int  # attempts at once
    period_s: float  # then one more every period

    @property
    def span(self) -> timedelta:
        return timedelta(seconds=self.capacity * self.period_s)

    @property
    def step(self) -> timedelta:
        return timedelta(seconds=self.period_s)


PAIR = Bucket(5, 60.0)
ADDRESS = Bucket(50, 20.0)
ACCOUNT = Bucket(20, 60.0)
QUIET_S = 900.0
REDEEM_USER = Bucket(10, 60.0)
REDEEM_ADDRESS = Bucket(30, 20.0)


def signup_bucket(per_hour: int) -> Bucket:
    """`per_hour` signups from one address at once, then one more every 3600 / `per_hour` seconds."""
    return Bucket(per_hour, 3600.0 / per_hour)


class Throttled(ServiceError):
    """429 with the seconds to wait (Retry-After)."""

    status = 429

    def __init__(self, message: str, retry_after: float) -> None:
        self.retry_after = max(1, math.ceil(retry_after))
        super().__init__(f"{message}; try again in {self.retry_after} s")


def counted_address(address: str) -> str:
    """What the per-address limits count `address` as: IPv4 as it is, IPv6 by its /64, anything else as given."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # a zone (fe80::1%eth0) names a link, not a host
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _key(kind: str, *parts: str) -> str:
    return hashlib.sha256("\x00".join((kind, *parts)).encode()).hexdigest()


@dataclass(frozen=True)
class LoginAttempt:
    """The buckets one login attempt was counted in, so a correct password can take the count back."""

    pair: str
    address: str
    account: str


def _rows(s: Session, keys: list[str], now: datetime) -> dict[str, LoginThrottle]:
    """The buckets `keys`, created empty where missing, locked for this transaction in key order (two attempts that
    share buckets take them in one order: no deadlock). Forgotten buckets (past their `expires_at`) are swept on the
    way, so the table holds only what still counts."""
    insert = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    values = [{"key": k, "tat": now, "last_failure_at": None, "expires_at": now} for k in sorted(keys)]
    upsert = insert(LoginThrottle).values(values)
    # DO UPDATE (changing nothing), not DO NOTHING: it locks a bucket that exists as it meets it, so no other
    # attempt's sweep can delete it before we hold it (we would then find it gone: a KeyError, a 500).
    s.execute(upsert.on_conflict_do_update(index_elements=["key"], set_={"tat": LoginThrottle.tat}))
    q = select(LoginThrottle).where(LoginThrottle.key.in_(keys)).order_by(LoginThrottle.key).with_for_update()
    rows = {r.key: r for r in s.scalars(q.execution_options(populate_existing=True))}
    # The sweep comes last and skips what others hold: it never waits, so it closes no cycle of waits.
    forgotten = (select(LoginThrottle.key).where(LoginThrottle.expires_at < now, LoginThrottle.key.not_in(keys))
                 .with_for_update(skip_locked=True))  # fmt: skip
    s.execute(
        delete(LoginThrottle).where(LoginThrottle.key.in_(forgotten)).execution_options(synchronize_session=False)
    )
    return rows


def _next(row: LoginThrottle, bucket: Bucket, now: datetime) -> tuple[datetime, float]:
    """The bucket's `tat` after one more attempt, and how many seconds over its capacity that would be."""
    tat = max(row.tat, now) + bucket.step
    return tat, (tat - now - bucket.span).total_seconds()


def begin_login(s: Session, email: str, address: str, now: datetime) -> LoginAttempt:
    """Count a login attempt for `email` (normalised) from `address`, or refuse it with 429 (`Throttled`)."""
    address = counted_address(address)
    attempt = LoginAttempt(_key("pair", email, address), _key("address", address), _key("account", email))
    rows = _rows(s, [attempt.pair, attempt.address, attempt.account], now)
    pair, addr, account = rows[attempt.pair], rows[attempt.address], rows[attempt.account]
    pair_tat, pair_over = _next(pair, PAIR, now)
    addr_tat, addr_over = _next(addr, ADDRESS, now)
    account_tat, account_over = _next(account, ACCOUNT, now)
    if pair_over > 0:
        raise Throttled("too many failed logins to this account from your address", pair_over)
    if addr_over > 0:
        raise Throttled("too many failed logins from your address", addr_over)
    if account_over > 0 and pair.last_failure_at is not None:
        quiet = (pair.last_failure_at + timedelta(seconds=QUIET_S) - now).total_seconds()
        if quiet > 0:
            raise Throttled("this account is being guessed at from many addresses, and a login from your address "
                            "failed lately", quiet)  # fmt: skip
    quiet_until = now + timedelta(seconds=QUIET_S)
    pair.tat, pair.last_failure_at, pair.expires_at = pair_tat, now, max(pair_tat, quiet_until)
    addr.tat = addr.expires_at = addr_tat
    account.tat = account.expires_at = min(account_tat, now + ACCOUNT.span)  # it never holds more than its capacity
    return attempt


def login_succeeded(s: Session, attempt: LoginAttempt, now: datetime) -> None:
    """A correct password: this address's failures for the account are forgiven, and the attempt's count is taken
    back from the address's and the account's buckets."""
    keys = [attempt.pair, attempt.address, attempt.account]
    q = select(LoginThrottle).where(LoginThrottle.key.in_(keys)).order_by(LoginThrottle.key).with_for_update()
    rows = {r.key: r for r in s.scalars(q.execution_options(populate_existing=True))}
    for key, bucket in ((attempt.address, ADDRESS), (attempt.account, ACCOUNT)):
        if key in rows:
            rows[key].tat = rows[key].expires_at = max(now, rows[key].tat - bucket.step)
    if attempt.pair in rows:
        s.delete(rows[attempt.pair])


def begin_signup(s: Session, address: str, bucket: Bucket, now: datetime) -> None:
    """Count a signup from `address`, or refuse it with 429."""
    key = _key("signup", counted_address(address))
    row = _rows(s, [key], now)[key]
    tat, over = _next(row, bucket, now)
    if over > 0:
        raise Throttled("too many signups from your address", over)
    row.tat = row.expires_at = tat


def count(s: Session, key: tuple[str, ...], bucket: Bucket, now: datetime, message: str) -> None:
    """Count one more action in the bucket named by `key` (a kind, then its values), or refuse it with 429."""
    k = _key(*key)
    row = _rows(s, [k], now)[k]
    tat, over = _next(row, bucket, now)
    if over > 0:
        raise Throttled(message, over)
    row.tat = row.expires_at = tat


@dataclass(frozen=True)
class RedeemAttempt:
    """The buckets one top-up code attempt was counted in, so a code that works can take the count back."""

    user: str
    address: str


def begin_redeem(s: Session, user_id: str, address: str, now: datetime) -> RedeemAttempt:
    """Count an attempt to redeem a top-up code by `user_id` from `address`, or refuse it with 429 (`Throttled`).
    Commit it before the code is looked up: a failed redemption rolls its own transaction back."""
    attempt = RedeemAttempt(_key("redeem-user", user_id), _key("redeem-address", counted_address(address)))
    rows = _rows(s, [attempt.user, attempt.address], now)
    user, addr = rows[attempt.user], rows[attempt.address]
    user_tat, user_over = _next(user, REDEEM_USER, now)
    addr_tat, addr_over = _next(addr, REDEEM_ADDRESS, now)
    if user_over > 0:
        raise Throttled("code: too many top-up codes tried that did not work", user_over)
    if addr_over > 0:
        raise Throttled("code: too many top-up codes tried from your address", addr_over)
    user.tat = user.expires_at = user_tat
    addr.tat = addr.expires_at = addr_tat
    return attempt


def redeem_succeeded(s: Session, attempt: RedeemAttempt, now: datetime) -> None:
    """A code that worked: its attempt is taken back from both buckets (redeeming many real codes is not guessing)."""
    keys = [attempt.user, attempt.address]
    q = select(LoginThrottle).where(LoginThrottle.key.in_(keys)).order_by(LoginThrottle.key).with_for_update()
    rows = {r.key: r for r in s.scalars(q.execution_options(populate_existing=True))}
    for key, bucket in ((attempt.user, REDEEM_USER), (attempt.address, REDEEM_ADDRESS)):
        if key in rows:
            rows[key].tat = rows[key].expires_at = max(now, rows[key].tat - bucket.step)
