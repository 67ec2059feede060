"""`POST /workloads/{ref}/scale` on both databases: who may scale what to how many (422 naming `gpus`, 409 for rigid
work or work not running, 404 for another tenant's), what it records, and the same through the SDK and the CLI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import suanli.client
from suanli.cli.common import EXIT_BAD_INPUT
from suanli.client import Client
from tests.cli_helpers import invoke
from tests.control_plane import signup
from tests.test_host_billing import forwarding
from tests.test_resize_virtual import API, Cluster, elastic, make_cluster, rigid


@pytest.fixture
def cluster(api: TestClient) -> Cluster:
    return make_cluster(api)


def test_scale_is_checked_and_recorded(cluster: Cluster) -> None:
    c = cluster
    job = c.submit(elastic("stretchy", 2, 8, 3600), t=0)
    fixed = c.submit(rigid("fixed", 4, 3600), t=0)
    pairs = c.submit({**elastic("pairs", 2, 8, 3600), "resources": {"gpu": "H20", "gpus": {"min": 2, "max": 8},
                                                                    "nodes": 2}}, t=0)  # fmt: skip
    c.tick(0)
    assert {c.get(w)["state"] for w in (job, fixed, pairs)} == {"running"}
    for body, field in ((0, "gpus"), (-1, "gpus"), ("4", "gpus"), (True, "gpus"), (4.5, "gpus")):
        r = c.scale(job, body)
        assert r.status_code == 422 and r.json()["detail"].startswith(f"{field}: "), (body, r.text)
    for n in (1, 9):
        r = c.scale(job, n)
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == f"gpus: must be within the spec's elastic range 2-8; got {n}"
    r = c.scale(pairs, 3)
    assert r.status_code == 422 and r.json()["detail"] == "gpus: must be divisible by resources.nodes (2); got 3"
    r = c.scale(fixed, 4)
    assert r.status_code == 409 and "is not elastic" in r.json()["detail"], r.text
    r = c.api.post(f"{API}/workloads/{job}/scale", json={"gpus": 4, "extra": 1}, headers=c.tenant.headers)
    assert r.status_code == 422 and r.json()["detail"].startswith("extra: "), r.text

    other = signup(c.api, "other@example.com")
    for ref in (job, "stretchy"):
        r = c.scale(ref, 4, who=other)
        assert r.status_code == 404 and r.json()["detail"] == f"workload {ref} not found", r.text

    r = c.scale("stretchy", 4)  # by name
    assert r.status_code == 200, r.text
    w = r.json()
    assert w["scale_to"] == 4 and w["events"][-1]["reason"] == "scale to 4 GPUs asked by tenant@example.com"
    assert w["state"] == "running"  # carried out by the next pass, not by the request

    assert c.api.post(f"{API}/workloads/{job}/stop", headers=c.tenant.headers).status_code == 200
    r = c.scale(job, 6)  # asked to stop: no more resizing
    assert r.status_code == 409 and r.json()["detail"].endswith("is stopping; only running work can be scaled")
    c.tick(5)
    assert c.get(job)["state"] == "stopped" and c.get(job)["scale_to"] is None  # the size ends with the run
    r = c.scale(job, 6)
    assert r.status_code == 409 and r.json()["detail"].endswith("is stopped; only running work can be scaled")
    waiting = c.submit(elastic("waiting", 16, 16, 60), t=6)  # min == max: rigid
    r = c.scale(waiting, 16)
    assert r.status_code == 409 and "is not elastic" in r.json()["detail"]


def test_a_pending_workload_cannot_be_scaled(cluster: Cluster) -> None:
    c = cluster
    c.submit(rigid("hog", 16, 3600), t=0)
    c.tick(0)
    queued = c.submit(elastic("queued", 2, 8, 60), t=1)
    c.tick(1)
    assert c.get(queued)["state"] == "pending"
    r = c.scale(queued, 4)
    assert (
        r.status_code == 409 and r.json()["detail"] == f"workload {queued} is pending; only running work can be scaled"
    )


@pytest.fixture
def as_tenant(cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Cluster]:
    """The CLI's and the SDK's Client talk to the in-process app, logged in as the tenant."""
    transport = forwarding(cluster.api)

    class Forwarded(Client):
        def __init__(self, server: str | None = None, token: str | None = None, **kw: Any) -> None:
            super().__init__(server, token, transport=transport)

    monkeypatch.setattr(suanli.client, "Client", Forwarded)
    monkeypatch.setenv("SUANLI_HOME", str(tmp_path / "cli-home"))
    monkeypatch.setenv("SUANLI_SERVER", "http://suanli.test")
    monkeypatch.setenv("SUANLI_TOKEN", cluster.tenant.token)
    monkeypatch.setenv("COLUMNS", "220")
    yield cluster


def test_the_sdk_and_the_cli_scale(as_tenant: Cluster) -> None:
    c = as_tenant
    job = c.submit(elastic("stretchy", 2, 16, 3600), t=0)
    c.tick(0)
    sdk = suanli.client.Client("http://suanli.test", c.tenant.token)
    w = sdk.scale("stretchy", 8)
    assert w.id == job and w.scale_to == 8 and w.state == "running"
    out = invoke(["scale", "stretchy", "--gpus", "4"]).stdout
    assert f"{job} (stretchy) runs on 16 GPUs; scaling to 4" in " ".join(out.split())
    c.tick(3)
    assert [a.gpus for a in c.allocations(job)] == [16, 4]
    described = " ".join(invoke(["describe", "stretchy"]).stdout.split())
    assert "(scaled to 4 by its owner)" in described and "resized from 16 to 4 GPUs: as its owner asked" in described
    bad = invoke(["scale", "stretchy", "--gpus", "99"], code=EXIT_BAD_INPUT)
    assert "gpus: must be within the spec's elastic range 2-16; got 99" in " ".join(bad.stderr.split())
