"""Hostile values in the submission's newer fields (`billing: usage`, `workdir_upload`, `workdir_archive`): every one
is a 4xx naming the field it is in, never a 500, and the tenant's balance and workloads are untouched."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.control_plane import admin_token, bearer, signup

API = "/api/v1"
JOB = {"name": "j", "command": "python train.py", "workdir": ".", "resources": {"gpu": "H20", "gpus": 1}}

BILLING = [
    ("usage ", "billing"), ("USAGE", "billing"), (1, "billing"), (True, "billing"), (None, "billing"),
    ({"mode": "usage"}, "billing"), (["usage"], "billing"), ("usage\x00", "billing"), ("u" * 100_000, "billing"),
    ("plan:", "billing"), ("plan:../../x", "billing"), ("plan:" + "p" * 10_000, "billing"),
]  # fmt: skip
UPLOAD = [
    ("", "workdir_upload"), ("../../etc/passwd", "workdir_upload"), ("wd_" + "a" * 200, "workdir_upload"),
    ("wd_\x00", "workdir_upload"), (123, "workdir_upload"), ({"id": "x"}, "workdir_upload"),
    ("wd_does_not_exist", "workdir_upload"),
]  # fmt: skip
ARCHIVE = [("not base64 !!", "workdir_archive"), ("", "workdir_archive"), (7, "workdir_archive"),
           ("H4sIAAAAAAAAA", "workdir_archive")]  # fmt: skip


@pytest.fixture
def tenant(api: TestClient) -> Any:
    adm = bearer(admin_token(api))
    assert api.post(f"{API}/admin/clusters", json={"preset": "1x8:H20"}, headers=adm).status_code == 201
    return signup(api, "hostile-fields@example.com")


def _state(api: TestClient, t: Any) -> tuple[str, int]:
    bal = api.get(f"{API}/orgs/{t.org_id}/balance", headers=t.headers)
    listed = api.get(f"{API}/workloads", headers=t.headers)
    assert bal.status_code == 200 and listed.status_code == 200
    return str(bal.json()), len(listed.json())


def _refused(r: Any, field: str) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert field in r.text, (field, r.text[:400])


@pytest.mark.parametrize(("value", "field"), BILLING)
def test_a_hostile_billing_value_is_refused_naming_billing(
    api: TestClient, tenant: Any, value: Any, field: str
) -> None:
    before = _state(api, tenant)
    r = api.post(f"{API}/workloads", json={"spec": {**JOB, "workdir": None, "billing": value}}, headers=tenant.headers)
    _refused(r, field)
    assert _state(api, tenant) == before


def test_billing_usage_on_cpu_only_work_or_a_slice_is_refused_naming_billing(api: TestClient, tenant: Any) -> None:
    for resources in ({"gpus": 0}, {"gpu": "H20", "gpus": 0}, {"gpu": "H100-SXM", "slice": "1g.10gb"}):
        spec = {"name": "u", "command": "x", "resources": resources, "billing": "usage"}
        r = api.post(f"{API}/workloads", json={"spec": spec}, headers=tenant.headers)
        _refused(r, "billing")


@pytest.mark.parametrize(("value", "field"), UPLOAD + ARCHIVE)
def test_a_hostile_workdir_reference_is_refused_naming_it(api: TestClient, tenant: Any, value: Any, field: str) -> None:
    before = _state(api, tenant)
    r = api.post(f"{API}/workloads", json={"spec": JOB, field: value}, headers=tenant.headers)
    _refused(r, field)
    assert _state(api, tenant) == before


def test_both_workdir_fields_at_once_are_refused(api: TestClient, tenant: Any) -> None:
    r = api.post(f"{API}/workloads", json={"spec": JOB, "workdir_upload": "wd_x", "workdir_archive": "AAAA"},
                 headers=tenant.headers)  # fmt: skip
    _refused(r, "workdir_upload")


LONE = "\\ud800"  # JSON's escape of a lone UTF-16 surrogate: valid JSON, text no path, argv or database can encode
SURROGATE = [
    ('{"name": "j", "command": "echo %s"}', "command"),
    ('{"name": "j", "command": "x", "volumes": [{"name": "v", "path": "/data%s"}]}', "volumes.0.path"),
    ('{"name": "j", "command": "x", "workdir": "a%s"}', "workdir"),
    ('{"name": "j", "command": "x", "env": {"K%s": "v"}}', "env"),
    ('{"name": "j", "command": "x", "env": {"K": "v%s"}}', "env.K"),
    ('{"name": "j", "command": "x", "resources": {"gpu%s": 1}}', "resources"),
]


@pytest.mark.parametrize(("spec", "field"), SURROGATE)
def test_a_lone_surrogate_anywhere_in_a_spec_is_refused_naming_its_field(
    api: TestClient, tenant: Any, spec: str, field: str
) -> None:
    """Found by a hostile review: the submission answered 500 after queueing the workload (every read of it a 500
    after), and its rank's supervisor died before it wrote an exit code, so the attempt read as a node failure."""
    before = _state(api, tenant)
    body = '{"spec": %s}' % (spec % LONE)
    r = api.post(f"{API}/workloads", content=body.encode(), headers={**tenant.headers,
                                                                      "content-type": "application/json"})  # fmt: skip
    _refused(r, field)
    assert "not UTF-8" in r.text or "surrogate" in r.text, r.text
    assert _state(api, tenant) == before


@pytest.mark.parametrize("workdir", ["a" * 256, "src/" + "é" * 128, "x/" + "b" * 300 + "/y"])
def test_a_workdir_name_longer_than_a_file_name_may_be_is_refused(api: TestClient, tenant: Any, workdir: str) -> None:
    """255 bytes a name (NAME_MAX): the launch's mkdir failed with "File name too long", a failed start."""
    r = api.post(f"{API}/workloads", json={"spec": {**JOB, "workdir": workdir}}, headers=tenant.headers)
    _refused(r, "workdir")
    assert "255 bytes" in r.text


def test_a_lone_surrogate_in_a_yaml_spec_text_is_refused_naming_its_field() -> None:
    from suanli.workloads.spec import SpecError, parse_spec

    with pytest.raises(SpecError, match="command: is not UTF-8 text"):
        parse_spec('name: j\ncommand: "echo \\ud800"')  # YAML's escape: the raw character is refused as YAML
    with pytest.raises(SpecError, match="spec: not valid YAML"):
        parse_spec("name: j\ncommand: echo \ud800")
