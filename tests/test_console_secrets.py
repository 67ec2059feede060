"""The console's one-time secrets in the database (`control/accounts/console_secrets.py`), on both backends: a
secret is shown once, to the session that made it, on the page it waits for; it expires; a session and the table
are bounded; of two requests racing for it exactly one gets it; a junk or tampered key shows nothing."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from suanli.control.accounts import console_secrets
from suanli.control.ids import utcnow
from suanli.db.models import ConsoleSecret
from tests.concurrency import at_once

T0 = utcnow()


def _at(i: float) -> datetime:
    return T0 + timedelta(seconds=i)


def _put(db: Any, owner: str, page: str, payload: Any, i: float, **bounds: int) -> str:
    with db.write() as s, s.begin():
        return console_secrets.hold(s, owner, page, payload, _at(i), **bounds)


def _take(db: Any, key: str, owner: str, page: str, i: float) -> tuple[str, Any]:
    with db.write() as s, s.begin():
        return console_secrets.take(s, key, owner, page, _at(i))


def _count(db: Any) -> int:
    with db.read() as s:
        return console_secrets.count(s)


def test_the_store_expires_and_bounds_secrets_per_session_and_in_all(db: Any) -> None:
    bounds = {"ttl_s": 300, "per_session": 2, "total": 3}
    a1, a2, a3 = (_put(db, "a", "/keys", n, n, **bounds) for n in range(3))
    assert _take(db, a1, "a", "/keys", 3) == ("lost", None)  # the session's oldest went first
    assert _take(db, a2, "b", "/keys", 3) == ("lost", None)  # another owner: nothing, and it stays
    assert _take(db, a2, "a", "/team", 3) == ("elsewhere", None)
    b1, b2 = _put(db, "b", "/keys", "b1", 4, **bounds), _put(db, "b", "/keys", {"x": [1, "2"]}, 5, **bounds)
    assert _take(db, a2, "a", "/keys", 6) == ("lost", None)  # the oldest of all went first
    assert _take(db, a3, "a", "/keys", 6) == ("shown", 2) and _take(db, a3, "a", "/keys", 6) == ("lost", None)
    assert _take(db, b2, "b", "/keys", 304) == ("shown", {"x": [1, "2"]})
    assert _take(db, b1, "b", "/keys", 305) == ("lost", None)  # expired (made at 4, for 300 s)
    for n in range(20):
        _put(db, f"o{n}", "/keys", n, 400 + n, **bounds)
    assert _count(db) == 3


def _race(db: Any, key: str, i: float) -> list[tuple[str, Any]]:
    """Two threads take `key` at once."""
    got, errors = at_once(*(lambda: _take(db, key, "race", "/keys", i) for _ in range(2)), timeout_s=30)
    assert not errors, errors
    return got


def test_two_requests_racing_for_one_secret_show_it_once(db: Any) -> None:
    for n in range(5):
        got = _race(db, _put(db, "race", "/keys", {"token": f"t{n}"}, n), n + 0.5)
        assert sorted(o for o, _ in got) == ["lost", "shown"], got
        assert [p for o, p in got if o == "shown"] == [{"token": f"t{n}"}]


def test_a_junk_or_tampered_key_or_row_shows_nothing_and_never_raises(db: Any) -> None:
    key = _put(db, "o", "/keys", "secret", 0)
    flipped = ("A" if key[0] != "A" else "B") + key[1:]
    for junk in ("", "x" * 43, "x" * 44, "!" * 43, key[:-1], flipped, key + "A", "é" * 43):
        assert _take(db, junk, "o", "/keys", 1) == ("lost", None), junk
    with db.write() as s, s.begin():  # a row edited in the database (its ciphertext, or moved to another page)
        row = s.scalars(select(ConsoleSecret)).one()
        s.execute(update(ConsoleSecret).values(sealed=bytes(row.sealed[:-1]) + bytes([row.sealed[-1] ^ 1])))
    assert _take(db, key, "o", "/keys", 1) == ("lost", None)
    assert _count(db) == 0  # a tampered row is taken (gone), not left to be tried again


def test_holds_at_once_on_a_full_table_keep_the_bounds_and_never_deadlock(db: Any) -> None:
    """Attack: many sessions making secrets at once while the table is at its bound. Each hold evicts the oldest; on
    PostgreSQL, evictions that picked overlapping rows in different orders deadlocked, and holds that counted at the
    same time all inserted past the bounds. Holds take turns now."""
    bounds = {"per_session": 2, "total": 10}

    def holder(n: int) -> None:
        for i in range(15):
            _put(db, f"owner{n % 4}", "/keys", i, n + i / 100, **bounds)

    _, errors = at_once(*(lambda n=n: holder(n) for n in range(8)))  # any failure of a hold is the finding
    assert not errors, errors[:3]
    with db.read() as s:
        owners = list(s.scalars(select(ConsoleSecret.owner)))
    assert len(owners) <= 8 and all(owners.count(o) <= 2 for o in set(owners)), owners


def test_a_row_too_short_to_hold_a_sealed_secret_is_lost_not_a_500(db: Any) -> None:
    key = _put(db, "o", "/keys", "secret", 0)
    with db.write() as s, s.begin():
        s.execute(update(ConsoleSecret).values(sealed=b"\x00" * 5))
    assert _take(db, key, "o", "/keys", 1) == ("lost", None)


def test_looking_changes_nothing(db: Any) -> None:
    key = _put(db, "o", "/keys", "secret", 0)
    with db.read() as s:
        seen = [console_secrets.look(s, k, o, p, _at(1)) for k, o, p in
                ((key, "o", "/keys"), (key, "o", "/team"), (key, "x", "/keys"), ("junk", "o", "/keys"))]  # fmt: skip
    assert seen == ["shown", "elsewhere", "lost", "lost"]
    assert _take(db, key, "o", "/keys", 2) == ("shown", "secret")
