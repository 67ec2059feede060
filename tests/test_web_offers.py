"""The console's offers (with the quote form) and instances pages in-process, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.test_web_workloads import API, EN, World
from tests.web_helpers import sqlite_db_url  # noqa: F401  (the db_url fixture: SQLite only)

INSTANCE = "name: box\nkind: instance\nresources: {gpu: RTX-4090, gpus: 1}\n"


@pytest.fixture
def world(api: TestClient) -> World:
    return World(api)


def test_offers_show_what_suanli_offers_prints(world: World) -> None:
    c, who = world.tenant("offers@example.com")
    o = world.api.get(f"{API}/offers", headers=who).json()[0]
    world.running(who, world.submit(who, "name: a\ncommand: x\nresources: {gpu: RTX-4090, gpus: 3}\n")["id"])
    html = c.get("/offers", headers=EN).text
    row = html.split('id="offers"', 1)[1].split("</table>", 1)[0]
    cells = [x.split(">", 1)[1].split("</td>", 1)[0] for x in row.split("<td")[1:]]
    assert cells[:8] == ["<b>RTX-4090</b>", "24 GB", "8", "5", "5", "5", "0", "1"], cells
    assert cells[8] == "¥2.20" and cells[9] == "¥0.88" and "monthly ¥1.43" in cells[10]
    assert cells[11] == "¥0.55–¥2.75" and o["on_demand_per_gpu_hour"] == "2.20000000"
    assert 'id="plans"' in html and "Spot price" in html


def test_the_quote_form_gives_time_and_cost_per_offer(world: World) -> None:
    c, who = world.tenant("quote@example.com")
    form = {"model": "llama3.1-8b", "precision": "bf16", "tokens": "1e8", "gpu": "any", "gpus": "",
            "billing_mode": "on-demand"}  # fmt: skip
    r = c.post("/offers/quote", form, csrf_from="/offers", headers=EN)
    assert r.status_code == 200, r.text
    api = world.api.post(f"{API}/quotes", headers=who, json={"model": "llama3.1-8b", "tokens": 1e8}).json()
    assert api and 'id="quotes"' in r.text
    from suanli.web.render import money

    assert money(api[0]["cost"]) in r.text and "RTX-4090" in r.text


@pytest.mark.parametrize(("form", "field", "says"), [
    ({"model": "gpt-9"}, "model", "unknown preset"), ({"tokens": "lots"}, "tokens", "number"),
    ({"tokens": "-5"}, "tokens", "greater than 0"), ({"gpus": "x"}, "gpus", "integer"),
    ({"precision": "int3"}, "precision", "bf16"), ({"tokens": "1e400"}, "tokens", ""), ({"tokens": "nan"}, "tokens", ""),
])  # fmt: skip
def test_quote_errors_show_at_their_field_never_a_500(world: World, form: dict[str, str], field: str,
                                                      says: str) -> None:  # fmt: skip
    c, _ = world.tenant("qerr@example.com")
    data = {"model": "llama3.1-8b", "precision": "bf16", "tokens": "1e8", "gpu": "any", "gpus": "",
            "billing_mode": "on-demand", **form}  # fmt: skip
    r = c.post("/offers/quote", data, csrf_from="/offers", headers=EN)
    assert r.status_code == 422, (r.status_code, r.text[:300])
    marker = 'id="quote-error">' if field == "_" else f'id="q-{field}-error">'
    assert marker in r.text, r.text[r.text.find('id="quote"') :][:800]
    assert says in r.text.split(marker, 1)[1].split("</div>", 1)[0].replace("&#39;", "'")


def test_quote_needs_its_csrf_token(world: World) -> None:
    c, _ = world.tenant("qcsrf@example.com")
    c.get("/offers")
    assert c.c.post("/offers/quote", data={"model": "llama3.1-8b", "tokens": "1e8"}).status_code == 403


def test_instances_show_how_to_enter_them_or_say_why_not(world: World) -> None:
    c, who = world.tenant("inst@example.com")
    job = world.submit(who, "name: j\ncommand: x\nresources: {gpu: RTX-4090, gpus: 1}\n")
    assert "No instances yet" in c.get("/instances", headers=EN).text
    w = world.running(who, world.submit(who, INSTANCE)["id"])
    html = c.get("/instances", headers=EN).text
    assert f"/workloads/{w['id']}" in html and f"/workloads/{job['id']}" not in html  # instances only
    assert f'action="/instances/{w["id"]}/lab"' in html
    ssh = world.api.get(f"{API}/ssh", headers=who).json()
    assert ssh["enabled"] and f"<code>ssh -p {ssh['port']} box@testserver</code>" in html
    assert "Add an SSH public key first" in html  # this tenant has none yet
    # a server without the gateway: the page says so instead of showing a command that cannot work
    settings = world.api.app.state.server.settings  # type: ignore[attr-defined]
    object.__setattr__(settings, "ssh_port", 0)
    html = c.get("/instances", headers=EN).text
    assert "runs no SSH gateway" in html and "ssh -p" not in html


def test_open_jupyterlab_follows_the_apis_single_use_link_for_the_owner_only(world: World) -> None:
    c, who = world.tenant("lab@example.com")
    w = world.running(who, world.submit(who, INSTANCE)["id"])
    r = c.post(f"/instances/{w['id']}/lab", csrf_from="/instances")
    assert r.status_code in (303, 409, 503), r.text[:300]  # the virtual executor has no sandbox to start it in
    if r.status_code == 303:
        assert r.headers["location"].startswith(f"/i/{w['id']}/auth?ticket=")
    else:
        assert 'id="error"' in r.text
    thief, _ = world.tenant("lab-thief@example.com")
    r = thief.post(f"/instances/{w['id']}/lab", csrf_from="/instances")
    assert r.status_code == 404 and "/i/" not in r.headers.get("location", "")
    assert thief.c.post(f"/instances/{w['id']}/lab", data={}, follow_redirects=False).status_code == 403


def test_the_pages_speak_chinese_and_escape_what_tenants_typed(world: World) -> None:
    c, who = world.tenant("zh@example.com")
    r = world.api.post(f"{API}/workloads", headers=who, json={"spec": {
        "name": "x", "command": "echo '<script>alert(1)</script>'", "resources": {"gpu": "RTX-4090", "gpus": 1}}})  # fmt: skip
    assert r.status_code == 201, r.text
    zh = {"Accept-Language": "zh-CN"}
    for path, heading in (("/workloads", "任务"), ("/run", "提交任务或创建实例"), ("/offers", "算力市场"),
                          ("/instances", "实例"), (f"/workloads/{r.json()['id']}", "GPU 利用率")):  # fmt: skip
        page = c.get(path, headers=zh)
        assert page.status_code == 200 and heading in page.text and "<script>alert" not in page.text, path
    detail = c.get(f"/workloads/{r.json()['id']}", headers=zh).text
    assert "echo &#39;&lt;script&gt;alert(1)&lt;/script&gt;&#39;" in detail  # its spec is shown, escaped
    bad = c.post("/run", {"name": "x", "command": "c", "gpus": "1", "env": "oops"}, csrf_from="/run", headers=zh)
    assert "请写成 KEY=VALUE" in bad.text
