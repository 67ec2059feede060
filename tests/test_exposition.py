"""The Prometheus exposition: checked by the real `promtool`, parsed back by the official parser, and the Grafana
dashboard held to the metric names the exporter really emits.

`promtool` comes from Debian's `prometheus` package (.ci/run installs it). Without it the promtool tests are skipped,
or fail when SUANLI_REQUIRE_PROMTOOL=1 (as on CI), so a CI image that lost it cannot pass silently.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from suanli.telemetry.exposition import CONTENT_TYPE, GPU_LABELS, GpuSeries, Platform, render
from suanli.telemetry.samples import GpuSample, Tagged
from tests.promtool import CAMEL, check_metrics, promtool

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "suanli-gpus.json"

# Label values that need every kind of escaping the format has, plus non-ASCII text.
WORKLOAD = 'train "llama" \\ v2\nretry'
ORG = "Acme 研究所 \\n 'lab' ☃"
T = 1_760_000_000.125


def _series(node: str, gpu: int, model: str, healthy: bool = True, workload: str = "", org: str = "", **reading):
    sample = GpuSample(node=node, gpu=gpu, uuid=f"GPU-{node}-{gpu}", t=T + gpu, **reading)
    return GpuSeries(Tagged(sample, model=model, workload=workload, org=org), hostname=node, healthy=healthy)


H100 = dict(mem_total_mib=81559, power_limit_w=700.0)
GPUS = [
    _series("gpu-node-02", 1, "A100-80GB", healthy=False, error="GPU is lost"),
    _series(
        "gpu-node-01",
        0,
        "H100-80GB",
        workload=WORKLOAD,
        org=ORG,
        util=97.0,
        mem_used_mib=70123,
        temp_c=71.0,
        power_w=612.5,
        sm_clock_mhz=1980,
        throttle=4,
        ecc_sbe=2,
        **H100,
    ),
    _series(
        "gpu-node-01",
        1,
        "H100-80GB",
        workload=WORKLOAD,
        org=ORG,
        util=88.5,
        mem_used_mib=70001,
        temp_c=69.5,
        power_w=590.0,
        sm_clock_mhz=1980,
        **H100,
    ),
    _series(
        "gpu-node-01", 2, "H100-80GB", util=0.0, mem_used_mib=3, temp_c=35.0, power_w=71.25, sm_clock_mhz=345, **H100
    ),
    _series(
        "gpu-node-01",
        3,
        "H100-80GB",
        healthy=False,
        workload="infer-7",
        org="globex",
        util=0.0,
        mem_used_mib=512,
        temp_c=40.0,
        power_w=90.0,
        sm_clock_mhz=345,
        xid=79,
        ecc_dbe=1,
        **H100,
    ),
    _series(
        "gpu-node-02", 0, "A100-80GB", util=12.0, mem_used_mib=1024, temp_c=44.0, power_w=80.0, sm_clock_mhz=1410
    ),  # no memory total nor power limit: those series are left out
]
PLATFORM = Platform(
    queue_by_class={"reserved": 0, "on-demand": 3, "spot": 7},
    gpus_by_model={"H100-80GB": (3, 0, 1, 0), "A100-80GB": (0, 1, 1, 2)},
    waste_fraction=1 / 6,
    fragmentation=0.125,
    waste_gpu_seconds=12_345.5,
    queued_capacity_gpu_seconds=98_765.25,
    revenue_per_hour=31.8,
    currency="CNY",
    sched_latency_buckets=[(0.005, 10), (0.05, 95), (0.5, 120), (math.inf, 121)],
    sched_latency_sum=4.75,
    nodes_by_state={"ready": 2, "draining": 0, "down": 1},
    unhealthy_gpus=2,
)

Key = tuple[str, frozenset[tuple[str, str]]]


def _expected() -> dict[Key, float]:
    """What `render(GPUS, PLATFORM)` must say, written out independently of the module."""
    want: dict[Key, float] = {}

    def put(name: str, value: float, **labels: str) -> None:
        want[(name, frozenset(labels.items()))] = float(value)

    for g in GPUS:
        s = g.tagged.sample
        labels = dict(
            zip(
                GPU_LABELS,
                [str(s.gpu), s.uuid, g.hostname, g.tagged.model, g.tagged.workload, g.tagged.org],
                strict=True,
            )
        )
        put("suanli_gpu_healthy", 1 if g.healthy else 0, **labels)
        put("suanli_gpu_sample_timestamp_seconds", s.t, **labels)
        if s.error:
            continue
        put("DCGM_FI_DEV_GPU_UTIL", s.util, **labels)
        put("DCGM_FI_DEV_GPU_TEMP", s.temp_c, **labels)
        put("DCGM_FI_DEV_FB_USED", s.mem_used_mib, **labels)
        if s.mem_total_mib:
            put("DCGM_FI_DEV_FB_FREE", s.mem_total_mib - s.mem_used_mib, **labels)
        put("DCGM_FI_DEV_POWER_USAGE", s.power_w, **labels)
        if s.power_limit_w:
            put("DCGM_FI_DEV_POWER_MGMT_LIMIT", s.power_limit_w, **labels)
        put("DCGM_FI_DEV_SM_CLOCK", s.sm_clock_mhz, **labels)
        put("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", s.throttle, **labels)
        put("DCGM_FI_DEV_XID_ERRORS", s.xid, **labels)
        put("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", s.ecc_sbe, **labels)
        put("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", s.ecc_dbe, **labels)
    for cls, n in [("reserved", 0), ("on-demand", 3), ("spot", 7)]:
        put("suanli_queued_workloads", n, **{"class": cls})
    for model, counts in [("H100-80GB", (3, 0, 1, 0)), ("A100-80GB", (0, 1, 1, 2))]:
        for state, n in zip(["allocated", "free", "unhealthy", "draining"], counts, strict=True):
            put("suanli_gpus", n, model=model, state=state)
    put("suanli_unhealthy_gpus", 2)
    put("suanli_gpu_waste_ratio", 1 / 6)
    put("suanli_gpu_fragmentation_ratio", 0.125)
    put("suanli_waste_gpu_seconds_total", 12_345.5)
    put("suanli_queued_capacity_gpu_seconds_total", 98_765.25)
    for le, n in [("0.005", 10), ("0.05", 95), ("0.5", 120), ("+Inf", 121)]:
        put("suanli_scheduling_pass_seconds_bucket", n, le=le)
    put("suanli_scheduling_pass_seconds_count", 121)
    put("suanli_scheduling_pass_seconds_sum", 4.75)
    put("suanli_revenue_per_hour", 31.8, currency="CNY")
    for state, n in [("ready", 2), ("draining", 0), ("down", 1)]:
        put("suanli_nodes", n, state=state)
    return want


def _parsed(body: bytes) -> tuple[dict[Key, float], dict[str, tuple[str, str]]]:
    """Samples keyed by (name, labels), and each family's (type, help), as the official parser reads them."""
    samples: dict[Key, float] = {}
    families: dict[str, tuple[str, str]] = {}
    for family in text_string_to_metric_families(body.decode("utf-8")):
        families[family.name] = (family.type, family.documentation)
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = s.value
    return samples, families


def test_values_and_labels_round_trip_exactly() -> None:
    samples, families = _parsed(render(GPUS, PLATFORM))
    assert samples == _expected()
    # The escaped label values come back verbatim (spelled out once; the equality above covers every series).
    first = {"gpu": "0", "UUID": "GPU-gpu-node-01-0", "Hostname": "gpu-node-01", "modelName": "H100-80GB"}
    assert samples[("DCGM_FI_DEV_GPU_UTIL", frozenset({**first, "workload": WORKLOAD, "org": ORG}.items()))] == 97.0
    # dcgm-exporter's types and help texts, so its dashboards and alert rules read these the same way.
    assert families["DCGM_FI_DEV_GPU_UTIL"] == ("gauge", "GPU utilization (in %).")
    assert families["DCGM_FI_DEV_FB_USED"] == ("gauge", "Framebuffer memory used (in MiB).")
    assert families["DCGM_FI_DEV_XID_ERRORS"] == ("gauge", "Value of the last XID error encountered.")
    assert families["suanli_waste_gpu_seconds"][0] == "counter"
    assert families["suanli_scheduling_pass_seconds"][0] == "histogram"


def test_an_unreadable_gpu_is_unhealthy_with_no_readings() -> None:
    samples, _ = _parsed(render(GPUS, None))
    lost = {name: v for (name, labels), v in samples.items() if ("UUID", "GPU-gpu-node-02-1") in labels}
    assert lost == {"suanli_gpu_healthy": 0.0, "suanli_gpu_sample_timestamp_seconds": T + 1}
    assert {name for name, _ in samples if name.startswith("suanli_")} == {  # no platform series without a platform
        "suanli_gpu_healthy",
        "suanli_gpu_sample_timestamp_seconds",
    }


def test_output_does_not_depend_on_input_order_and_is_served_with_the_librarys_content_type() -> None:
    assert render(GPUS, PLATFORM) == render(list(reversed(GPUS)), PLATFORM)
    assert CONTENT_TYPE.startswith("text/plain; version=")


def test_scheduling_latency_buckets_are_checked() -> None:
    for bad in ([(0.1, 1), (0.05, 2), (math.inf, 2)], [(0.1, 5), (math.inf, 4)], [(0.1, 1)]):
        with pytest.raises(ValueError, match="cumulative"):
            render([], replace(PLATFORM, sched_latency_buckets=bad))
    samples, _ = _parsed(render([], replace(PLATFORM, sched_latency_buckets=[])))
    assert samples[("suanli_scheduling_pass_seconds_bucket", frozenset({("le", "+Inf")}))] == 0.0


def test_promtool_accepts_the_exposition() -> None:
    # The platform series alone: lint-clean, not a single remark.
    platform_only = check_metrics(render([], PLATFORM))
    assert (platform_only.returncode, platform_only.stdout + platform_only.stderr) == (0, "")

    # Per-GPU series: promtool's only remark is dcgm-exporter's camelCase `modelName` label, kept for compatibility...
    body = render(GPUS, PLATFORM)
    full = check_metrics(body)
    remarks = (full.stdout + full.stderr).splitlines()
    assert full.returncode == 3 and remarks and all(CAMEL.match(line) for line in remarks), remarks
    # ...which is all there is: with it spelled snake_case the whole exposition is lint-clean.
    renamed = re.sub(rb"([{,])modelName=", rb"\1model_name=", body)
    assert renamed.count(b"model_name=") == body.count(b"modelName=") > 0
    clean = check_metrics(renamed)
    assert (clean.returncode, clean.stdout + clean.stderr) == (0, "")


# --- the Grafana dashboard --------------------------------------------------------------------------------------


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _exprs(dashboard: dict) -> list[str]:
    """Every PromQL expression in the dashboard: panel targets and template-variable queries."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_dashboard_is_a_grafana_dashboard_model() -> None:
    d = _dashboard()
    assert isinstance(d["schemaVersion"], int) and d["uid"] and d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"Hostname", "modelName", "org"} <= variables.keys()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for panel in d["panels"]:
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys() and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]


def test_dashboard_uses_only_metrics_the_exporter_emits() -> None:
    emitted = {name for name, _ in _parsed(render(GPUS, PLATFORM))[0]}
    used = {m for expr in _exprs(_dashboard()) for m in re.findall(r"DCGM_FI_\w+|suanli_\w+", expr)}
    assert used and used <= emitted, sorted(used - emitted)
    for needed in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS", "suanli_scheduling_pass_seconds_bucket"):
        assert needed in used


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    tool = promtool()
    concrete = [
        re.sub(r"\$__rate_interval", "5m", re.sub(r"\$(Hostname|modelName|org)\b", ".*", e))
        for e in _exprs(_dashboard())
    ]
    queries = [e for e in concrete if not e.startswith("label_values(")]  # Grafana's function, not PromQL
    queries += [re.fullmatch(r"label_values\((.+), \w+\)", e).group(1) for e in concrete if e not in queries]
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(queries)]}
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    result = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
