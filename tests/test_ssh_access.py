"""Who the SSH gateway lets in, decided over the database (both backends): a key of a member of the instance's
org, by instance id or name (`.N` for a node-rank); anything else looks the same as an unknown instance. And
what an instance that does not run answers."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from suanli.control.accounts import accounts, memberships, ssh_keys
from suanli.control.accounts.accounts import Principal
from suanli.control.ids import utcnow
from suanli.control.workloads.ssh_gateway import DbAccess, not_running, parse_username
from suanli.db.models import Workload
from suanli.ssh.keys import parse
from suanli.ssh.server import Refused
from tests.test_ssh_keys import _ed25519_text

KEY, OTHER_KEY = _ed25519_text(1), _ed25519_text(2)


def _principal(user: Any) -> Principal:
    return Principal(user.id, user.email, False, user.personal_org_id, "tok")


def _workload(s: Any, wid: str, org: str, user: str, name: str, *, kind: str = "instance", state: str = "running",
              age_s: int = 0, **kw: Any) -> None:  # fmt: skip
    now = utcnow() - timedelta(seconds=age_s)
    s.add(Workload(id=wid, org_id=org, user_id=user, name=name, kind=kind, spec={"name": name}, state=state,
                   created_at=now, submitted_at=now, queued_at=now, **kw))  # fmt: skip


@pytest.fixture
def world(db: Any) -> dict[str, Any]:
    now = utcnow()
    with db.write() as s, s.begin():
        alice, alice_org = accounts.create_user(s, "alice@example.com", "password-123", now)
        bob, _ = accounts.create_user(s, "bob@example.com", "password-123", now)
        mallory, mallory_org = accounts.create_user(s, "mallory@example.com", "password-123", now)
        team = accounts.create_org(s, _principal(alice), "team", now)
        invitation, _ = memberships.invite(s, _principal(alice), team.id, "bob@example.com", "member", None, now)
        memberships.accept(s, _principal(bob), invitation.id, now)
        ssh_keys.add(s, _principal(bob), KEY, "bob's laptop", now)
        ssh_keys.add(s, _principal(mallory), OTHER_KEY, None, now)
        _workload(s, "wl_box", team.id, alice.id, "box", executor="virtual")
        _workload(s, "wl_old_box", team.id, alice.id, "box", state="stopped", age_s=60)
        _workload(s, "wl_parked", team.id, alice.id, "parked", state="stopped", reason="stopped by alice")
        _workload(s, "wl_mine", alice_org.id, alice.id, "alices-own")
        _workload(s, "wl_evil", mallory_org.id, mallory.id, "box")
        _workload(s, "wl_job", team.id, alice.id, "train", kind="job")
    return {"bob": bob.id, "team": team.id, "alice": _principal(alice)}


def _authorize(db: Any, login: str, text: str) -> Any:
    key = parse(text)
    return asyncio.run(DbAccess(db).authorize(login, key.fingerprint, key.openssh))


def test_a_member_of_the_instances_org_gets_in_by_name_or_id(db: Any, world: dict[str, Any]) -> None:
    g = _authorize(db, "box", KEY)
    assert (g.user_id, g.email, g.workload_id, g.node_rank) == (world["bob"], "bob@example.com", "wl_box", 0)
    assert _authorize(db, "wl_box", KEY).workload_id == "wl_box"
    assert _authorize(db, "box.1", KEY).node_rank == 1
    assert _authorize(db, "wl_old_box", KEY).workload_id == "wl_old_box"  # by id: that one, even stopped


def test_other_orgs_instances_and_unknown_keys_are_refused_alike(db: Any, world: dict[str, Any]) -> None:
    assert _authorize(db, "alices-own", KEY) is None  # alice's personal org: bob is no member
    assert _authorize(db, "wl_mine", KEY) is None
    assert _authorize(db, "box", OTHER_KEY).workload_id == "wl_evil"  # mallory's own "box", not the team's
    assert _authorize(db, "wl_box", OTHER_KEY) is None
    assert _authorize(db, "nothing", KEY) is None
    assert _authorize(db, "box", _ed25519_text(3)) is None  # nobody's key
    for bad in ("", "box.", "box.x", "a" * 64, "../box", "box;id", "wl_box.1.2"):
        assert _authorize(db, bad, KEY) is None, bad
    key = parse(KEY)  # the fingerprint alone is not enough: the key itself must match
    assert asyncio.run(DbAccess(db).authorize("box", key.fingerprint, parse(OTHER_KEY).openssh)) is None


def test_a_removed_key_or_a_member_who_left_no_longer_gets_in(db: Any, world: dict[str, Any]) -> None:
    assert _authorize(db, "box", KEY) is not None
    with db.write() as s, s.begin():
        memberships.remove_member(s, world["alice"], world["team"], world["bob"])
    assert _authorize(db, "box", KEY) is None
    mallory = _authorize(db, "box", OTHER_KEY)
    with db.write() as s, s.begin():
        who = Principal(mallory.user_id, mallory.email, False, "", "tok")
        ssh_keys.remove(s, who, ssh_keys.listing(s, who)[0].id)
    assert _authorize(db, "box", OTHER_KEY) is None


def test_a_connection_whose_key_went_or_whose_user_left_opens_no_new_session(db: Any, world: dict[str, Any]) -> None:
    """A connection stays open after its key is removed (a reset removes them all) or its user leaves the org;
    every new session or forward over it (ssh's ControlMaster) asks `target` again, which then refuses."""
    access = DbAccess(db)
    grant = _authorize(db, "box", KEY)
    with pytest.raises(Refused, match="runs on virtual nodes"):  # still entitled: refused only for the executor
        asyncio.run(access.target(grant))
    with db.write() as s, s.begin():
        who = Principal(world["bob"], "bob@example.com", False, "", "tok")
        ssh_keys.remove(s, who, ssh_keys.listing(s, who)[0].id)
    with pytest.raises(Refused, match="key was removed"):
        asyncio.run(access.target(grant))
    with db.write() as s, s.begin():
        ssh_keys.add(s, who, KEY, "bob's laptop", utcnow())
        memberships.remove_member(s, world["alice"], world["team"], world["bob"])
    with pytest.raises(Refused, match="no longer"):
        asyncio.run(access.target(grant))


def test_the_grants_of_open_connections_are_revoked_with_the_key_the_membership_or_the_instance(
    db: Any, world: dict[str, Any]
) -> None:
    """The gateway re-reads every open connection's grant (`Gateway.watch`) and closes those `revoked` names, so a
    shell does not outlive its key, its user's place in the org, or its instance."""
    access = DbAccess(db)
    bob = Principal(world["bob"], "bob@example.com", False, "", "tok")
    box, rank1, evil = _authorize(db, "box", KEY), _authorize(db, "box.1", KEY), _authorize(db, "box", OTHER_KEY)
    assert asyncio.run(access.revoked([box, rank1, evil])) == {}
    with db.write() as s, s.begin():
        ssh_keys.remove(s, bob, ssh_keys.listing(s, bob)[0].id)
    gone = asyncio.run(access.revoked([box, rank1, evil]))
    assert set(gone) == {box, rank1} and "key was removed" in gone[box]  # mallory's own grant still holds
    with db.write() as s, s.begin():
        ssh_keys.add(s, bob, KEY, "bob's laptop", utcnow())  # the same key again: the grant holds again
    assert asyncio.run(access.revoked([box])) == {}
    with db.write() as s, s.begin():
        memberships.set_member(s, world["alice"], world["team"], world["bob"], role="viewer")
    assert "no longer a member" in asyncio.run(access.revoked([box]))[box]
    with db.write() as s, s.begin():
        memberships.set_member(s, world["alice"], world["team"], world["bob"], role="member")
        s.delete(s.get(Workload, "wl_box"))
    assert asyncio.run(access.revoked([box])) == {box: "instance box no longer exists"}
    assert asyncio.run(access.revoked([])) == {}


def test_a_viewer_of_the_org_does_not_get_in(db: Any, world: dict[str, Any]) -> None:
    assert _authorize(db, "box", KEY) is not None
    with db.write() as s, s.begin():
        memberships.set_member(s, world["alice"], world["team"], world["bob"], role="viewer")
    assert _authorize(db, "box", KEY) is None  # a viewer reads only: no shell into the team's instances


def test_what_an_instance_that_does_not_run_answers(db: Any, world: dict[str, Any]) -> None:
    access = DbAccess(db)
    parked = _authorize(db, "parked", KEY)
    with pytest.raises(Refused, match=r"^instance parked is stopped; `suanli start parked`$"):
        asyncio.run(access.target(parked))
    with pytest.raises(Refused, match="train is a job, not an instance"):
        asyncio.run(access.target(_authorize(db, "train", KEY)))
    with pytest.raises(Refused, match="runs on virtual nodes, where there is nothing to enter"):
        asyncio.run(access.target(_authorize(db, "box", KEY)))


def test_usernames_and_state_messages() -> None:
    assert parse_username("my-box") == ("my-box", 0)
    assert parse_username("wl_0123abcd.3") == ("wl_0123abcd", 3)
    assert parse_username("my box") is None and parse_username("x.-1") is None

    def w(state: str, **kw: Any) -> Workload:
        return Workload(name="b", kind="instance", state=state, reason=kw.get("reason", ""),
                        pending_reason=kw.get("pending", ""))  # fmt: skip

    assert not_running(w("running")) is None
    assert not_running(w("pending", pending="needs 1 H100")) == (
        "instance b is pending (needs 1 H100); it can be entered once it runs")  # fmt: skip
    assert not_running(w("starting")) == "instance b is starting; try again in a few seconds"
    assert not_running(w("failed", reason="exit code 3")) == "instance b is failed (exit code 3); `suanli start b`"
    assert not_running(w("preempted", reason="for on-demand work")).startswith("instance b is preempted (for")
