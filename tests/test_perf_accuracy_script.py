"""`benchmarks/perf_accuracy.py` in a plain clone (no ../shared): it says so, skips the tables that need the
calibration file, prints those it can, and exits 0; a --calibration that does not exist is an error."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "perf_accuracy.py"


def _script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("perf_accuracy_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _run(module: ModuleType, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
    return int(module.main())


def test_without_the_calibration_file_it_says_so_and_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _script(monkeypatch)
    monkeypatch.setattr(module, "DEFAULT", tmp_path / "shared" / "calibration.yaml")
    monkeypatch.setattr(module, "DEFAULT_MOE", tmp_path / "shared" / "moe_and_inference.yaml")
    assert _run(module, monkeypatch, "--json") == 0
    out, err = capsys.readouterr()
    assert f"calibration file not found: {tmp_path}" in err and "../shared" in err
    assert "skipped: Collectives" in err and "skipped: Training" in err
    doc = json.loads(out)
    # only the published nccl-tests rows kept in the repository run without ../shared
    assert doc["rows"] and {r["table"] for r in doc["rows"]} <= {"gcp_a3_mega_2node_tcpxo", "b200_1node_nccl_1807"}
    assert doc["collectives_published"]["n"] == len(doc["rows"]) and not doc.get("groups")
    calibration = {t: f"needs `{s}` from the calibration file" for _, t, s, _ in module.TABLES}
    assert calibration.items() <= doc["skipped"].items()
    others = {t: why for t, why in doc["skipped"].items() if t not in calibration}
    assert any(t.startswith("TensorRT-LLM serving") for t in others)  # the serving tables need the MoE file
    assert set(others.values()) == {"needs moe_and_inference.yaml"}
    assert _run(module, monkeypatch) == 0
    assert _run(module, monkeypatch, "--calibration", str(tmp_path / "nope.yaml")) == 2


def test_a_table_the_file_cannot_feed_is_skipped_and_the_others_print(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _script(monkeypatch)
    monkeypatch.setattr(module, "DEFAULT_MOE", tmp_path / "moe_and_inference.yaml")
    partial = tmp_path / "calibration.yaml"
    partial.write_text("measured_training: []\n")
    row = module.Row("t", "case", 1.0, 1.1, "s")
    monkeypatch.setattr(module, "TABLES", (*module.TABLES, ("extra", "Extra", "measured_training", lambda c: [row])))
    assert _run(module, monkeypatch, "--json", "--calibration", str(partial)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["extra"]["n"] == 1 and [r for r in doc["rows"] if r["table"] == "t"] == [doc["rows"][-1]]
    calibration = {t for t in doc["skipped"] if not t.endswith("split)")}  # the rest need the MoE/serving file
    assert calibration == {"Collectives: busbw, sizes >= 1 MiB", "Training: step time"}
