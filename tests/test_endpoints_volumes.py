"""`model: vol:VOLUME[@N]/PATH`: an endpoint serving a checkpoint directory of a volume, on both databases. The
volume must be the endpoint org's and the path a directory inside it (not a file, not a link out of it); the
replica mounts the volume read-only and its runtime is given the directory as its model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from suanli.control.ids import utcnow
from suanli.serving.spec import MODEL_MOUNT
from suanli.workloads.spec import parse_spec
from tests.control_plane import signup
from tests.test_endpoints_db import EP, GPU_SPEC, deploy, platform, replicas, serving  # noqa: F401
from tests.test_workloads_api import Platform

API = "/api/v1"


def _volume(p: Platform, who: Any, name: str, files: dict[str, bytes]) -> dict[str, Any]:
    r = p.api.post(f"{API}/volumes", json={"name": name, "size": "8Mi"}, headers=who.headers)
    assert r.status_code == 201, r.text
    for path, data in files.items():
        r = p.api.put(f"{API}/volumes/{name}/files", params={"path": path}, content=data, headers=who.headers)
        assert r.status_code in (200, 201), r.text
    return p.api.get(f"{API}/volumes/{name}", headers=who.headers).json()


@pytest.fixture
def ckpt(platform: Platform) -> dict[str, Any]:  # noqa: F811
    return _volume(platform, platform.tenant, "ckpt", {"checkpoint-1200/config.json": b'{"model_type": "llama"}'})


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ("vol:ckpt/../etc", "vol:VOLUME"),
        ("vol:Ckpt/x", "vol:VOLUME"),
        ("vol:ckpt@0/x", "vol:VOLUME"),
        ("vol:ckpt/" + "abcd/" * 40, "longer than"),
        ("vol:nope/checkpoint-1200", "no volume called nope"),
        ("vol:ckpt@3/checkpoint-1200", "no version 3"),
        ("vol:ckpt/checkpoint-9", "not a directory"),
        ("vol:ckpt/checkpoint-1200/config.json", "not a directory"),
    ],
)
def test_checkpoint_refusals_name_model(platform: Platform, ckpt: dict, model: str, why: str) -> None:  # noqa: F811
    r = platform.api.post(EP, json={"spec": {**GPU_SPEC, "model": model}}, headers=platform.tenant.headers)
    assert r.status_code == 422 and "model:" in r.json()["detail"] and why in r.json()["detail"], r.text


def test_another_orgs_volume_is_not_there(platform: Platform, ckpt: dict) -> None:  # noqa: F811
    mallory = signup(platform.api, "mallory@example.com")
    platform.topup(mallory.org_id, "100")
    r = platform.api.post(EP, json={"spec": {**GPU_SPEC, "model": "vol:ckpt/checkpoint-1200"}},
                          headers=mallory.headers)  # fmt: skip
    assert r.status_code == 422 and "no volume called ckpt" in r.json()["detail"], r.text


def test_a_link_out_of_the_volume_is_not_a_checkpoint(platform: Platform, ckpt: dict) -> None:  # noqa: F811
    root = platform.api.app.state.server.settings.volumes_root  # type: ignore[attr-defined]
    (data,) = [d for d in Path(root).glob(f"*/vols/{ckpt['id']}/data")]
    os.symlink("/etc", data / "escape")  # a workload with the volume mounted writable could make this link
    r = platform.api.post(EP, json={"spec": {**GPU_SPEC, "model": "vol:ckpt/escape"}},
                          headers=platform.tenant.headers)  # fmt: skip
    assert r.status_code == 422 and "not a directory" in r.json()["detail"], r.text


def test_replicas_mount_the_volume_read_only_and_serve_the_directory(platform: Platform, ckpt: dict) -> None:  # noqa: F811
    ep = deploy(platform, {**GPU_SPEC, "model": "vol:ckpt//checkpoint-1200/"})
    assert ep["model"] == "vol:ckpt/checkpoint-1200"  # kept as cleaned
    serving(platform).run(platform.db, utcnow())
    ws = replicas(platform, ep["id"])
    assert len(ws) == 2
    for w in ws:
        spec = parse_spec(w.spec)
        assert [(m.name, m.path, m.read_only) for m in spec.volumes] == [("ckpt", MODEL_MOUNT, True)]
        assert spec.models == () and spec.env["HF_HUB_OFFLINE"] == "1"
        assert f"vllm serve {MODEL_MOUNT}/checkpoint-1200 " in spec.command
