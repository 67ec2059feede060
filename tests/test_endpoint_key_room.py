"""A priced endpoint's live keys are counted per paying org (found by a hostile review).

A priced endpoint sells tokens to any org, by id, and a key costs nothing until it is used. The cap on live keys
counted every org's keys together: a stranger minted 100 keys for someone else's endpoint, and neither its owner nor
any later buyer could make one (409) until the owner revoked them, which the stranger could undo at once.
"""

from __future__ import annotations

from typing import Any

from suanli.control.serving import endpoints
from tests.control_plane import signup
from tests.endpoint_scene import API, PASSWORD, scene


def _key(api: Any, endpoint: str, headers: dict[str, str], name: str, **extra: Any) -> Any:
    return api.post(f"{API}/endpoints/{endpoint}/keys", json={"name": name, **extra}, headers=headers)


def test_a_stranger_cannot_use_up_the_key_room_of_a_priced_endpoint(api: Any) -> None:
    sc = scene(api)
    made = 0
    for n in range(endpoints.MAX_KEYS):
        r = _key(api, sc.endpoint, sc.attacker_forever, f"squat-{n}")
        if r.status_code != 201:
            assert r.status_code == 409 and "paid by this org" in r.json()["detail"], r.text
            break
        made += 1
    assert made == endpoints.MAX_KEYS_PER_BUYER
    r = _key(api, sc.endpoint, sc.victim.headers, "mine", password=PASSWORD)
    assert r.status_code == 201, r.text  # the owner's room is its own
    buyer = signup(api, "buyer@example.com", PASSWORD)
    assert _key(api, sc.endpoint, buyer.headers, "bought", password=PASSWORD).status_code == 201  # so is each buyer's


def test_a_revoked_key_gives_its_room_back(api: Any) -> None:
    sc = scene(api)
    ids = [_key(api, sc.endpoint, sc.attacker_forever, f"k{n}").json()["id"]
           for n in range(endpoints.MAX_KEYS_PER_BUYER)]  # fmt: skip
    assert _key(api, sc.endpoint, sc.attacker_forever, "one-more").status_code == 409
    assert api.delete(f"{API}/endpoint-keys/{ids[0]}", headers=sc.attacker_forever).status_code in (200, 204)
    assert _key(api, sc.endpoint, sc.attacker_forever, "one-more").status_code == 201
