"""The hub through the API on both databases: tenants list entries (never host paths), a spec names them, names
the hub does not hold (or that try to walk out of it) are refused naming the field, an entry in use cannot be
removed, and a real sandboxed job (local executor, bubblewrap) loads a model with `from_pretrained("ORG/NAME")` and
a dataset with `load_dataset("ORG/NAME")` through the read-only mount, with no network and no copy, billed only for
its own run."""

from __future__ import annotations

import os
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from suanli.billing.metering import billable_seconds, cost_of
from suanli.client import Client
from suanli.control.errors import Conflict
from suanli.control.ids import utcnow
from suanli.control.storage import hub
from suanli.storage.hub import HubStore
from tests.hub_fixtures import make_dataset, make_model, need
from tests.test_workloads_api import WL, Platform, _t, archive, finished, make_platform

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
    reason="bubblewrap is not installed (apt install bubblewrap); CI installs and requires it",
)


@pytest.fixture
def platform(api: TestClient) -> Platform:
    return make_platform(api)


def store(p: Platform) -> HubStore:
    return hub.store_of(None, p.api.app.state.server.settings.home)  # type: ignore[attr-defined]


def fake_model(tmp_path: Path) -> Path:
    src = tmp_path / "fake-src"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "llama"}')
    (src / "model.safetensors").write_bytes(b"\x07" * 4096)
    return src


def add_fake(p: Platform, tmp_path: Path, name: str = "fake") -> None:
    need("huggingface_hub")
    hub.add(p.db, store(p), "model", name, str(fake_model(tmp_path)), utcnow(), repo_id="acme/fake", license="mit")


def test_tenants_list_the_hub_with_checksums_and_never_a_host_path(platform: Platform, tmp_path: Path) -> None:
    add_fake(platform, tmp_path)
    h = platform.tenant.headers
    r = platform.api.get("/api/v1/hub/models", headers=h)
    assert r.status_code == 200, r.text
    (e,) = r.json()
    assert (e["name"], e["kind"], e["repo_id"], e["size_bytes"], e["files"], e["license"]) == (
        "fake", "model", "acme/fake", 4096 + 23, 2, "mit")  # fmt: skip
    assert len(e["revision"]) == 40 and e["file_list"] is None
    one = platform.api.get("/api/v1/hub/models/fake", headers=h).json()
    import hashlib

    assert {f["path"]: f["sha256"] for f in one["file_list"]} == {
        "config.json": hashlib.sha256(b'{"model_type": "llama"}').hexdigest(),
        "model.safetensors": hashlib.sha256(b"\x07" * 4096).hexdigest(),
    }
    assert str(tmp_path) not in r.text + str(one) and "/hub/" not in r.text
    assert platform.api.get("/api/v1/hub/datasets", headers=h).json() == []
    assert platform.api.get("/api/v1/hub/models").status_code == 401  # signed-in users only
    # the SDK's view is the same
    with Client("http://testserver", platform.tenant.token) as c:
        c._http.close()
        c._http = platform.api  # the in-process app (TestClient is an httpx.Client)
        (m,) = c.hub_models()
        assert (m.name, m.repo_id, m.size_bytes) == ("fake", "acme/fake", 4119)
        assert [f.path for f in c.hub_entry("model", "fake").file_list or []] == ["config.json", "model.safetensors"]
        assert c.hub_datasets() == []


@pytest.mark.parametrize(
    "path",
    ["/api/v1/hub/models/nothing", "/api/v1/hub/models/..%2F..%2Fetc", "/api/v1/hub/models/%2e%2e",
     "/api/v1/hub/weights/fake", "/api/v1/hub/models/" + "a" * 64],
)  # fmt: skip
def test_entries_that_do_not_exist_or_walk_out_are_4xx_never_a_500(platform: Platform, path: str) -> None:
    r = platform.api.get(path, headers=platform.tenant.headers)
    assert 400 <= r.status_code < 500, (path, r.status_code, r.text)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"models": ["nothing-here"]}, "models"),
        ({"datasets": ["nothing-here"]}, "datasets"),
        ({"models": ["../../etc/passwd"]}, "models"),
        ({"models": ["acme/fake"]}, "models"),
        ({"datasets": [".."]}, "datasets"),
        ({"models": [{"name": "fake"}]}, "models"),
        ({"models": ["fake"] * 17}, "models"),
        ({"models": ["fake", "fake"]}, "models"),
        ({"datasets": ["fake"]}, "datasets"),  # a model's name is no dataset
    ],
)
def test_hub_names_the_hub_does_not_hold_are_refused_naming_the_field(
    platform: Platform, tmp_path: Path, extra: dict[str, Any], field: str
) -> None:
    add_fake(platform, tmp_path)
    spec = {"name": "j", "command": "true", "resources": {"gpus": 0}, **extra}
    r = platform.api.post(WL, json={"spec": spec}, headers=platform.tenant.headers)
    assert r.status_code == 422, r.text
    assert field in r.text, r.text


def test_an_entry_cannot_be_removed_while_unfinished_work_names_it(platform: Platform, tmp_path: Path) -> None:
    add_fake(platform, tmp_path)
    w = platform.submit({"name": "uses-fake", "command": "true", "resources": {"gpus": 0}, "models": ["fake"]})
    with pytest.raises(Conflict, match="used by unfinished workloads: uses-fake"):
        hub.remove(platform.db, store(platform), "model", "fake")
    assert (store(platform).root / "hub" / "models--acme--fake").is_dir()
    r = platform.api.post(f"{WL}/{w['id']}/stop", headers=platform.tenant.headers)
    assert r.status_code == 200, r.text
    platform.until(w["id"], finished)
    hub.remove(platform.db, store(platform), "model", "fake")
    assert not (store(platform).root / "hub" / "models--acme--fake").exists()
    assert platform.api.get("/api/v1/hub/models", headers=platform.tenant.headers).json() == []


LOAD = """
import os, json
from transformers import AutoModelForCausalLM, AutoTokenizer
import datasets
model = AutoModelForCausalLM.from_pretrained("acme/tiny-llama")
tok = AutoTokenizer.from_pretrained("acme/tiny-llama")
out = model(**tok("hello world", return_tensors="pt"))
print("logits", tuple(out.logits.shape))
ds = datasets.load_dataset("acme/tiny-ds")
print("rows", ds["train"].num_rows, ds["train"][1]["text"])
snap = os.path.dirname(os.path.realpath(os.path.join(os.environ["HF_HUB_CACHE"], "models--acme--tiny-llama", "refs")))
print("weights at", os.path.realpath(model.name_or_path) if os.path.isabs(model.name_or_path) else model.name_or_path)
try:
    open("/hub/models--acme--tiny-llama/refs/main", "w").write("x")
    print("hub writable")
except OSError as e:
    print("hub read-only", e.errno)
print("env", json.dumps({k: os.environ.get(k) for k in ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE",
                                                        "HF_HUB_OFFLINE")}, sort_keys=True))
print("workspace", sorted(os.listdir("/workspace")))
print("hub lists", sorted(os.listdir("/hub")),
      sorted(n for n in os.listdir("/tmp/huggingface/datasets") if not n.endswith(".lock")))
"""


@needs_bwrap
def test_a_sandboxed_job_loads_a_hub_model_and_dataset_offline_through_the_mount(
    platform: Platform, tmp_path: Path
) -> None:
    need("torch", "transformers", "datasets")
    s = store(platform)
    add_fake(platform, tmp_path)  # in the hub, not named by the job: not in its sandbox
    hub.add(platform.db, s, "model", "tiny-llama", str(make_model(tmp_path / "model")), utcnow(),
            repo_id="acme/tiny-llama")  # fmt: skip
    hub.add(platform.db, s, "dataset", "tiny-ds", str(make_dataset(tmp_path / "ds")), utcnow(), repo_id="acme/tiny-ds")
    spec = {"name": "hub-job", "command": "python3 load.py", "network": "none", "models": ["tiny-llama"],
            "datasets": ["tiny-ds"], "resources": {"gpus": 0, "memory": "8Gi"}}  # fmt: skip
    w = platform.submit(spec, workdir_archive=archive({"load.py": LOAD}))
    done = platform.until(w["id"], finished, timeout=240)
    logs = platform.api.get(f"{WL}/{w['id']}/logs", headers=platform.tenant.headers).json()["data"]
    assert done["state"] == "succeeded", (done["reason"], logs[-3000:])
    assert "logits (1, 2, 13)" in logs
    assert "rows 3 the a of" in logs
    assert "hub read-only 30" in logs  # EROFS: the bind is read-only even to a process that owns the files
    assert ('env {"HF_DATASETS_CACHE": "/tmp/huggingface/datasets", "HF_HOME": "/tmp/huggingface", '
            '"HF_HUB_CACHE": "/hub", "HF_HUB_OFFLINE": "1"}') in logs  # fmt: skip
    assert "workspace ['load.py']" in logs  # nothing was copied into the job's disk
    assert "hub lists ['datasets--acme--tiny-ds', 'models--acme--tiny-llama'] ['acme___tiny-ds']" in logs  # named only
    # the job paid for its own run and nothing else: the hub's reads are not billed
    a = done["allocation"]
    ran = (_t(a["stopped_at"]) - _t(a["started_at"])).total_seconds()
    assert Decimal(done["cost"]) == cost_of(Decimal(a["rate_per_hour"]), billable_seconds(ran, stopped=True))
