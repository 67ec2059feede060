"""Volumes and the hub in the console, in-process on SQLite and PostgreSQL: list with size, use and cost; create
with the API's messages at the field; a volume's files, versions, snapshot, restore and clone; another org's
volume refused and never shown; a viewer's refusal shown; the hub's entries with the line that names them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from suanli.control.ids import utcnow
from suanli.control.storage import hub
from tests.control_plane import admin_token, bearer, join, signup
from tests.web_helpers import Console, sqlite_db_url  # noqa: F401  (sqlite_db_url: the db_url fixture)

EN = {"Accept-Language": "en"}
API = "/api/v1"


def _console(api: Any, email: str) -> tuple[Console, dict[str, str]]:
    c = Console(type(api)(api.app))
    c.signup(email)
    return c, bearer(c.c.cookies.get("suanli_session"))


def _volume(c: Console, name: str = "data", size: str = "1Gi") -> str:
    r = c.post("/volumes", {"name": name, "size": size}, csrf_from="/volumes")
    assert r.status_code == 303, r.text
    return r.headers["location"].rsplit("/", 1)[1]


def test_create_list_browse_snapshot_restore_and_clone(api: Any) -> None:
    c, h = _console(api, "vol@example.com")
    vid = _volume(c)
    assert (
        c.c.put(f"{API}/volumes/{vid}/files", params={"path": "dir/a.txt"}, content=b"one", headers=h).status_code
        == 200
    )
    listing = c.get("/volumes", headers=EN).text
    assert f'href="/volumes/{vid}">data<' in listing and "1.0 GiB" in listing and "/h" in listing
    page = c.get(f"/volumes/{vid}", headers=EN).text
    assert "dir/" in page and "No versions yet." in page
    assert "a.txt" in c.get(f"/volumes/{vid}?path=dir").text
    assert c.post(f"/volumes/{vid}/snapshot", {"message": "first cut"}, csrf_from="/volumes").status_code == 303
    assert "first cut" in c.get(f"/volumes/{vid}").text
    c.c.put(f"{API}/volumes/{vid}/files", params={"path": "dir/a.txt"}, content=b"two!", headers=h)
    assert c.post(f"/volumes/{vid}/restore", {"version": "1"}, csrf_from="/volumes").status_code == 303
    assert c.c.get(f"{API}/volumes/{vid}/files", params={"path": "dir/a.txt"}, headers=h).content == b"one"
    r = c.post(f"/volumes/{vid}/clone", {"version": "1", "name": "copy"}, csrf_from="/volumes")
    assert r.status_code == 303 and r.headers["location"] != f"/volumes/{vid}"
    assert "copy" in c.get(r.headers["location"]).text


@pytest.mark.parametrize(
    ("form", "marker"),
    [({"name": "Bad Name!", "size": "1Gi"}, "vol-name-error"), ({"name": "ok", "size": "lots"}, "vol-size-error"),
     ({"name": "ok", "size": "-5"}, "vol-size-error"), ({"name": "x" * 100, "size": "1Gi"}, "vol-name-error"),
     ({"name": "ok", "size": "99999999Ti"}, "vol-size-error")],
)  # fmt: skip
def test_bad_volume_input_is_shown_at_the_field(api: Any, form: dict[str, str], marker: str) -> None:
    c, _ = _console(api, "badvol@example.com")
    r = c.post("/volumes", form, csrf_from="/volumes")
    assert 400 <= r.status_code < 500 and marker in r.text, r.text[-2000:]


def test_bad_version_input_is_shown_never_a_500(api: Any) -> None:
    c, _ = _console(api, "badver@example.com")
    vid = _volume(c)
    for path, form in (("restore", {"version": "abc"}), ("restore", {"version": "99"}), ("clone", {"version": "0"}),
                       ("clone", {"version": "1", "name": ""}), ("snapshot", {"message": "m" * 500})):  # fmt: skip
        r = c.post(f"/volumes/{vid}/{path}", form, csrf_from="/volumes")
        assert 400 <= r.status_code < 500 and "field-error" in r.text, (path, form, r.status_code)


def test_another_orgs_volume_is_refused_and_never_shown(api: Any) -> None:
    owner, h = _console(api, "vol-owner@example.com")
    vid = _volume(owner, "secret-data")
    c, _ = _console(api, "vol-thief@example.com")
    assert "secret-data" not in c.get("/volumes").text
    for path in (f"/volumes/{vid}", f"/volumes/{vid}?path=..", "/volumes/..%2F..%2Fadmin"):
        r = c.get(path)
        assert r.status_code == 404 and "secret-data" not in r.text, path
    for action, form in (("snapshot", {}), ("restore", {"version": "1"}), ("clone", {"version": "1", "name": "x"})):
        assert c.post(f"/volumes/{vid}/{action}", form, csrf_from="/volumes").status_code == 404, action
    assert api.get(f"{API}/volumes/{vid}/versions", headers=h).json() == []


def test_a_viewer_sees_the_apis_refusal_and_csrf_is_checked(api: Any) -> None:
    owner = signup(api, "team-vol@example.com")
    team = api.post(f"{API}/orgs", json={"name": "vlab"}, headers=owner.headers).json()["id"]
    r = api.post(
        f"{API}/admin/orgs/{team}/transactions",
        json={"kind": "topup", "amount": "10"},
        headers=bearer(admin_token(api)),
    )  # fmt: skip  (an org without money allocates no volume)
    assert r.status_code in (200, 201), r.text
    made = api.post(f"{API}/volumes", json={"name": "shared", "size": "1Gi", "org": team}, headers=owner.headers)
    assert made.status_code == 201, made.text
    vid = made.json()["id"]
    viewer = signup(api, "vol-viewer@example.com", "viewer-password")
    join(api, owner, team, viewer, role="viewer")
    v = Console(type(api)(api.app))
    v.login("vol-viewer@example.com", "viewer-password")
    v.c.cookies.set("suanli_org", team)
    assert "shared" in v.get("/volumes").text
    r = v.post(f"/volumes/{vid}/snapshot", {"message": "x"}, csrf_from="/volumes")
    assert r.status_code == 403 and 'id="volume-error"' in r.text
    assert v.post("/volumes", {"name": "mine", "size": "1Gi"}, csrf_from="/volumes").status_code == 403
    assert v.c.post(f"/volumes/{vid}/snapshot", data={"message": "x"}, follow_redirects=False).status_code == 403
    assert v.c.post("/volumes", data={"name": "z", "size": "1Gi"}, follow_redirects=False).status_code == 403
    assert api.get(f"{API}/volumes/{vid}/versions", headers=owner.headers).json() == []


def test_the_hub_shows_size_licence_revision_and_the_spec_line(api: Any, tmp_path: Path) -> None:
    pytest.importorskip("huggingface_hub")
    srv = api.app.state.server
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "llama"}')
    (src / "model.safetensors").write_bytes(b"\x07" * 4096)
    hub.add(srv.db, hub.store_of(None, srv.settings.home), "model", "tiny", str(src), utcnow(), repo_id="acme/tiny",
            license="apache-2.0")  # fmt: skip
    c, _ = _console(api, "hub@example.com")
    html = c.get("/hub", headers=EN).text
    assert "acme/tiny" in html and "apache-2.0" in html and "models: [tiny]" in html
    assert 'from_pretrained("acme/tiny")' in html.replace("&#34;", '"') and "KiB" in html
    assert str(srv.settings.home) not in html  # never a host path
