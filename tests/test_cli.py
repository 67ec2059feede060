"""The `suanli` command line: JSON shapes, unit parsing, error handling and the examples from the issue."""

from __future__ import annotations

import http.server
import itertools
import json
import math
import shutil
import socket
import subprocess
import sys
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from suanli import __version__
from suanli.cli.common import default_sizes, human_size, parse_size
from suanli.cli.main import app
from suanli.perf import TransformerArch
from tests.cli_helpers import RUNNER, invoke

GiB = 1 << 30
MiB = 1 << 20

H100_2x8 = [
    "--gpu", "H100-SXM", "--nodes", "2", "--gpus-per-node", "8", "--intra", "nvlink4",
    "--nics", "8", "--nic-gbps", "400", "--fabric", "infiniband",
]  # fmt: skip
ISSUE_TRAIN = [
    "perf", "train", "--model", "llama3.1-70b", "--precision", "bf16", "--gpu", "H100-SXM", "--gpus", "128",
    "--gpus-per-node", "8", "--intra", "nvlink4", "--nics", "8", "--nic-gbps", "400", "--fabric", "infiniband",
    "--seq-len", "8192", "--global-batch", "256",
]  # fmt: skip


def run(*args: str, code: int = 0) -> Any:
    return invoke(list(args), code)


def run_json(*args: str) -> Any:
    result = run(*args, "--json")
    return json.loads(result.stdout)  # exactly one document, nothing else on stdout


def bad_input(*args: str) -> str:
    """Exit code 2, nothing on stdout, one line on stderr and no traceback; returns that line."""
    result = run(*args, code=2)
    assert result.stdout == ""
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "Traceback" not in err
    return err


# ---- entry point -----------------------------------------------------------------------------------------
def _entry_point() -> str:
    found = shutil.which("suanli")
    if found is None:  # the scripts folder of this interpreter need not be on PATH
        candidate = Path(sys.executable).with_name("suanli")
        found = str(candidate) if candidate.exists() else None
    assert found is not None, "the suanli console script is not installed (pip install -e .)"
    return found


def test_installed_entry_point_help_and_version() -> None:
    exe = _entry_point()
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "perf" in out.stdout and "topology" in out.stdout
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and out.stdout.strip() == f"suanli {__version__}"


def test_no_arguments_shows_help() -> None:
    result = RUNNER.invoke(app, [])
    assert "perf" in result.stdout + result.stderr
    assert run("perf", "--help").stdout.count("collective") >= 1


# ---- sizes -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("8B", 8),
        ("4096", 4096),
        ("1K", 1024),
        ("1KiB", 1024),
        ("1KB", 1000),
        ("1kb", 1000),
        ("1MiB", 1048576),
        ("1M", 1048576),
        ("1MB", 1_000_000),
        ("8GiB", 8 * GiB),
        ("8G", 8 * GiB),
        ("1GB", 10**9),
        ("1.5KiB", 1536),
        (" 2 MiB ", 2 * MiB),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-1", "1iB", "1.3", "1XB", "MiB", "1 Mebibyte"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_default_sizes_and_human_size() -> None:
    sizes = default_sizes()
    assert sizes[0] == 8 and sizes[-1] == 8 * GiB
    assert all(b == 8 * a for a, b in itertools.pairwise(sizes))
    assert [human_size(s) for s in (8, 1024, 1536, MiB, 8 * GiB)] == ["8 B", "1 KiB", "1.50 KiB", "1 MiB", "8 GiB"]


# ---- perf collective -------------------------------------------------------------------------------------
def test_collective_json_shape_issue_example() -> None:
    doc = run_json(
        "perf", "collective", "--op", "all_reduce", *H100_2x8, "--size", "8", "--size", "1MiB", "--size", "8GiB"
    )
    assert doc["op"] == "all_reduce" and doc["gpus"] == 16 and doc["nodes"] == 2
    assert [r["size_bytes"] for r in doc["results"]] == [8, MiB, 8 * GiB]
    for r in doc["results"]:
        assert set(r) >= {"size_bytes", "time_us", "algbw_GBps", "busbw_GBps", "algorithm", "protocol"}
        assert r["time_us"] > 0 and r["busbw_GBps"] >= 0
    times = [r["time_us"] for r in doc["results"]]
    assert times == sorted(times)


def test_collective_default_sweep_and_comma_sizes() -> None:
    doc = run_json("perf", "collective", "--op", "all_gather")
    assert [r["size_bytes"] for r in doc["results"]] == default_sizes()
    assert doc["gpus"] == 8 and doc["nodes"] == 1
    doc = run_json("perf", "collective", "--size", "1KB,1KiB")
    assert [r["size_bytes"] for r in doc["results"]] == [1000, 1024]


def _busbw(*args: str, op: str = "all_reduce") -> float:
    return run_json("perf", "collective", "--op", op, "--size", "8GiB", *args)["results"][0]["busbw_GBps"]


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_two_ib_nodes_slower_than_one_nvlink_node_ring_ops(op: str) -> None:
    one = _busbw("--gpu", "H100-SXM", "--nodes", "1", "--gpus-per-node", "8", op=op)
    two = _busbw(*H100_2x8, op=op)
    assert two < one


def test_two_ib_nodes_slower_than_one_nvlink_node_all_reduce() -> None:
    assert _busbw(*H100_2x8) < _busbw("--gpu", "H100-SXM", "--nodes", "1", "--gpus-per-node", "8")


def test_collective_bad_input_exit_2() -> None:
    assert "invalid size '12XB'" in bad_input("perf", "collective", "--size", "12XB")
    assert "all_reduce" in bad_input("perf", "collective", "--op", "allreduce")
    assert "--gpus" in bad_input("perf", "collective", "--gpus", "0")
    assert "homogeneous" in bad_input("perf", "collective", "--cluster", "4x8:H100", "--gpu", "H200")
    assert "32 GPUs, 64 requested" in bad_input("perf", "collective", "--cluster", "4x8:H100", "--gpus", "64")


def test_collective_on_cluster_preset_file_and_table(tmp_path: Path) -> None:
    doc = run_json("perf", "collective", "--cluster", "h20-roce800-128", "--nodes", "2", "--size", "1GiB")
    assert doc["gpus"] == 16 and doc["nodes"] == 2 and doc["cluster"] == "h20-roce800-128"
    spec = {
        "name": "lab",
        "node_groups": [{"name": "a", "count": 2, "gpu": "A100", "gpus_per_node": 8, "nics": 4}],
        "fabric": "ib-hdr",
    }
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(spec))
    doc = run_json("perf", "collective", "--cluster", str(path), "--size", "64MiB")
    assert doc["cluster"] == "lab" and doc["gpus"] == 16
    out = run("perf", "collective", "--cluster", str(path), "--size", "64MiB").stdout
    assert "64 MiB" in out and "busbw" in out
    assert "not found" in bad_input("perf", "collective", "--cluster", str(tmp_path / "missing.yaml"))
    (tmp_path / "bad.yaml").write_text("name: x\nnode_groups: []\n")
    assert "node_groups" in bad_input("perf", "collective", "--cluster", str(tmp_path / "bad.yaml"))


# ---- perf train ------------------------------------------------------------------------------------------
def test_train_exact_plan_issue_example() -> None:
    doc = run_json(*ISSUE_TRAIN, "--tp", "4", "--pp", "4", "--cp", "2", "--vp", "5", "--mbs", "1")
    assert doc["fits"] is True and doc["searched"] is False
    assert doc["model"] == "llama3.1-70b" and doc["gpus"] == 128 and doc["precision"] == "bf16"
    assert doc["plan"] == {
        "tp": 4,
        "pp": 4,
        "cp": 2,
        "vp": 5,
        "mbs": 1,
        "zero": 1,
        "recompute": "none",
        "dp": 4,
        "ep": 1,
        "etp": 1,
        "moe_a2a_overlap": False,
        "moe_dispatcher": "flex",
        "fp8_attention": False,
        "recompute_modules": [],
    }
    for key in ("step_time_s", "tokens_per_s", "mfu", "tflops_per_gpu", "memory_gib_per_gpu"):
        assert doc[key] > 0
    assert 0 < doc["mfu"] < 1
    assert set(doc["breakdown"]) >= {"compute_linear", "tp_exposed", "pp_bubble", "dp_exposed"}
    assert doc["tokens_per_s"] == pytest.approx(256 * 8192 / doc["step_time_s"], rel=1e-3)


def test_train_search_plan_multiplies_to_gpus() -> None:
    doc = run_json("perf", "train", "--model", "llama3.1-8b", "--gpus", "16")
    p = doc["plan"]
    assert doc["searched"] is True and doc["fits"] is True
    assert p["tp"] * p["pp"] * p["cp"] * p["dp"] == 16


def test_train_fsdp_and_partly_fixed_plan() -> None:
    p = run_json("perf", "train", "--model", "llama3.1-8b", "--gpus", "16", "--tp", "1", "--pp", "1", "--zero", "3")[
        "plan"
    ]
    assert (p["tp"], p["pp"], p["zero"]) == (1, 1, 3) and p["cp"] * p["dp"] == 16


def test_train_tokens_and_cost() -> None:
    doc = run_json(
        "perf", "train", "--model", "llama3.1-8b", "--gpus", "8", "--tokens", "1e9", "--price-per-gpu-hour", "2"
    )
    assert doc["tokens"] == 1e9
    assert doc["time_to_train_s"] == pytest.approx(1e9 / doc["tokens_per_s"], rel=1e-3)
    assert doc["cost"] == pytest.approx(8 * doc["time_to_train_s"] / 3600 * 2, rel=1e-3)


def test_train_custom_model() -> None:
    dims = ["--layers", "4", "--hidden", "1024", "--ffn", "4096", "--heads", "8", "--kv-heads", "8", "--vocab", "32000"]
    doc = run_json("perf", "train", "--model", "custom", *dims, "--no-gated", "--gpus", "8", "--seq-len", "2048")
    assert doc["model"] == "custom"
    assert doc["params"] == TransformerArch("custom", 4, 1024, 4096, 8, 8, 32000, gated_mlp=False).params
    assert doc["fits"] is True
    assert "--heads" in bad_input("perf", "train", "--model", "custom", "--layers", "4")
    assert "custom" in bad_input("perf", "train", "--model", "llama3.1-8b", "--layers", "4")


def test_train_nvl72_gb300() -> None:
    args = ["perf", "train", "--model", "llama3.1-70b", "--intra", "nvl72", "--gpu", "GB300", "--gpus", "72"]
    doc = run_json(*args, "--gpus-per-node", "4", "--global-batch", "288", "--seq-len", "8192")
    assert doc["gpus"] == 72 and doc["nodes"] == 18 and doc["nvlink_domains"] == 1
    p = doc["plan"]
    assert p["tp"] * p["pp"] * p["cp"] * p["dp"] == 72 and doc["fits"] is True


def test_train_bad_input_exit_2() -> None:
    err = bad_input("perf", "train", "--model", "llama3.1-70b", "--gpu", "B999", "--gpus", "8")
    assert "B999" in err and "H100-SXM" in err and "GB300" in err
    assert "llama3.1-70b" in bad_input("perf", "train", "--model", "llama9", "--gpus", "8")
    assert "does not divide" in bad_input(*ISSUE_TRAIN, "--tp", "3", "--pp", "4", "--cp", "2")
    assert "pp*vp" in bad_input(
        *ISSUE_TRAIN, "--tp", "8", "--pp", "16", "--cp", "1", "--vp", "8"
    )  # 128 chunks > 80 layers + 2
    assert "zero" in bad_input("perf", "train", "--model", "llama3.1-8b", "--zero", "5")
    assert "selective" in bad_input("perf", "train", "--model", "llama3.1-8b", "--recompute", "some")
    assert "fp8" in bad_input("perf", "train", "--model", "llama3.1-8b", "--gpu", "V100", "--precision", "fp8")
    assert "infiniband" in bad_input("perf", "train", "--model", "llama3.1-8b", "--nodes", "2", "--fabric", "pigeon")
    assert "nvlink4" in bad_input("perf", "train", "--model", "llama3.1-8b", "--intra", "nvlink9")
    assert "presets" in bad_input("perf", "train", "--model", "llama3.1-8b", "--cluster", "nope")
    assert "tokens" in bad_input("perf", "train", "--model", "llama3.1-8b", "--tokens", "lots")


def test_train_and_plan_tables() -> None:
    out = run(*ISSUE_TRAIN, "--tp", "4", "--pp", "4", "--cp", "2", "--vp", "5", "--tokens", "1e9").stdout
    assert "TP4 PP4 CP2 DP4 VP5" in out and "step time" in out and "MFU" in out and "pp_bubble" in out
    out = run("perf", "plan", "--model", "llama3.1-8b", "--gpus", "16", "--top", "3").stdout
    assert "TP" in out and "tokens/s" in out


# ---- perf plan / compare / models -------------------------------------------------------------------------
def test_plan_ranked_list() -> None:
    doc = run_json("perf", "plan", "--model", "llama3.1-70b", "--gpus", "128", "--seq-len", "8192", "--top", "4")
    plans = doc["plans"]
    assert 1 <= len(plans) <= 4 and doc["any_fits"] is True
    assert [p["rank"] for p in plans] == list(range(1, len(plans) + 1))
    steps = [p["step_time_s"] for p in plans]
    assert steps == sorted(steps)
    for p in plans:
        assert p["fits"] is True
        assert math.prod(p["plan"][k] for k in ("tp", "pp", "cp", "dp")) == 128


def test_compare_clusters_25gbe_slower_than_roce() -> None:
    doc = run_json(
        "perf", "compare", "--model", "llama3.1-70b", "--gpus", "128",
        "--cluster", "h20-eth25g-128", "--cluster", "h20-roce800-128", "--price-per-gpu-hour", "1.5",
    )  # fmt: skip
    systems = doc["systems"]
    assert [s["system"] for s in systems] == ["h20-eth25g-128", "h20-roce800-128"]
    eth, roce = systems
    assert eth["step_time_s"] > roce["step_time_s"] and eth["tokens_per_s"] < roce["tokens_per_s"]
    assert roce["relative_throughput"] == 1.0
    for s in systems:
        assert s["time_to_train_s"] == pytest.approx(1e9 / s["tokens_per_s"], rel=1e-3)
        exact = Decimal(128) * Decimal(str(s["time_to_train_s"])) / 3600 * Decimal("1.5")
        assert s["price_per_gpu_hour"] == "1.5" and s["cost"] == str(exact.quantize(Decimal("0.01")))


def test_compare_gpu_types_and_errors() -> None:
    args = ["perf", "compare", "--model", "llama3.1-8b", "--gpus", "16", "--gpu", "H100", "--gpu", "A100"]
    doc = run_json(*args, "--cluster", "rtx4090-box", "--price-per-gpu-hour", "1")
    by = {s["system"]: s for s in doc["systems"]}
    assert "16 requested" in by["rtx4090-box"]["error"]
    assert by["H100"]["gpu"] == "H100-SXM" and by["H100"]["tokens_per_s"] > by["A100"]["tokens_per_s"]
    out = run(*args).stdout
    assert "H100-SXM" in out and "relative" in out
    assert "at least one" in bad_input("perf", "compare", "--model", "llama3.1-8b", "--gpus", "8")
    price = ["--price-per-gpu-hour", "1", "--price-per-gpu-hour", "2", "--price-per-gpu-hour", "3"]
    assert "one per system" in bad_input(*args, *price)
    for bad in ("-1", "nan", "1e9", "ten"):
        assert "--price-per-gpu-hour" in bad_input(*args, "--price-per-gpu-hour", bad), bad


def test_models_lists_presets() -> None:
    names = [m["name"] for m in run_json("perf", "models")]
    assert "llama3.1-70b" in names and "gpt3-175b" in names


# ---- topology ----------------------------------------------------------------------------------------------
def test_topology_presets() -> None:
    rows = {r["name"]: r for r in run_json("topology", "presets")}
    assert rows["synthetic-100k"]["gpus"] == 100_000
    assert rows["gb300-nvl72"]["gpus"] == 72
    assert "synthetic-100k" in run("topology", "presets").stdout


def test_topology_show() -> None:
    doc = run_json("topology", "show", "dgx-h100-superpod-su")
    assert doc["gpus"] == 256 and doc["nodes"] == 32 and doc["fabric"] == "ib-ndr"
    assert [t["tier"] for t in doc["tiers"]] == ["nvlink", "leaf"]
    doc = run_json("topology", "show", "4x8:A100")
    assert doc["gpus"] == 32 and doc["groups"][0]["gpu"] == "A100-SXM-80G"
    out = run("topology", "show", "synthetic-100k").stdout
    assert "100,000" in out and "core" in out
    assert "presets" in bad_input("topology", "show", "nope")


def test_compare_prices_from_the_default_price_book_when_none_is_given() -> None:
    from suanli.billing import default_price_book

    doc = run_json("perf", "compare", "--model", "llama3.1-8b", "--gpus", "16", "--cluster", "h20-roce800-128")
    [row] = doc["systems"]
    rate = default_price_book().gpu_rate("H20")
    assert Decimal(row["price_per_gpu_hour"]) == rate and row["price_source"].startswith("default price book")
    exact = Decimal(16) * Decimal(str(row["time_to_train_s"])) / 3600 * rate
    assert row["cost"] == str(exact.quantize(Decimal("0.01")))  # exact cents, no float on the way


# ---- a second `suanli up` -----------------------------------------------------------------------------------------
class _Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"status": "ok", "version": __version__, "database": "sqlite"}).encode()
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("command", ["up", "server"])
def test_a_second_up_says_suanli_is_running_there_without_printing_up_on(tmp_path: Path, command: str) -> None:
    """Issue: a second `suanli up` printed "up on …", then died with exit code 3 (its port was taken)."""
    running = http.server.HTTPServer(("127.0.0.1", 0), _Healthz)  # what a running suanli answers on /healthz
    threading.Thread(target=running.serve_forever, daemon=True).start()
    port = running.server_address[1]
    try:
        r = RUNNER.invoke(app, [command, "--port", str(port), "--home", str(tmp_path / "home")])
    finally:
        running.shutdown()
        running.server_close()
    out = r.stdout + r.stderr
    assert r.exit_code == 2, (r.exit_code, out, r.exception)
    assert "suanli up on" not in out and "suanli server on" not in out
    assert f"suanli is already up on http://127.0.0.1:{port} (version {__version__}, database sqlite)" in r.stderr
    assert not (tmp_path / "home" / "suanli.db").exists(), "nothing was started or written"


def test_up_on_a_port_another_program_holds_says_so(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        r = RUNNER.invoke(app, ["up", "--port", str(port), "--home", str(tmp_path / "home")])
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr, r.exception)
    assert f"port {port} on 127.0.0.1 is in use by another program" in r.stderr and "suanli up on" not in r.stderr
