"""The SDK and the CLI move files in and out of a volume of a real server process (both databases): over HTTP a
file resumes after a break and is checked, a directory goes in and comes back the same; versions through the CLI
(whose copies take the same-host path unless `--http`; `test_volumes_local_copy` tests that path)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from suanli.client import ApiError, Client
from tests.cli_helpers import invoke
from tests.control_plane import live_server, signup


@pytest.fixture
def server(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch, cheap_password_hashing: None):  # type: ignore[no-untyped-def]
    with live_server(tmp_path / "home", db_url) as srv:
        with httpx.Client(base_url=srv.url) as http:
            t = signup(http, "vol@example.com")
        cli_home = tmp_path / "cli"
        monkeypatch.setenv("SUANLI_HOME", str(cli_home))
        monkeypatch.setenv("SUANLI_SERVER", srv.url)
        from suanli.cli import credentials

        credentials.save(srv.url, t.token, t.email)
        with Client(srv.url, t.token) as c:
            yield srv, c


def test_sdk_resumes_a_file_checks_it_and_copies_trees(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv, c = server
    c.volume_create("data", "64Mi")
    blob = os.urandom(3 << 20)
    src = tmp_path / "blob.bin"
    src.write_bytes(blob)
    # A first upload broke off after 1 MiB: the server kept what arrived.
    vol = c.volume("data")
    from suanli.storage import volume_io as vio
    from suanli.storage import volumes as store

    part = vio.partial_path(store.paths(srv.home / "volumes", vol.org_id, vol.id, None), "blob.bin")
    part.write_bytes(blob[: 1 << 20])
    seen: list[int] = []
    out = c.volume_upload("data", src, "blob.bin", progress=seen.append, same_host=False)  # HTTP, as from afar
    assert out.resumed_from == 1 << 20 and sum(seen) == len(blob)
    back = tmp_path / "back.bin"
    (tmp_path / "back.bin.suanli-part").write_bytes(blob[:12345])  # an interrupted download resumes too
    got = c.volume_download("data", "blob.bin", back, same_host=False)
    assert back.read_bytes() == blob and got.resumed_from == 12345
    (tmp_path / "back.bin.suanli-part").write_bytes(blob)  # all of it arrived before the break: checked, not fetched
    got = c.volume_download("data", "blob.bin", back, same_host=False)
    assert back.read_bytes() == blob and got.resumed_from == len(blob)
    (tmp_path / "back.bin.suanli-part").write_bytes(b"garbage!")  # a corrupt partial copy is caught by sha256
    with pytest.raises(ApiError, match="hashes to"):
        c.volume_download("data", "blob.bin", tmp_path / "back.bin", same_host=False)
    tree = tmp_path / "tree"
    for i in range(30):
        (tree / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 3}" / f"f{i}.txt").write_text(f"file {i}")
    assert c.volume_upload("data", tree, "tree", same_host=False).via == "http"
    assert sorted(e.name for e in c.volume_ls("data", "tree")) == ["d0", "d1", "d2"]
    assert c.volume_download("data", "tree", tmp_path / "out", same_host=False).via == "http"
    for p in tree.rglob("*.txt"):
        assert (tmp_path / "out" / p.relative_to(tree)).read_text() == p.read_text()


def test_cli_create_cp_snapshot_versions_diff_restore_clone_rm(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _ = server  # the CLI finds it through SUANLI_SERVER and the saved token
    invoke(["volumes", "create", "data", "--size", "32Mi"])
    assert invoke(["volumes", "create", "bad", "--size", "1Ki"], code=2).exit_code == 2
    f = tmp_path / "a.txt"
    f.write_text("one")
    invoke(["volumes", "cp", str(f), "vol:data/x/a.txt"])
    invoke(["volumes", "snapshot", "data", "-m", "first"])
    f.write_text("two")
    assert "same host" not in invoke(["volumes", "cp", str(f), "data:x/a.txt", "--http"]).stdout
    invoke(["volumes", "snapshot", "data", "-m", "second"])
    rows = json.loads(invoke(["volumes", "versions", "data", "--json"]).stdout)
    assert [r["message"] for r in rows] == ["first", "second"]
    d = json.loads(invoke(["volumes", "diff", "data@1", "data@2", "--json"]).stdout)
    assert d == {"added": [], "removed": [], "changed": ["x/a.txt"]}
    assert "a.txt" in invoke(["volumes", "ls", "vol:data/x"]).stdout
    invoke(["volumes", "restore", "data@1"])
    assert "same host" in invoke(["volumes", "cp", "vol:data/x/a.txt", str(tmp_path / "got.txt")]).stdout
    assert (tmp_path / "got.txt").read_text() == "one"
    invoke(["volumes", "clone", "data@2", "exp"])
    invoke(["volumes", "cp", "vol:exp/x/a.txt", str(tmp_path / "exp.txt")])
    assert (tmp_path / "exp.txt").read_text() == "two"
    listed = json.loads(invoke(["volumes", "ls", "--json"]).stdout)
    assert sorted(v["name"] for v in listed) == ["data", "exp"]
    invoke(["volumes", "rm", "exp"])
    assert "data" in invoke(["volumes", "describe", "data"]).stdout


def test_storage_in_usage_and_quote_through_the_sdk_and_cli(server, db_url: str) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta
    from decimal import Decimal

    from suanli.control.storage import volume_billing
    from suanli.db.engine import Database
    from suanli.db.volumes import Volume

    _, c = server
    vol = c.volume_create("data", "100Gi")
    assert c.storage_usage() == [] and "no usage yet" in invoke(["usage"]).stdout
    db = Database(db_url)  # two hours pass on the server's clock: its meter charges them
    try:
        with db.read() as s:
            start = s.get(Volume, vol.id).billed_until
        volume_billing.meter(db, start + timedelta(hours=2, minutes=1), grace_minutes=5)
    finally:
        db.dispose()
    hour = (Decimal(100 << 30) * Decimal("0.30") / (Decimal(10**9) * 720)).quantize(Decimal("1e-8"))
    (line,) = c.storage_usage()
    assert (line.volume, line.hours, line.cost, line.price_per_hour) == ("data", 2, 2 * hour, hour)
    (row,) = json.loads(invoke(["usage", "--storage", "--json"]).stdout)
    assert Decimal(row["cost"]) == 2 * hour and row["volume_id"] == vol.id
    out = invoke(["usage"]).stdout
    assert "volume storage" in out and "data" in out and str(2 * hour) in out
    q = c.quote_storage("100Gi", 24)
    assert q.per_hour == hour and q.cost == 24 * hour
    got = json.loads(invoke(["quote", "--volume", "100Gi", "--hours", "24", "--json"]).stdout)
    assert Decimal(got["cost"]) == 24 * hour
    assert "an hour" in invoke(["quote", "--volume", "100Gi"]).stdout
    assert "size: must be a size" in invoke(["quote", "--volume", "lots"], code=2).stderr
