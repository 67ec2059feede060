"""Each org's sandboxes run as a uid no other org has: the attack is two orgs whose ids hash alike.

A root server runs an org's sandboxes, and owns its volumes' live trees, as one uid per org. That uid was
`BASE + crc32(org id) % 2^24`, and two ids with the same hash shared it: the second org's processes and files were
the first's to signal and write, wherever a path was shared. Both databases.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from suanli.control.accounts import accounts
from suanli.control.accounts.accounts import Principal
from suanli.control.storage import volumes
from suanli.db.models import Org
from suanli.sandbox.bwrap import SANDBOX_UID_BASE, SANDBOX_UID_SPAN
from suanli.workloads.spec import parse_spec

NOW = datetime(2026, 12, 5, tzinfo=UTC)
# Two org ids of the form new_id makes whose crc32s are equal modulo 2^24 (found by counting up).
TWINS = ("org_000000000008f18c", "org_00000000000b1000")


def test_the_twins_hash_alike() -> None:
    a, b = (zlib.crc32(x.encode()) % SANDBOX_UID_SPAN for x in TWINS)
    assert a == b


@pytest.fixture
def twin_ids(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`new_id("org")` hands out the twins, in order; every other id as usual."""
    given = iter(TWINS)
    real = accounts.new_id
    monkeypatch.setattr(accounts, "new_id", lambda prefix: next(given) if prefix == "org" else real(prefix))
    yield


def _users(db: Any) -> list[tuple[str, str]]:
    """(user id, personal org id) of two sign-ups whose org ids are the twins."""
    out = []
    with db.write() as s, s.begin():
        for email in ("first@example.com", "second@example.com"):
            user, org = accounts.create_user(s, email, "a long password", NOW, trial_credit=Decimal(100),
                                             password_hash="x")  # fmt: skip
            out.append((user.id, org.id))
    return out


def test_orgs_whose_ids_hash_alike_get_different_uids(db: Any, twin_ids: None) -> None:
    people = _users(db)
    assert [o for _, o in people] == list(TWINS)
    with db.read() as s:
        uids = [s.get(Org, o).sandbox_uid for o in TWINS]
    assert uids[0] != uids[1]
    assert all(SANDBOX_UID_BASE <= u < SANDBOX_UID_BASE + SANDBOX_UID_SPAN for u in uids)
    # The first keeps the uid its id gives, so an org made before the column existed keeps its files' owner.
    assert uids[0] == SANDBOX_UID_BASE + zlib.crc32(TWINS[0].encode()) % SANDBOX_UID_SPAN


def test_a_team_org_hashing_like_a_personal_one_gets_its_own_uid(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with db.write() as s, s.begin():
        monkeypatch.setattr(accounts, "new_id", lambda p, real=accounts.new_id: TWINS[0] if p == "org" else real(p))
        user, _ = accounts.create_user(s, "owner@example.com", "a long password", NOW, password_hash="x")
        monkeypatch.setattr(accounts, "new_id", lambda p, real=accounts.new_id: TWINS[1] if p == "org" else real(p))
        who = Principal(user.id, user.email, False, user.personal_org_id, "tok")
        team = accounts.create_org(s, who, "the-team", NOW)
        assert team.sandbox_uid is not None and team.sandbox_uid != s.get(Org, TWINS[0]).sandbox_uid


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root server hands volumes to sandbox uids; CI runs as root")
def test_each_orgs_volume_is_owned_by_its_own_uid(db: Any, twin_ids: None, tmp_path: Path) -> None:
    people = _users(db)
    lim = volumes.Limits(tmp_path / "volumes", 1 << 30, 10, 1000)
    owners = []
    with db.write() as s, s.begin():
        for user_id, org_id in people:
            who = Principal(user_id, "x@example.com", False, org_id, "tok")
            v = volumes.create(s, who, "data", "1GiB", None, "local", lim, NOW)
            owners.append((volumes.paths(lim, v).data.stat().st_uid, s.get(Org, org_id).sandbox_uid))
    assert [have for have, _ in owners] == [want for _, want in owners]
    assert owners[0][0] != owners[1][0]


def test_a_sandbox_request_runs_as_the_uid_it_is_given() -> None:
    from suanli.control.workloads.sandboxes import SandboxPolicy

    spec = parse_spec({"name": "t", "command": "true", "resources": {"gpus": 0}})
    req = SandboxPolicy().request(spec, SANDBOX_UID_BASE + 7, is_admin=False)
    assert req is not None and (req.uid, req.gid) == (SANDBOX_UID_BASE + 7, SANDBOX_UID_BASE + 7)
