"""The issue's tenant flow in a real browser (Debian's Chromium) against a real server on a virtual RTX 4090 box:
sign up and see ¥10.00, submit a job from /run, see it running with its cost growing, see its GPU chart drawn,
stop it, and find its charge on the statement.

The virtual cluster's GPUs report telemetry by themselves: the server's telemetry loop samples the simulated GPUs
of virtual nodes (`SimulatedCollector`), loaded by the work placed on them, every `SUANLI_TELEMETRY_INTERVAL_S`;
no agent has to post `/api/v1/telemetry/samples`."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx
import pytest

from tests.control_plane import poll as until
from tests.web_helpers import console_server, screenshot

pytestmark = pytest.mark.browser
ENV = {"SUANLI_TELEMETRY_INTERVAL_S": "1", "SUANLI_SCHEDULE_INTERVAL_S": "0.2", "SUANLI_METER_INTERVAL_S": "1"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with console_server(tmp_path_factory, "web-work", env=ENV) as srv:
        yield srv


def canvas_drawn(page: Any) -> int:
    """Coloured pixels in the charts' canvases (0: nothing drawn)."""
    return int(
        page.evaluate("""() => {
        let n = 0;
        document.querySelectorAll('#charts canvas').forEach(c => {
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            for (let i = 0; i < d.length; i += 4) { if (d[i + 3] > 0 && (d[i] !== d[i + 1] || d[i + 1] !== d[i + 2])) n++; }
        });
        return n;
    }""")
    )


def test_sign_up_run_watch_stop_and_see_the_charge(server: Any, browser: Any) -> None:
    ctx = browser.new_context(locale="en-US", extra_http_headers={"Accept-Language": "en"})
    page = ctx.new_page()
    page.goto(server.url + "/signup")
    page.fill("#email", "runner@example.com")
    page.fill("#password", "runner-password")
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/")
    assert page.inner_text("#balance") == "¥10.00"

    page.goto(server.url + "/offers")
    assert "RTX-4090" in page.inner_text("#offers")
    screenshot(page, "offers")
    page.goto(server.url + "/run")
    page.fill("#name", "browser-job")
    page.fill("#command", "python train.py")
    page.select_option("#gpu", "RTX-4090")
    page.fill("#gpus", "2")
    screenshot(page, "run")
    page.click("#submit-form")
    page.wait_for_url(server.url + "/workloads/wl_*")
    wid = page.url.rsplit("/", 1)[1]

    until(lambda: page.inner_text("#state") == "running", "running", 60)  # htmx polls the status fragment
    first = Decimal(page.get_attribute("#cost", "data-exact") or "0")
    until(lambda: Decimal(page.get_attribute("#cost", "data-exact") or "0") > first, "cost growing", 20)
    assert page.inner_text("#rate") == "¥4.40/h"
    until(lambda: int(page.get_attribute("#charts", "data-points") or 0) > 0, "GPU samples charted", 40)
    assert page.locator("#charts canvas").count() >= 3
    until(lambda: canvas_drawn(page) > 100, "the GPU chart drawn", 15)
    until(lambda: "GPUs" in page.inner_text("#log"), "the log shown", 30)  # the virtual executor's first line
    screenshot(page, "workload")

    page.click("#stop")
    until(lambda: page.inner_text("#state") == "stopped", "stopped", 30)
    cost = Decimal(page.get_attribute("#cost", "data-exact") or "0")
    assert cost > 0

    page.goto(server.url + "/workloads?all=true")
    assert "browser-job" in page.inner_text("#workloads") and "stopped" in page.inner_text("#workloads")
    screenshot(page, "workloads")

    token = next(c["value"] for c in ctx.cookies() if c["name"] == "suanli_session")
    with httpx.Client(base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}) as api:
        w = api.get(f"/workloads/{wid}").json()
        alloc = w["allocation"]["id"]

        def charged() -> bool:
            rows = api.get(f"/orgs/{w['org_id']}/transactions").json()
            mine = [Decimal(t["amount"]) for t in rows if t["allocation_id"] == alloc and t["kind"] == "usage"]
            return bool(mine) and -sum(mine) == Decimal(w["cost"])

        until(charged, "the statement's usage lines summing to the workload's cost", 30)
    page.goto(server.url + "/wallet?kind=usage")  # and the same line on the wallet's statement
    statement = page.inner_text("#statement")
    line = next((row for row in statement.splitlines() if wid in row), "")
    assert "usage" in line and "browser-job" in line, statement
    shown = -Decimal(w["cost"]).quantize(Decimal("0.01"))
    assert f"-¥{abs(shown):,.2f}" in line, (line, w["cost"])
    ctx.close()
