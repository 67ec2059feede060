"""Invitations made out to an address are answered only by whoever proved the mailbox, where the server sends mail
(`smtp_url`) and so can tell a proven address from a claimed one. Found by a hostile review: a signup with a
colleague's address (made before the colleague's own) saw every invitation to it, with the org's name, the
inviter's address and the role, and accepted them, as admin or owner; on both databases."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.control_plane import signup
from tests.mail_helpers import Inbox, inbox_fixture, mail_api_fixture  # noqa: F401  (fixtures inbox and mail_api)

API = "/api/v1"


def test_an_unproven_address_neither_sees_nor_answers_invitations_and_a_proven_one_does(
    mail_api: TestClient, inbox: Inbox
) -> None:
    owner = signup(mail_api, "owner@corp.example")
    org = mail_api.post(f"{API}/orgs", json={"name": "corp-lab"}, headers=owner.headers).json()["id"]
    inv = mail_api.post(f"{API}/orgs/{org}/invitations", json={"email": "newhire@corp.example", "role": "admin"},
                        headers=owner.headers)  # fmt: skip
    assert inv.status_code == 201, inv.text
    squatter = signup(mail_api, "newhire@corp.example", "squatter-password")  # never reads that mailbox
    assert mail_api.get(f"{API}/me", headers=squatter.headers).json()["email_verified"] is False
    assert mail_api.get(f"{API}/invitations", headers=squatter.headers).json() == []
    for verb in ("accept", "decline"):
        r = mail_api.post(f"{API}/invitations/{inv.json()['id']}/{verb}", headers=squatter.headers)
        assert r.status_code == 403 and "verify your address" in r.text, (verb, r.text)
    members = mail_api.get(f"{API}/orgs/{org}/members", headers=owner.headers).json()
    assert "newhire@corp.example" not in {m["email"] for m in members}

    # whoever reads the mailbox proves it with the link mailed there, and then answers
    mails = inbox.wait(2)
    link = next(i for i, (to, _) in enumerate(mails) if "newhire@corp.example" in to)
    r = mail_api.post(f"{API}/verify", json={"token": inbox.token(link)})
    assert r.status_code == 200, r.text
    (listed,) = mail_api.get(f"{API}/invitations", headers=squatter.headers).json()
    assert listed["role"] == "admin"
    assert mail_api.post(f"{API}/invitations/{listed['id']}/accept", headers=squatter.headers).status_code == 200
