"""`suanli sim`: JSON shape, policy selection, trace specs, load scaling, the report and the error paths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from suanli.sched import POLICIES
from tests.cli_helpers import invoke

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
GENERIC = f"csv:{FIXTURES / 'generic.csv'}"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SUMMARY_KEYS = {
    "jobs", "avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s", "utilization",
    "useful_utilization", "waste_fraction", "fragmentation", "preemptions", "jain_fairness", "worst_tenant_slowdown",
    "decision_p50_ms", "decision_p99_ms", "replay_wall_s", "finished", "queued", "running", "unschedulable",
    "failures", "avg_placement_slowdown", "work_gpu_h", "slowdown_gpu_h", "elastic_gpu_h", "preemption_gpu_h",
    "failure_gpu_h", "resize_gpu_h", "idle_queued_gpu_h", "requeued_gpu_h", "slowdown_by_size",
}  # fmt: skip


def sim(*args: str, code: int = 0) -> Any:
    return invoke(["sim", *args], code)


def sim_json(*args: str) -> dict[str, Any]:
    result = sim(*args, "--json")
    assert result.stderr == ""  # no progress output in --json mode
    return json.loads(result.stdout)  # exactly one document, nothing else on stdout


def bad_input(*args: str) -> str:
    """Exit code 2, nothing on stdout, one line on stderr and no traceback; returns that line."""
    result = sim(*args, code=2)
    assert result.stdout == ""
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def assert_conserved(doc: dict[str, Any]) -> None:
    for name, s in doc["policies"].items():
        assert set(s) == SUMMARY_KEYS, name
        assert s["jobs"] == doc["jobs"], name
        assert s["finished"] + s["queued"] + s["running"] + s["unschedulable"] == s["jobs"], name


def write_csv(path: Path, rows: list[tuple[float, int, float]]) -> str:
    lines = ["submit_time_s,num_gpus,duration_s", *(f"{t},{g},{d}" for t, g, d in rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return f"csv:{path}"


# ---- JSON ------------------------------------------------------------------------------------------------------
def test_synthetic_json_two_policies() -> None:
    doc = sim_json("--trace", "synthetic:200", "--cluster", "4x8:H100", "--policy", "fifo", "--policy", "default")
    assert list(doc) == ["trace", "cluster", "jobs", "load_scale", "policies"]
    assert doc["trace"] == "synthetic:200"
    assert doc["cluster"] == "4x8:H100-SXM"
    assert doc["jobs"] == 200
    assert doc["load_scale"] == 1.0
    assert list(doc["policies"]) == ["fifo", "default"]
    assert_conserved(doc)
    for s in doc["policies"].values():
        assert s["finished"] > 0
        assert 0 < s["utilization"] <= 1 and 0 <= s["waste_fraction"] <= 1
        assert s["p50_jct_s"] <= s["p95_jct_s"] <= s["p99_jct_s"]


def test_default_policies_and_seed() -> None:
    a = sim_json("--trace", "synthetic:60", "--cluster", "2x8:H100", "--seed", "3")
    b = sim_json("--trace", "synthetic:60", "--cluster", "2x8:H100", "--seed", "3")
    c = sim_json("--trace", "synthetic:60", "--cluster", "2x8:H100", "--seed", "4")
    assert list(a["policies"]) == ["fifo", "default"]
    assert a["policies"]["fifo"]["avg_jct_s"] == b["policies"]["fifo"]["avg_jct_s"]  # same seed, same jobs
    assert a["policies"]["fifo"]["avg_jct_s"] != c["policies"]["fifo"]["avg_jct_s"]


def test_generic_csv_fixture() -> None:
    doc = sim_json("--trace", GENERIC, "--cluster", "2x8:H100", "--policy", "fifo")
    assert doc["jobs"] == 6  # the 0-GPU row is skipped by the reader
    assert doc["policies"]["fifo"]["finished"] == 6
    assert_conserved(doc)


def test_generic_csv_fixture_notes_skipped_rows_on_stderr() -> None:
    result = sim("--trace", GENERIC, "--cluster", "2x8:H100", "--policy", "fifo")
    err = " ".join(result.stderr.split())  # Rich wraps the note at the terminal's width, wherever the path ends
    assert "skipped 1 row" in err and "zero_gpus" in err
    assert "skipped" not in result.stdout


def test_policy_all() -> None:
    # synthetic:200 once crashed the elastic policy (a job placed and grown in one cycle)
    doc = sim_json("--trace", "synthetic:200", "--cluster", "4x8:H100", "--policy", "all")
    assert list(doc["policies"]) == [*POLICIES, "oracle-srsf"]  # the clairvoyant reference beside the real ones
    assert_conserved(doc)


def test_policy_all_dedupes_and_default_alias() -> None:
    doc = sim_json("--trace", GENERIC, "--cluster", "4x8:H100", "--policy", "default", "--policy", "all")
    assert list(doc["policies"]) == ["default", *(p for p in POLICIES if p != "default"), "oracle-srsf"]


def test_a_policy_takes_switches_after_a_plus_and_each_run_is_named_by_them() -> None:
    doc = sim_json("--trace", "synthetic:200", "--cluster", "4x8:H100", "--policy", "default",
                   "--policy", "DEFAULT+grow_las+Gittins", "--policy", "default+gittins+grow_las")  # fmt: skip
    assert list(doc["policies"]) == ["default", "default+gittins+grow_las"]  # one name per configuration
    runs = doc["policies"]
    assert runs["default"] != runs["default+gittins+grow_las"]  # the switches reach the scheduler
    assert_conserved(doc)


def test_jobs_takes_the_first_n() -> None:
    doc = sim_json("--trace", "synthetic:200", "--cluster", "4x8:H100", "--policy", "fifo", "--jobs", "50")
    assert doc["jobs"] == 50
    assert_conserved(doc)


def test_load_scale_halves_the_arrival_span(tmp_path: Path) -> None:
    # three 10 s single-GPU jobs 1000 s apart on an idle cluster: makespan = last arrival + 10 s
    spec = write_csv(tmp_path / "t.csv", [(0, 1, 10), (1000, 1, 10), (2000, 1, 10)])
    base = sim_json("--trace", spec, "--cluster", "1x8:H100", "--policy", "fifo")
    fast = sim_json("--trace", spec, "--cluster", "1x8:H100", "--policy", "fifo", "--load-scale", "2")
    assert fast["load_scale"] == 2.0
    assert base["policies"]["fifo"]["makespan_s"] == pytest.approx(2010)
    assert fast["policies"]["fifo"]["makespan_s"] == pytest.approx(1010)
    assert fast["policies"]["fifo"]["avg_jct_s"] == pytest.approx(10)


def test_synthetic_load_scale_runs() -> None:
    base = sim_json("--trace", "synthetic:200", "--cluster", "4x8:H100", "--policy", "fifo")
    fast = sim_json("--trace", "synthetic:200", "--cluster", "4x8:H100", "--policy", "fifo", "--load-scale", "2")
    assert_conserved(fast)
    assert fast["policies"]["fifo"]["avg_queue_s"] >= base["policies"]["fifo"]["avg_queue_s"]


def test_node_failures() -> None:
    doc = sim_json("--trace", "synthetic:100", "--cluster", "4x8:H100", "--policy", "default", "--mtbf-hours", "20")
    assert doc["policies"]["default"]["failures"] > 0
    assert_conserved(doc)


# ---- table and report -------------------------------------------------------------------------------------------
def test_table_output() -> None:
    result = sim("--trace", "synthetic:100", "--cluster", "4x8:H100", "--policy", "fifo", "--policy", "las")
    out = result.stdout
    assert "avg JCT" in out and "waste" in out and "utilization" in out
    assert "synthetic:100" in out and "32 GPUs" in out and "100 jobs" in out
    assert "fifo" in out and "las" in out
    assert "{" not in out  # a table, not JSON
    assert "fifo" in result.stderr  # the progress bars went to stderr


def test_report(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    result = sim("--trace", "synthetic:200", "--cluster", "4x8:H100", "--policy", "fifo", "--policy", "default",
                 "--report", str(out))  # fmt: skip
    for name in ("jct_cdf.png", "utilization.png", "queue.png", "gpu_time.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        assert len(data) > 1000, name
        assert str(out / name) in result.stdout
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "fifo" in md and "default" in md
    assert "avg JCT" in md and "| metric | fifo | default |" in md
    assert "suanli sim --trace synthetic:200 --cluster 4x8:H100 --policy fifo --policy default --report" in md
    assert "Best on average JCT" in md and "Best on waste" in md


def test_report_with_json_keeps_stdout_pure(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    result = sim("--trace", GENERIC, "--cluster", "2x8:H100", "--policy", "all", "--report", str(out), "--json")
    doc = json.loads(result.stdout)
    assert list(doc["policies"]) == [*POLICIES, "oracle-srsf"]
    assert "summary.md" in result.stderr
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert all(name in md for name in POLICIES)
    assert (out / "queue.png").read_bytes().startswith(PNG_MAGIC)


# ---- errors --------------------------------------------------------------------------------------------------------
def test_unknown_policy() -> None:
    err = bad_input("--trace", "synthetic:10", "--cluster", "4x8:H100", "--policy", "sjf")
    assert "sjf" in err and all(p in err for p in POLICIES)


@pytest.mark.parametrize("name", ["default+sjf", "default+", "sjf+gittins"])
def test_unknown_switch_or_policy_is_named(name: str) -> None:
    err = bad_input("--trace", "synthetic:10", "--cluster", "4x8:H100", "--policy", name)
    assert ("gittins" in err and "elastic_shrink" in err) or ("sjf" in err and "default" in err)


def test_bad_trace_format() -> None:
    err = bad_input("--trace", "nosuch:x.csv", "--cluster", "4x8:H100")
    assert "nosuch" in err and "philly" in err and "synthetic:N" in err


@pytest.mark.parametrize("spec", ["x.csv", "synthetic:abc", "synthetic:0", "synthetic:"])
def test_bad_trace_spec(spec: str) -> None:
    assert spec in bad_input("--trace", spec, "--cluster", "4x8:H100")


def test_missing_trace_file(tmp_path: Path) -> None:
    err = bad_input("--trace", f"csv:{tmp_path / 'missing.csv'}", "--cluster", "4x8:H100")
    assert "missing.csv" in err and "cannot open" in err


def test_unreadable_trace_content() -> None:
    err = bad_input("--trace", f"philly:{FIXTURES / 'generic.csv'}", "--cluster", "4x8:H100")
    assert "generic.csv" in err


@pytest.mark.parametrize("cluster", ["nosuch-cluster", "4x8:NOSUCHGPU", "missing/cluster.yaml"])
def test_unknown_cluster(cluster: str) -> None:
    bad_input("--trace", "synthetic:10", "--cluster", cluster)


@pytest.mark.parametrize(
    ("option", "value"), [("--jobs", "0"), ("--load-scale", "0"), ("--mtbf-hours", "-1"), ("--mttr-hours", "0")]
)
def test_non_positive_numbers(option: str, value: str) -> None:
    assert option in bad_input("--trace", "synthetic:10", "--cluster", "4x8:H100", option, value)
