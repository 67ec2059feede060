"""SSH public keys: checked at the edge (allowed algorithms and sizes, one key, bounded), per user, and every
mistake is a 4xx naming the field, never a 500. Also the SDK calls and GET /ssh."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suanli.control.accounts.ssh_keys import MAX_KEYS_PER_USER
from suanli.ssh.keys import MAX_KEY_CHARS, BadKey, parse
from tests.control_plane import InProcess, signup
from tests.ssh_helpers import keygen

API = "/api/v1"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Public (and one private) keys made by ssh-keygen."""
    d = tmp_path_factory.mktemp("keys")
    try:
        made = {"ed25519": keygen(d / "ed"), "ecdsa": keygen(d / "ec", "ecdsa"), "rsa": keygen(d / "rsa", "rsa", 2048),
                "rsa1024": keygen(d / "rsa1k", "rsa", 1024), "other": keygen(d / "other")}  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"ssh-keygen is needed (apt-get install openssh-client): {e}")
    out = {k: Path(f"{p}.pub").read_text() for k, p in made.items()}
    out["private"] = made["ed25519"].read_text()
    return out


def test_allowed_keys_parse_to_their_openssh_form_and_fingerprint(keys: dict[str, str]) -> None:
    for kind, algorithm in (("ed25519", "ssh-ed25519"), ("ecdsa", "ecdsa-sha2-nistp256"), ("rsa", "ssh-rsa")):
        k = parse(keys[kind])
        assert k.algorithm == algorithm and k.openssh == " ".join(keys[kind].split()[:2])
        assert k.fingerprint.startswith("SHA256:") and k.comment
    for text, why in ((keys["rsa1024"], "RSA keys need 2048"), (keys["private"], "private key"),
                      ("ssh-ed25519 AAAA", "not an OpenSSH public key"), ("", "one public key"),
                      (keys["ed25519"] + keys["other"], "one public key"), ("x" * (MAX_KEY_CHARS + 1), "at most")):  # fmt: skip
        with pytest.raises(BadKey, match=why):
            parse(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300) | st.builds(lambda s: "ssh-ed25519 " + s, st.text(max_size=200)))
def test_any_text_is_a_key_or_a_bad_key_never_a_crash(text: str) -> None:
    try:
        parse(text)
    except BadKey as e:
        assert str(e).startswith("public_key: ")


def test_keys_are_added_listed_and_removed_per_user(api: Any, keys: dict[str, str]) -> None:
    me, other = signup(api, "me@example.com"), signup(api, "other@example.com")
    r = api.post(f"{API}/keys", json={"password": "tenant-password", "public_key": keys["ed25519"]}, headers=me.headers)
    assert r.status_code == 201, r.text
    first = r.json()
    assert first["name"] == "ed" and first["algorithm"] == "ssh-ed25519" and first["id"].startswith("key_")
    r = api.post(
        f"{API}/keys",
        json={"password": "tenant-password", "public_key": keys["rsa"], "name": "laptop"},
        headers=me.headers,
    )
    assert r.status_code == 201 and r.json()["name"] == "laptop"
    # the same key twice: 409 naming the key it already is; another user may not add it (a key is one account's)
    r = api.post(f"{API}/keys", json={"password": "tenant-password", "public_key": keys["ed25519"]}, headers=me.headers)
    assert r.status_code == 409 and first["id"] in r.json()["detail"]
    r = api.post(
        f"{API}/keys", json={"password": "tenant-password", "public_key": keys["ed25519"]}, headers=other.headers
    )
    assert r.status_code == 409 and "another account" in r.json()["detail"] and first["id"] not in r.text
    listed = api.get(f"{API}/keys", headers=me.headers).json()
    assert [k["name"] for k in listed] == ["ed", "laptop"]
    # another user's key does not exist for me
    r = api.post(
        f"{API}/keys", json={"password": "tenant-password", "public_key": _ed25519_text(77)}, headers=other.headers
    )
    assert r.status_code == 201, r.text
    theirs = r.json()["id"]
    assert api.delete(f"{API}/keys/{theirs}", headers=me.headers).status_code == 404
    assert api.delete(f"{API}/keys/{first['id']}", headers=me.headers).status_code == 200
    assert [k["name"] for k in api.get(f"{API}/keys", headers=me.headers).json()] == ["laptop"]
    assert api.delete(f"{API}/keys/{first['id']}", headers=me.headers).status_code == 404
    assert len(api.get(f"{API}/keys", headers=other.headers).json()) == 1


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"public_key": "RSA1024"}, 422, "public_key: RSA keys need 2048"),
        ({"public_key": "PRIVATE"}, 422, "public_key: this is a private key"),
        ({"public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5"}, 422, "public_key: not an OpenSSH public key"),
        ({"public_key": "ssh-dss AAAAB3NzaC1kc3M="}, 422, "public_key: "),
        ({"public_key": "x" * 9000}, 422, "public_key"),
        ({"public_key": "ssh-ed25519 AAAA\u0000"}, 422, "public_key"),
        ({"public_key": ""}, 422, "public_key"),
        ({"public_key": "ED25519", "name": "n" * 129}, 422, "name"),
        ({"public_key": "ED25519", "name": "   "}, 422, "name: 1 to 128"),
        ({"public_key": "ED25519", "comment": "x"}, 422, "comment"),
        ({"name": "no key"}, 422, "public_key"),
        ({"public_key": 7}, 422, "public_key"),
    ],
)
def test_every_mistake_is_a_4xx_naming_the_field(
    api: Any, keys: dict[str, str], body: dict[str, Any], status: int, field: str
) -> None:
    me = signup(api, "me@example.com")
    stand_in = {"RSA1024": keys["rsa1024"], "PRIVATE": keys["private"], "ED25519": keys["ed25519"]}
    if body.get("public_key") in stand_in:
        body = {**body, "public_key": stand_in[body["public_key"]]}
    r = api.post(f"{API}/keys", json={**body, "password": "tenant-password"}, headers=me.headers)
    assert r.status_code == status and field in r.json()["detail"], r.text
    assert api.get(f"{API}/keys", headers=me.headers).json() == []


def test_a_user_holds_at_most_so_many_keys(api: Any, tmp_path: Path) -> None:
    from suanli.control.accounts import ssh_keys

    me = signup(api, "me@example.com")
    first = keygen(tmp_path / "k0")
    assert api.post(f"{API}/keys", json={"password": "tenant-password", "public_key": Path(f"{first}.pub").read_text()}, headers=me.headers).status_code == 201  # fmt: skip
    db = api.app.state.server.db  # the other 49 straight into the table: ssh-keygen 49 times is slow
    from suanli.control.accounts.accounts import Principal
    from suanli.control.ids import utcnow

    who = Principal(me.user_id, me.email, False, me.org_id, "tok")
    texts = [_ed25519_text(i) for i in range(1, MAX_KEYS_PER_USER)]
    with db.write() as s, s.begin():
        for text in texts:
            ssh_keys.add(s, who, text, None, utcnow())
    r = api.post(
        f"{API}/keys", json={"password": "tenant-password", "public_key": _ed25519_text(999)}, headers=me.headers
    )
    assert r.status_code == 409 and "at most 50 keys" in r.json()["detail"] and "public_key" in r.json()["detail"]


def _ed25519_text(i: int) -> str:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    pub = Ed25519PrivateKey.from_private_bytes(i.to_bytes(32, "big")).public_key()
    return pub.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode() + f" key{i}"


def test_the_sdk_and_the_gateway_info(api: Any, keys: dict[str, str], tmp_path: Path) -> None:
    from suanli.client import Client

    signup(api, "me@example.com")
    c = Client("http://testserver", transport=InProcess(api))  # the in-process app, over the SDK
    c.login("me@example.com", "tenant-password")
    pub = tmp_path / "id.pub"
    pub.write_text(keys["ecdsa"])
    k = c.ssh_key_add(pub, password="tenant-password")
    assert k.algorithm == "ecdsa-sha2-nistp256" and [x.id for x in c.ssh_keys()] == [k.id]
    assert c.ssh_key_remove(k.fingerprint).id == k.id and c.ssh_keys() == []
    info = c.ssh_info()
    assert info.enabled and info.port == 2222  # the default; no gateway has run here, so no host key yet
    assert info.host_key is None and info.host_key_fingerprint is None
