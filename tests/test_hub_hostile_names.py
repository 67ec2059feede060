"""The hub through the API with hostile names (from a hostile review): 404 or 422 naming the field, never a 500."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.test_hub_api import add_fake
from tests.test_workloads_api import Platform, make_platform

HOSTILE = ["..", "a..b", "%2e%2e", "..%2f..%2fetc", "a%00b", "a" * 63, "a" * 64, "A", "-a", "a b", "a%2fb",
           "%c0%ae%c0%ae", "\u00e9", "a;b", "a\\b", "a.", "0" * 63, "%252e%252e"]  # fmt: skip


@pytest.fixture
def platform(api: TestClient) -> Platform:
    return make_platform(api)


@pytest.mark.parametrize("kind", ["models", "datasets"])
def test_hostile_hub_names_never_make_a_500(platform: Platform, tmp_path: Path, kind: str) -> None:
    add_fake(platform, tmp_path)
    h = platform.tenant.headers
    for name in HOSTILE:
        r = platform.api.get(f"/api/v1/hub/{kind}/{name}", headers=h)
        assert r.status_code in (404, 422), (name, r.status_code, r.text)
        assert "/" not in r.json().get("detail", "") or "hub" in r.json()["detail"], (name, r.text)


def test_hostile_hub_names_in_a_spec_are_refused_naming_the_field(platform: Platform, tmp_path: Path) -> None:
    add_fake(platform, tmp_path)
    h = platform.tenant.headers
    for field in ("models", "datasets"):
        for value in (["../../etc"], ["fake/../../x"], [".."], ["fake"] * 17, [{"x": 1}], [None], [""],
                      ["a" * 10_000]):  # fmt: skip
            spec = {"name": "hubby", "kind": "job", "command": "true", "resources": {"gpus": 0}, field: value}
            r = platform.api.post("/api/v1/workloads", json={"spec": spec}, headers=h)
            assert r.status_code == 422 and field in r.text, (field, value, r.status_code, r.text[:300])
