"""A public key belongs to one account, and a login by name never lands in an instance the user did not mean.

The attack (a hostile review): anyone could add anyone's public key (they are public: github.com/<user>.keys) to
their own account; a login by instance name then resolved over the squatter's orgs too, so bob's `ssh box@gateway`
with his own private key landed in mallory's newer instance named `box`, and what he typed and copied went to her.
Both databases.
"""

from __future__ import annotations

from typing import Any

import pytest

from suanli.control.accounts import accounts, memberships, ssh_keys
from suanli.control.errors import Conflict
from suanli.control.ids import utcnow
from suanli.db.models import SshKey, User
from tests.test_ssh_access import KEY, _authorize, _principal, _workload, world  # noqa: F401  (world: the fixture)


def test_a_key_another_account_holds_is_refused(db: Any, world: dict[str, Any]) -> None:  # noqa: F811
    with db.write() as s, s.begin():
        mallory = s.query(User).filter_by(email="mallory@example.com").one()
        with pytest.raises(Conflict, match=r"public_key: .*another account"):
            ssh_keys.add(s, _principal(mallory), KEY, "bob's key, copied", utcnow())


def test_a_key_two_accounts_hold_from_before_logs_in_by_id_only(db: Any, world: dict[str, Any]) -> None:  # noqa: F811
    """A key two accounts held before the rule: a login by name is ambiguous and refused; by id it enters only an
    instance the key's holders may enter."""
    with db.write() as s, s.begin():
        mallory = s.query(User).filter_by(email="mallory@example.com").one()
        bob_key = s.query(SshKey).filter_by(public_key=KEY.split(" ", 2)[0] + " " + KEY.split()[1]).first()
        assert bob_key is not None
        s.add(SshKey(id="key_squat", user_id=mallory.id, name="copied", algorithm=bob_key.algorithm,
                     public_key=bob_key.public_key, fingerprint=bob_key.fingerprint, created_at=utcnow()))  # fmt: skip
        _workload(s, "wl_trap", mallory.personal_org_id, mallory.id, "box")  # newer than the team's "box"
    assert _authorize(db, "box", KEY) is None
    assert _authorize(db, "wl_box", KEY).workload_id == "wl_box"


def test_a_name_in_two_of_the_users_orgs_is_refused_not_guessed(db: Any, world: dict[str, Any]) -> None:  # noqa: F811
    """An admin of any org the user joined could otherwise name an instance like the user's own to catch logins."""
    now = utcnow()
    with db.write() as s, s.begin():
        mallory = s.query(User).filter_by(email="mallory@example.com").one()
        bob = s.query(User).filter_by(email="bob@example.com").one()
        lure = accounts.create_org(s, _principal(mallory), "lure", now)
        invitation, _ = memberships.invite(s, _principal(mallory), lure.id, "bob@example.com", "member", None, now)
        memberships.accept(s, _principal(bob), invitation.id, now)
        _workload(s, "wl_lure_box", lure.id, mallory.id, "box")
    assert _authorize(db, "box", KEY) is None
    assert _authorize(db, "wl_box", KEY).workload_id == "wl_box"
