"""The hub from the command line, both databases: the operator adds, verifies and removes entries on the server
host (`suanli admin hub`, against the database and hub directory directly), a tenant lists them and runs with
`--model`; an unreachable Hugging Face Hub, an unknown name and a removal of an entry in use each end in one line
that says why."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.control_plane import live_server
from tests.hub_fixtures import need
from tests.sqlite_only import sqlite_db_url  # noqa: F401  (the hub CLI's subject is not the database)
from tests.test_cli_account import doc, suanli

TERMINAL = ("succeeded", "failed", "stopped", "preempted")


def test_operator_adds_and_removes_tenant_lists_and_runs_with_model(db_url: str, tmp_path: Path) -> None:
    need("huggingface_hub")
    srv_home, carol = tmp_path / "srv", tmp_path / "carol"
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "llama"}')
    (src / "model.safetensors").write_bytes(b"\x01" * 1000)
    nowhere = "http://127.0.0.1:1"
    admin = {"home": srv_home, "server": nowhere}

    added = suanli(["admin", "hub", "add-model", "tiny", "--from", str(src), "--repo", "acme/tiny", "--license",
                    "MIT", "--db", db_url], **admin)  # fmt: skip
    assert "added model tiny: load it as acme/tiny" in added.stdout and "2 files" in added.stdout
    assert (srv_home / "hub" / "hub" / "models--acme--tiny").is_dir()  # the default hub directory: hub/ in the home
    ok = suanli(["admin", "hub", "verify", "tiny", "--db", db_url], **admin)
    assert "all 2 files match their SHA-256" in ok.stdout
    suanli(["admin", "hub", "add-model", "tiny", "--from", str(src), "--repo", "acme/tiny", "--db", db_url], **admin,
           code=2)  # fmt: skip
    far = suanli(["admin", "hub", "add-model", "far", "--from", "hf://acme/far@v1", "--db", db_url], **admin,
                 code=2, HF_ENDPOINT="http://127.0.0.1:9")  # fmt: skip
    assert "cannot fetch hf://acme/far@v1 from the Hugging Face Hub" in far.stderr
    suanli(["admin", "hub", "add-model", "bad", "--from", str(src), "--repo", "../../etc", "--db", db_url], **admin,
           code=2)  # fmt: skip

    spec = tmp_path / "job.yaml"
    spec.write_text("name: uses-tiny\ncommand: python3 -c 'print(1)'\nresources: {gpus: 1}\nenv: {FLAG: yes}\n")
    with live_server(srv_home, db_url, env={"SUANLI_VIRTUAL": "h20-roce800-128"}) as srv:  # virtual nodes
        suanli(["signup", "--email", "carol@example.com", "--password-stdin"], carol, srv.url, stdin="carol-pass-1\n")
        listed = doc(suanli(["hub", "models", "--json"], carol, srv.url))
        assert [(m["name"], m["repo_id"], m["license"], m["size_bytes"]) for m in listed] == [
            ("tiny", "acme/tiny", "mit", 1023)]  # fmt: skip
        shown = doc(suanli(["hub", "show", "tiny", "--json"], carol, srv.url))
        assert [f["path"] for f in shown["file_list"]] == ["config.json", "model.safetensors"]
        assert "tiny" in suanli(["hub", "models"], carol, srv.url).stdout
        assert doc(suanli(["hub", "datasets", "--json"], carol, srv.url)) == []
        w = doc(suanli(["run", str(spec), "--model", "tiny", "--json"], carol, srv.url))
        w = doc(suanli(["describe", w["id"], "--json"], carol, srv.url))
        assert w["spec"]["models"] == ["tiny"] and w["spec"]["env"] == {"FLAG": "yes"}  # YAML read as the server does
        bad = suanli(["run", str(spec), "--model", "nope"], carol, srv.url, code=2)
        assert "models: no model called 'nope' in the hub" in bad.stderr
        busy = suanli(["admin", "hub", "rm", "tiny", "--db", db_url], **admin, code=2)
        assert "used by unfinished workloads: uses-tiny" in busy.stderr
        assert (srv_home / "hub" / "hub" / "models--acme--tiny").is_dir()
        suanli(["stop", w["id"]], carol, srv.url)
        deadline = time.monotonic() + 90  # a running workload's stop is asked; it ends on a later pass
        while doc(suanli(["describe", w["id"], "--json"], carol, srv.url))["state"] not in TERMINAL:
            assert time.monotonic() < deadline, "the stopped workload never ended"
            time.sleep(0.5)
    suanli(["admin", "hub", "rm", "tiny", "--db", db_url], **admin)
    assert not (srv_home / "hub" / "hub" / "models--acme--tiny").exists()
    assert not os.listdir(srv_home / "hub" / ".staging")
