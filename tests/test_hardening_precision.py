"""A spec asked for a training precision its GPU has no tensor cores for (`model.precision: mxfp8` or `nvfp4` on
Hopper, `fp8` on Ampere) and was queued anyway: it ran (and was billed) at a precision the hardware cannot do,
while a quote for the same job is a 422 naming precision. Submission now refuses a pinned GPU without support by
name, and places `gpu: any` work only on the GPUs of the fleet that have it (the stored spec names them, as a
price ceiling narrows it), or refuses it when none does. Through the API in-process, on both databases."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.control_plane import admin_token, bearer, signup

API = "/api/v1"


def fleet(api: TestClient, *presets: str) -> Any:
    adm = bearer(admin_token(api))
    for i, preset in enumerate(presets):
        r = api.post(f"{API}/admin/clusters", json={"preset": preset, "name": f"c{i}"}, headers=adm)
        assert r.status_code == 201, r.text
    return signup(api, "precise@example.com")


def job(gpu: Any, precision: str) -> dict[str, Any]:
    return {"name": "train", "command": "python train.py", "resources": {"gpu": gpu, "gpus": 1},
            "model": {"preset": "llama3.1-8b", "precision": precision}}  # fmt: skip


def submit(api: TestClient, t: Any, spec: dict[str, Any]) -> Any:
    return api.post(f"{API}/workloads", json={"spec": spec}, headers=t.headers)


def refused_naming_precision(api: TestClient, t: Any, r: Any, *words: str) -> None:
    assert r.status_code == 422, r.text
    assert "precision" in r.json()["detail"], r.text
    assert all(w in r.json()["detail"] for w in words), r.text
    assert api.get(f"{API}/workloads", headers=t.headers).json() == []  # nothing queued


@pytest.mark.parametrize(
    ("gpu", "precision", "blamed"),
    [("H100-SXM", "mxfp8", "H100-SXM"), ("H100", "nvfp4", "H100-SXM"), (["B200", "H100-SXM"], "nvfp4", "H100-SXM"),
     ("A100-SXM-80G", "fp8", "A100-SXM-80G")],
)  # fmt: skip
def test_a_pinned_gpu_without_the_precision_is_refused_naming_precision(
    api: TestClient, gpu: Any, precision: str, blamed: str
) -> None:
    t = fleet(api, "1x8:H100", "1x8:B200", "1x8:A100")
    refused_naming_precision(api, t, submit(api, t, job(gpu, precision)), blamed, precision)


def test_a_pinned_gpu_with_the_precision_is_taken(api: TestClient) -> None:
    t = fleet(api, "1x8:H100", "1x8:B200")
    for gpu, precision in (("B200", "nvfp4"), ("B200", "mxfp8"), ("H100-SXM", "fp8"), ("H100-SXM", "bf16")):
        r = submit(api, t, {**job(gpu, precision), "name": f"t-{precision}"})
        assert r.status_code == 201, r.text


def test_any_gpu_is_placed_only_where_the_precision_runs(api: TestClient) -> None:
    t = fleet(api, "1x8:H100", "1x8:B200")
    r = submit(api, t, job("any", "nvfp4"))
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["resources"]["gpu"] == ["B200"]  # what the scheduler may place it on
    r = submit(api, t, {**job("any", "bf16"), "name": "plain"})
    assert r.status_code == 201 and r.json()["spec"]["resources"]["gpu"] == "any", r.text  # every GPU here has it


def test_any_gpu_with_no_gpu_of_the_precision_in_the_fleet_is_refused(api: TestClient) -> None:
    t = fleet(api, "1x8:H100")
    refused_naming_precision(api, t, submit(api, t, job("any", "mxfp8")), "mxfp8", "H100-SXM")


@pytest.mark.parametrize("precision", ["MXFP8; drop", "", "x" * 5000, "fp4\u0000", "bf16 "])
def test_a_malformed_precision_is_a_422_naming_it_and_nothing_is_queued(api: TestClient, precision: str) -> None:
    t = fleet(api, "1x8:B200")
    r = submit(api, t, job("any", precision))
    assert r.status_code == 422 and "precision" in r.text, r.text
    assert api.get(f"{API}/workloads", headers=t.headers).json() == []


def test_narrowing_names_only_the_fleets_models_and_another_tenant_sees_none_of_it(api: TestClient) -> None:
    """`gpu: any` narrowed by precision lists registered models (public, as offers are), and the workload stays its
    org's: another ¥10 sign-up gets a 404 for it."""
    t = fleet(api, "1x8:H100", "1x8:B200")
    r = submit(api, t, job("any", "mxfp8"))
    assert r.status_code == 201 and r.json()["spec"]["resources"]["gpu"] == ["B200"], r.text
    other = signup(api, "other@example.com")
    assert api.get(f"{API}/workloads/{r.json()['id']}", headers=other.headers).status_code == 404
