"""The operator's console in Chromium against a real server with a virtual preset: the heat map shows one cell per
GPU, a click leads to the node, and a fault injected there recolours the map (health colouring) without a reload."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, bearer
from tests.web_helpers import console_server, screenshot

pytestmark = pytest.mark.browser
RED = "rgb(211, 47, 47)"  # static/ops_cluster.js: the unhealthy colour
GREEN = "rgb(46, 125, 50)"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with console_server(tmp_path_factory, "web-ops", env={"SUANLI_TELEMETRY_INTERVAL_S": "1"}) as srv:
        yield srv


def _login(browser: Any, url: str) -> Any:
    ctx = browser.new_context(locale="en-US", viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    page.goto(url + "/login")
    page.fill("#email", ADMIN_EMAIL)
    page.fill("#password", ADMIN_PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(url + "/")
    return page


def _colours(page: Any) -> list[str]:
    return page.eval_on_selector_all("#heat i", "els => els.map(e => getComputedStyle(e).backgroundColor)")


def test_heat_map_one_cell_per_gpu_and_recolours_after_a_fault(server: Any, browser: Any) -> None:
    token = httpx.post(server.url + "/api/v1/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()
    gpus = httpx.get(server.url + "/api/v1/admin/gpus", headers=bearer(token["token"])).json()
    virtual = [g for g in gpus if g["model"] == "RTX-4090"]
    assert len(virtual) == 8
    page = _login(browser, server.url)
    page.goto(server.url + "/ops/cluster")
    page.wait_for_selector("#heat[data-drawn='1']")
    assert page.locator("#heat i").count() == len(gpus)
    assert page.get_attribute("#heat", "data-painted") == str(len(gpus))
    page.check("input[name=hm-mode][value=health]")
    node = virtual[0]["node"]
    cells = f"#heat a[data-node='{node}'] i"
    page.wait_for_function(f"""() => [...document.querySelectorAll("{cells}")]
        .every(e => getComputedStyle(e).backgroundColor === "{GREEN}")""")
    page.check("input[name=hm-mode][value=util]")
    page.wait_for_function(
        f"""() => [...document.querySelectorAll("{cells}")]
        .some(e => getComputedStyle(e).backgroundColor !== "rgb(215, 219, 226)")""",
        timeout=20_000,
    )
    screenshot(page, "ops-cluster")

    page.evaluate("window.__same_page = true")
    with page.context.expect_page() as opened:  # the node opens beside the map, which stays open
        page.click(f"{cells} >> nth=3", modifiers=["Control"])
    node_page = opened.value
    node_page.wait_for_load_state()
    assert node_page.url.endswith(f"/ops/nodes/{node}")
    node_page.fill("#fault-form input[name=gpu]", "3")
    node_page.select_option("#fault-form select[name=kind]", "xid")
    node_page.fill("#fault-form input[name=xid]", "79")
    node_page.click("#fault-form button")
    node_page.wait_for_selector("#events >> text=fault injected: xid 79")

    page.check("input[name=hm-mode][value=health]")
    page.wait_for_function(
        f"""() => getComputedStyle(document.querySelectorAll("{cells}")[3])
        .backgroundColor === "{RED}" """,
        timeout=30_000,
    )
    assert page.evaluate("window.__same_page") is True  # repainted by the poll, not by a reload
    node_page.reload()
    node_page.wait_for_selector("#events >> text=XID 79")
    screenshot(node_page, "ops-node")
    screenshot(page, "ops-cluster-fault")
    colours = page.eval_on_selector_all(cells, "els => els.map(e => getComputedStyle(e).backgroundColor)")
    assert colours.count(RED) == 1 and colours[3] == RED
    page.context.close()


def test_revenue_and_waste_charts_draw(server: Any, browser: Any) -> None:
    page = _login(browser, server.url)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    for path, name in (("/ops/revenue", "ops-revenue"), ("/ops/waste", "ops-waste")):
        page.goto(server.url + path)
        page.wait_for_selector("#chart[data-drawn='1'] canvas")
        assert errors == [], errors
        screenshot(page, name)
    page.context.close()


def test_codes_batch_prints_once(server: Any, browser: Any) -> None:
    page = _login(browser, server.url)
    page.goto(server.url + "/ops/codes")
    page.fill("#codes-form input[name=amount]", "100.00")
    page.fill("#codes-form input[name=count]", "6")
    page.fill("#codes-form input[name=note]", "expo 2026")
    page.click("#codes-form button")
    page.wait_for_selector("#codes .code-card")
    assert page.locator("#codes code.code").count() == 6
    screenshot(page, "ops-codes-print")
    page.reload()  # the sheet was shown once; the reload shows the batch and makes no second one
    assert page.locator("#codes code.code").count() == 0 and page.locator("#redeemed").count() == 1
    page.goto(server.url + "/ops/codes")
    assert page.locator("#batches tr").count() == 2
    screenshot(page, "ops-codes")
    page.context.close()
