"""The console in the browser: page weight and time to interactive of the dashboard and the cluster heat map.

Usage: python benchmarks/web_console.py [--preset 128x8:H100] [--runs 5]

A real `suanli server` (SQLite) with the virtual preset `--preset` (default 128 nodes × 8 H100 = 1,024 GPUs, their
telemetry sampled every 5 s) is driven by Debian's Chromium under Playwright. Each run opens a fresh browser
context (an empty cache, as a first visit) signed in as the operator, and measures in the browser:
- weight: bytes transferred for the page and everything it loaded (Navigation + Resource Timing `transferSize`;
  the dashboard's and the map's first poll are not counted, they come after the page is interactive);
- time to interactive: navigation start → the dashboard's cards are in the page and its scripts have run
  (`domContentLoadedEventEnd`: deferred scripts ran by then), or → the heat map's cells are painted (the page's
  own `performance.mark("heatmap-drawn")`, after which every cell has its colour and answers the mouse).
The table gives the median of `--runs` runs (and the slowest). Goal (issue 22): < 1 s on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, bearer, live_server  # noqa: E402
from tests.web_helpers import chromium  # noqa: E402

MEASURE = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const res = performance.getEntriesByType("resource").filter(r => r.startTime < (window.__ready || 1e12));
  const drawn = performance.getEntriesByName("heatmap-drawn")[0];
  return {bytes: nav.transferSize + res.reduce((a, r) => a + r.transferSize, 0), requests: 1 + res.length,
          dcl: nav.domContentLoadedEventEnd, drawn: drawn ? drawn.startTime : null};
}"""


def measure(browser: Any, url: str, path: str, ready: str) -> dict[str, float]:
    ctx = browser.new_context(locale="en-US", viewport={"width": 1600, "height": 1000})
    page = ctx.new_page()
    page.goto(url + "/login")
    page.fill("#email", ADMIN_EMAIL)
    page.fill("#password", ADMIN_PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(url + "/")
    cookies = ctx.cookies()
    ctx.close()
    ctx = browser.new_context(locale="en-US", viewport={"width": 1600, "height": 1000})  # an empty cache
    ctx.add_cookies(cookies)
    page = ctx.new_page()
    page.goto(url + path)
    page.wait_for_selector(ready)
    page.wait_for_load_state("load")
    m = page.evaluate(MEASURE)
    ctx.close()
    tti = max(m["dcl"], m["drawn"] or 0)
    return {"bytes": m["bytes"], "requests": m["requests"], "tti_ms": tti}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="128x8:H100")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, chromium() as browser:
        home = Path(tmp)
        with live_server(home, f"sqlite+pysqlite:///{home}/suanli.db", args=("--virtual", args.preset)) as srv:
            token = httpx.post(srv.url + "/api/v1/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
            gpus = len(httpx.get(srv.url + "/api/v1/admin/gpus", headers=bearer(token.json()["token"])).json())
            pages = (("dashboard", "/", "#balance"), (f"heat map ({gpus} GPUs)", "/ops/cluster", "#heat[data-drawn]"))
            rows = []
            for name, path, ready in pages:
                measure(browser, srv.url, path, ready)  # warm the server's caches once
                runs = [measure(browser, srv.url, path, ready) for _ in range(args.runs)]
                rows.append((name, path, runs))
    print(f"{'page':<26} {'KB transferred':>15} {'requests':>9} {'TTI median ms':>14} {'TTI max ms':>11}")
    for name, _, runs in rows:
        kb = statistics.median(r["bytes"] for r in runs) / 1024
        tti = [r["tti_ms"] for r in runs]
        print(f"{name:<26} {kb:>15.1f} {runs[0]['requests']:>9} {statistics.median(tti):>14.0f} {max(tti):>11.0f}")


if __name__ == "__main__":
    main()
