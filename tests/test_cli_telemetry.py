"""GPU telemetry on the command line: `render_top` on a synthetic 32x8 fleet (no server), and the operator's path
against a real server whose background loops sample a virtual DGX SuperPOD unit: `admin top` shows every GPU, an
injected XID drains the node, and `admin nodes`, `admin events` and `admin node` say so; `suanli metrics` shows a
tenant's workload's GPUs. The CLI runs as `suanli …` subprocesses, as users run it."""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from suanli.cli.telemetry import parse_when
from suanli.cli.top_frame import UNHEALTHY, UNLIMITED, render_top
from suanli.client import ApiError, Client
from tests.cli_helpers import suanli
from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, live_server, poll
from tests.sqlite_only import sqlite_db_url  # noqa: F401  (the CLI's subject is not the database)

PRESET = "dgx-h100-superpod-su"
NODE = f"{PRESET}.dgx-0003"
WORKLOAD = "wl_0123456789abcdef"
ORG = "org_fedcba9876543210"
XID_REASON = "GPU 2 reported XID 79 (GPU has fallen off the bus)"


# ---- render_top, without a server --------------------------------------------------------------------------
def fleet() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """32 nodes x 8 GPUs: nodes 0-3 held by one workload (hot and busy), GPU 2 of node 5 unhealthy, node 7
    draining, node 9 silent (no readings); the summary the server would send with it."""
    gpus = []
    for n in range(32):
        for g in range(8):
            held = n < 4
            silent = n == 9
            row: dict[str, Any] = {
                "node": f"{PRESET}.dgx-{n:04d}", "node_state": "draining" if n == 7 else "ready", "gpu": g,
                "uuid": f"GPU-{n}-{g}", "model": "H100-SXM", "healthy": True, "health_reason": "",
                "memory_mib": 81559, "t": None if silent else "2025-06-01T12:00:00Z", "age_s": None if silent else 0.5,
                "util": None if silent else (97.0 if held else 0.0), "temp_c": None if silent else (71.0 if held else 35.0),
                "mem_used_mib": None if silent else 60000, "power_w": None if silent else 650.0, "sm_clock_mhz": 1980,
                "xid": 0, "error": "", "workload": WORKLOAD if held else "", "org": ORG if held else "",
            }  # fmt: skip
            gpus.append(row)
    bad = gpus[5 * 8 + 2]
    bad.update(healthy=False, health_reason=XID_REASON)
    summary = {
        "at": "2025-06-01T12:00:01Z",
        "gpus": {"total": 256, "reporting": 248,
                 "by_model": [{"model": "H100-SXM", "allocated": 32, "free": 223, "unhealthy": 1}]},
        "utilisation": {"avg": 12.5, "allocated_avg": 97.0},
        "temperature": {"p50": 35.0, "p90": 71.0, "max": 71.0, "bands": []},
        "unhealthy": [{"node": bad["node"], "gpu": 2, "reason": XID_REASON}],
        "nodes": {"ready": 31, "draining": 1},
        "queue": {"training": 3, "inference": 1},
        "waste": {"idle_gpus": 16, "fragmented_gpus": 4, "schedulable_gpus": 128, "waste_fraction": 0.125,
                  "fragmentation": 0.03125, "waste_gpu_hours": 2.0, "queued_gpu_hours": 16.0},
        "revenue_per_hour": "1234.50",
        "currency": "CNY",
    }  # fmt: skip
    return summary, gpus


def frame(width: int, height: int = UNLIMITED, data: tuple[dict[str, Any], list[dict[str, Any]]] | None = None) -> str:
    summary, gpus = data or fleet()
    out = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    out.print(render_top(summary, gpus, width=width, height=height))
    return out.export_text()


@pytest.mark.parametrize("width", [80, 120, 200])
def test_render_top_shows_every_node_the_summary_holders_and_health(width: int) -> None:
    text = frame(width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    assert "cluster dgx-h100-superpod-su" in text and "256 GPUs (248 reporting) on 32 nodes" in text
    assert "H100-SXM: 32 allocated, 223 free, 1 unhealthy" in text
    assert "util 12.5% avg (allocated 97.0%)" in text and "p50 35°C p90 71°C max 71°C" in text
    assert "queue inference 1, training 3" in text
    assert "waste 12.5% idle (16 GPUs)" in text and "fragmentation 3.1%" in text and "revenue ¥1,234.50/h" in text
    rows = {line.split()[0]: line for line in lines if line.startswith("dgx-")}
    assert len(rows) == 32 and "more nodes" not in text  # one line per node, none left out
    assert "a=wl_012345" in rows["dgx-0000"]  # the holder, tagged on its GPUs
    assert rows["dgx-0000"].count("a") >= 8 and "71" in rows["dgx-0000"]
    assert UNHEALTHY in rows["dgx-0005"] and "1 unhealthy" in rows["dgx-0005"]
    assert "draining" in rows["dgx-0007"]
    assert rows["dgx-0009"].count("--") == 8  # no readings
    assert f"{UNHEALTHY} dgx-0005 GPU 2: {XID_REASON}" in text
    legend = "\n".join(lines[-2:])
    assert "util ▁<10%" in legend and "temp °C ≥70 ≥85" in legend and f"{UNHEALTHY} unhealthy" in legend
    wide = width >= 160
    assert ("97%" in rows["dgx-0000"]) is wide  # utilisation as a number only where there is room


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 30), (200, 16)])
def test_render_top_caps_rows_to_the_height_with_problems_first(width: int, height: int) -> None:
    text = frame(width, height)
    lines = text.splitlines()
    assert len(lines) < height, text
    assert all(len(line) <= width for line in lines)
    shown = [line.split()[0] for line in lines if line.startswith("dgx-")]
    assert shown[:3] == ["dgx-0005", "dgx-0009", "dgx-0007"]  # problems first: unhealthy, silent, draining
    assert shown[3:] == sorted(shown[3:])  # then the rest in name order
    assert f"… {32 - len(shown)} more nodes" in text
    assert XID_REASON in text and "256 GPUs" in text


def test_render_top_for_a_big_fleet_and_an_empty_one() -> None:
    summary, gpus = fleet()
    many = [{**g, "node": f"big.n{i // 8:05d}"} for i, g in enumerate(gpus * 40)]  # 1,280 nodes, 10,240 GPUs
    text = frame(160, 40, (summary, many))
    assert len(text.splitlines()) < 40 and "more nodes" in text
    assert "1,280 nodes" in text
    empty = frame(100, 30, ({}, []))
    assert "no GPUs registered" in empty and "0 GPUs" in empty


def test_parse_when_accepts_iso_and_times_ago() -> None:
    now = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
    assert parse_when("-15m", "--since", now) == now - timedelta(minutes=15)
    assert parse_when("2h", "--since", now) == now - timedelta(hours=2)
    assert parse_when("-1d", "--since", now) == now - timedelta(days=1)
    assert parse_when("-30s", "--since", now) == now - timedelta(seconds=30)
    assert parse_when("2025-06-01T10:00:00Z", "--since", now) == datetime(2025, 6, 1, 10, tzinfo=UTC)
    assert parse_when("2025-06-01T10:00:00", "--since", now) == datetime(2025, 6, 1, 10, tzinfo=UTC)  # UTC
    assert parse_when("2025-06-01T12:00:00+08:00", "--since", now) == datetime(2025, 6, 1, 4, tzinfo=UTC)
    assert parse_when(None, "--since", now) is None


# ---- against a live server ----------------------------------------------------------------------------------
def test_top_fault_drain_events_and_metrics_against_a_live_server(db_url: str, tmp_path: Path) -> None:
    env = {"SUANLI_VIRTUAL": PRESET, "SUANLI_TELEMETRY_INTERVAL_S": "1", "SUANLI_SCHEDULE_INTERVAL_S": "0.2",
           "SUANLI_METER_INTERVAL_S": "1"}  # fmt: skip
    ops, tenant = tmp_path / "ops", tmp_path / "tenant"
    with live_server(tmp_path / "srv", db_url, env=env) as srv, ThreadPoolExecutor(4) as pool:
        url = srv.url

        def cli(*args: str, home: Path = ops, code: int = 0, stdin: str | None = None) -> str:
            return suanli(list(args), home, url, code=code, stdin=stdin).stdout

        login = pool.submit(cli, "login", "--email", ADMIN_EMAIL, "--password-stdin", stdin=f"{ADMIN_PASSWORD}\n")
        signup = pool.submit(cli, "signup", "--email", "t@example.com", "--password-stdin", home=tenant,
                             stdin="tenant-pass-1\n")  # fmt: skip
        assert "(admin)" in login.result() and "t@example.com" in signup.result()
        spec = tmp_path / "job.yaml"
        spec.write_text("name: probe\ncommand: train\nresources: {gpu: H100-SXM, gpus: 1}\nduration: 1h\n")
        job = pool.submit(cli, "run", str(spec), "--json", home=tenant)

        # every GPU of the SuperPOD unit reports, and `top` draws one line per node
        def all_reporting() -> bool:
            doc = json.loads(cli("admin", "top", "--json"))
            temps = [g["temp_c"] for g in doc["gpus"]]
            return len(temps) == 256 and None not in temps and doc["summary"]["gpus"]["reporting"] == 256

        poll(all_reporting, "all 256 GPUs reporting")
        text = cli("admin", "top", "--once")
        assert "256 GPUs (256 reporting) on 32 nodes" in text and "H100-SXM:" in text
        assert sum(line.startswith("dgx-") for line in text.splitlines()) == 32
        assert "°C" in text and "revenue" in text and "unhealthy GPUs" not in text
        token = json.loads((ops / "credentials.json").read_text())[url]["token"]
        with Client(url, token) as c:  # the SDK's Prometheus call, outside /api/v1
            assert "DCGM_FI_DEV_GPU_TEMP{" in c.metrics_text()
        with Client(url) as c, pytest.raises(ApiError) as refused:
            c.metrics_text()
        assert refused.value.status == 401

        # an XID 79 on GPU 2 of one node: the GPU is marked unhealthy and the node drained
        out = cli("admin", "fault", NODE, "--gpu", "2", "--kind", "xid", "--xid", "79")
        assert "injected xid 79" in out and f"suanli admin undrain {NODE}" in out

        def drained() -> dict[str, Any] | None:
            rows = {n["name"]: n for n in json.loads(cli("admin", "nodes", "--json"))}
            n = rows[NODE]
            return n if n["state"] == "draining" and n["unhealthy_gpus"] == 1 else None

        node = poll(drained, f"{NODE} draining with one unhealthy GPU")
        assert "XID 79" in node["state_reason"] and node["last_seen_at"] is not None
        futures = [pool.submit(cli, *a) for a in (
            ("admin", "events", NODE), ("admin", "events", NODE, "--json"), ("admin", "node", NODE),
            ("admin", "nodes"), ("admin", "top", "--once"))]  # fmt: skip
        events_text, events_json, node_text, nodes_text, top_text = (f.result() for f in futures)
        kinds = [e["kind"] for e in json.loads(events_json)]
        assert kinds[:3] == ["injected", "xid", "drained"], kinds
        assert "XID 79" in events_text and "xid" in events_text and "drained" in events_text
        row = next(line for line in node_text.splitlines() if line.startswith("│ 2 "))
        assert "✗" in row and "XID 79" in row
        assert f"suanli admin undrain {NODE}" in node_text
        assert "1 GPU unhealthy" in nodes_text and "ago" in nodes_text
        assert "unhealthy GPUs (1)" in top_text and f"dgx-0003 GPU 2: {XID_REASON}" in top_text

        # a node's series, and bad input named by its option
        bad_since = pool.submit(suanli, ["admin", "node-metrics", NODE, "--since", "yesterday"], ops, url, code=2)
        bad_xid = pool.submit(suanli, ["admin", "fault", NODE, "--gpu", "1", "--kind", "xid"], ops, url, code=2)
        series = cli("admin", "node-metrics", NODE, "--since", "-5m", "--resolution", "raw")
        assert series.count("H100-SXM") == 8 and "°C" in series and "unhealthy" in series and ", raw" in series
        assert "--since" in bad_since.result().stderr and "--xid" in bad_xid.result().stderr

        # the tenant's workload: its GPU, while it held it
        wid = json.loads(job.result())["id"]

        def held() -> dict[str, Any] | None:
            doc = json.loads(cli("metrics", wid, "--json", home=tenant))
            return doc if doc["gpus"] and doc["gpus"][0]["points"] else None

        doc = poll(held, "the workload's GPU sampled")
        assert doc["workload"] == wid and doc["name"] == "probe" and len(doc["gpus"]) == 1
        text = cli("metrics", "probe", "--since", "-10m", home=tenant)
        assert wid in text and doc["gpus"][0]["node"] in text and "°C" in text
        suanli(["metrics", wid, "--resolution", "5m"], tenant, url, code=2)
