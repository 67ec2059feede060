"""Issue: a preempted tenant was shown the other org's workload name and id ("preempted for bg-223 (wl_1c19…)"),
and error bodies showed the database's constraint names. Attacks first; in-process on both databases."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.control_plane import signup
from tests.test_resize_virtual import API, make_cluster


def _spec(name: str, billing: str) -> dict[str, Any]:
    return {"name": name, "command": "x", "duration": 3600, "billing": billing,
            "resources": {"gpu": "H20", "gpus": 16}}  # fmt: skip


def test_a_preempted_tenant_is_not_told_what_the_other_tenant_runs(api: TestClient) -> None:
    c = make_cluster(api)  # 16 H20
    mallory = signup(api, "mallory@example.com")
    r = api.post(f"{API}/admin/orgs/{mallory.org_id}/transactions", headers=c.admin,
                 json={"kind": "topup", "amount": "5000"})  # fmt: skip
    assert r.status_code == 201, r.text
    victim = c.submit(_spec("victim-spot", "spot"), t=0)
    c.tick(1)
    assert c.get(victim)["state"] == "running"
    secret = c.submit(_spec("secret-project-x", "on-demand"), t=2, who=mallory)
    for t in (3, 4, 5, 6):
        c.tick(t)
    seen = c.get(victim)
    said = " ".join([seen["reason"], *(e["reason"] for e in seen["events"])])
    assert "preempt" in said, said  # it was preempted, and it is told so
    assert "secret-project-x" not in said and secret not in said, said
    assert "another tenant" in said, said
    # Within one org the name is useful and shown.
    mine = c.submit(_spec("mine-spot", "spot"), t=10, who=mallory)
    api.post(f"{API}/workloads/{secret}/stop", headers=mallory.headers)
    for t in (11, 12, 13, 14):
        c.tick(t)
    assert c.get(mine, who=mallory)["state"] == "running"
    own = c.submit(_spec("own-urgent", "on-demand"), t=15, who=mallory)
    for t in (16, 17, 18, 19):
        c.tick(t)
    doc = c.get(mine, who=mallory)
    said = " ".join([doc["reason"], *(e["reason"] for e in doc["events"])])
    assert f"own-urgent ({own})" in said, said


def test_a_database_conflict_does_not_show_constraint_names() -> None:
    """Two orgs racing for one name are caught by the UNIQUE index; the answer names the field, never the index."""
    from sqlalchemy.exc import IntegrityError

    from suanli.api.app import _conflict_message

    for raw in (
        'duplicate key value violates unique constraint "uq_orgs_name"\nDETAIL:  Key (name)=(x) exists.',
        "UNIQUE constraint failed: orgs.name",
    ):
        text = _conflict_message(IntegrityError("INSERT INTO orgs ...", {}, Exception(raw)))
        assert text == "name: already taken; choose another", text
    text = _conflict_message(IntegrityError("INSERT", {}, Exception('violates foreign key constraint "fk_x_y_z"')))
    assert "fk_" not in text and "constraint" not in text and "INSERT" not in text, text
    for raw in (  # a value the server picks (two orgs made at once drew one sandbox uid): nothing to choose again
        'duplicate key value violates unique constraint "ix_orgs_sandbox_uid"\nDETAIL:  Key (sandbox_uid)=(1) exists.',
        "UNIQUE constraint failed: orgs.sandbox_uid",
    ):
        text = _conflict_message(IntegrityError("INSERT INTO orgs ...", {}, Exception(raw)))
        assert text == "conflicts with existing data; try again", text
