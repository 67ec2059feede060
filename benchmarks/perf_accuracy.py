"""Predicted vs measured: every measured table in the calibration set, with errors.

Usage: python benchmarks/perf_accuracy.py [--calibration PATH] [--reference PATH] [--split all|tune|holdout] [--json]

Reads ../shared/data/perf_reference/calibration.yaml (or --calibration); in a plain clone without ../shared it
says so and skips the tables that need that file (each table compares with one of its sections). Each measured
system is described here only by its hardware (GPU, node count, NICs, fabric) and its run configuration (the
published parallel plan); the model is never given the measured result. Targets (issue): median
|error| <= 10% and max <= 25% for busbw at sizes >= 1 MiB and for step time; serving output throughput (the
inference rows of ../shared/data/perf_reference/moe_and_inference.yaml, or --reference) median <= 15%, max <= 35%,
reported separately for the rows tuned against and the held-out quarter (`perf_serving_rows.py`).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from suanli.perf import (
    Layout,
    Placement,
    Plan,
    ServeError,
    ServeWorkload,
    TrainJob,
    estimate,
    evaluate,
    model_preset,
    serve,
)
from suanli.perf.models import TransformerArch
from suanli.topology import parse

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "perf_reference" / "calibration.yaml"
MiB = 1 << 20


def _sibling(name: str):
    """A module beside this script (the benchmarks folder is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


serving = _sibling("perf_serving_rows")


def cluster(gpu: str, nodes: int, gpn: int, fabric: str | None = None, nics: int = 8, nic_gbps: float | None = None):
    group = {"name": "n", "count": nodes, "gpu": gpu, "gpus_per_node": gpn, "nics": nics}
    if nic_gbps:
        group["nic_gbps"] = nic_gbps
    return parse({"name": "bench", "node_groups": [group], "fabric": fabric or "ib-ndr"})


@dataclass
class Row:
    table: str
    what: str
    measured: float
    predicted: float
    unit: str
    detail: str = ""

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def _size(label: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG])", label)
    assert m, label
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m[2]]
    # nccl-tests prints powers of two, the page abbreviates them (e.g. "33M" is 32 MiB)
    exact = int(m[1]) * 10 ** {"K": 3, "M": 6, "G": 9}[m[2]]
    p = round(__import__("math").log2(exact))
    return 1 << p if abs((1 << p) - exact) / exact < 0.2 else int(m[1]) * mult


def collective_rows(cal: dict) -> list[Row]:
    rows: list[Row] = []
    by_id = {t["id"]: t for t in cal["measured_collectives"]}

    def busbw_table(tid: str, c, entries: list[tuple[int, float]]) -> None:
        g = c.comm_group(c.compact_gpus(c.n_gpus))
        for size, bus in entries:
            if size < MiB:
                continue
            e = estimate("all_reduce", size, g)
            rows.append(
                Row(
                    tid,
                    f"all_reduce {size // MiB} MiB",
                    bus,
                    e.busbw_GBps,
                    "GB/s",
                    f"{e.algorithm}/{e.protocol}",
                )
            )

    t = by_id["dgxc_h100_1node_allreduce"]
    busbw_table(t["id"], cluster("H100-SXM", 1, 8), [(r["size_B"], r["busbw_GBps"]) for r in t["table"]])
    t = by_id["azure_nd_a100_v4_1node"]
    busbw_table(t["id"], cluster("A100-SXM-80G", 1, 8), [(_size(k), v) for k, v in t["busbw_inplace_GBps"].items()])
    t = by_id["aws_p4de_2node_allreduce"]
    busbw_table(
        t["id"],
        cluster("A100-SXM-80G", 2, 8, "efa-100", nics=4),
        [(r["size_B"], r["busbw_GBps"]) for r in t["table"]],
    )

    t = by_id["mle_nvls_gpu_count_ramp"]
    for gpu, key in (("H200", "rows_h200"), ("B200", "rows_b200_p6")):
        c = cluster(gpu, 1, 8)
        for r in t[key]:
            g = c.comm_group(c.compact_gpus(r["gpus"]))
            e = estimate("all_reduce", 8 << 30, g)
            rows.append(
                Row(
                    t["id"],
                    f"{gpu} {r['gpus']} GPUs all_reduce 8 GiB",
                    r["busbw"],
                    e.busbw_GBps,
                    "GB/s",
                    f"{e.algorithm}/{e.protocol}",
                )
            )
    c = cluster("H200", 1, 8)
    g = c.comm_group(c.compact_gpus(8))
    for op, key in (
        ("all_reduce", "all_reduce_NVLS"),
        ("all_gather", "all_gather_ring"),
        ("reduce_scatter", "reduce_scatter_ring"),
    ):
        e = estimate(op, 16 << 30, g)  # type: ignore[arg-type]
        rows.append(
            Row(
                t["id"],
                f"H200 8 GPUs {op} 16 GiB",
                t["h200_16GiB_by_collective"][key],
                e.busbw_GBps,
                "GB/s",
                f"{e.algorithm}/{e.protocol}",
            )
        )
    return rows


ARCH = {
    "Llama 3.1 70B": "llama3.1-70b",
    "Llama 3.1 405B": "llama3.1-405b",
    "Llama 3.1 8B": "llama3.1-8b",
    "Nemotron4 340B": "nemotron4-340b",
    "Nemotron4 15B": "nemotron4-15b",
}


def _cfg(text: str) -> dict[str, int]:
    out = {k.lower(): int(v) for k, v in re.findall(r"\b(TP|PP|CP|VP|MBS|GA)(\d+)", text)}
    seq = re.search(r"seq(\d+)", text)
    out["seq"] = int(seq[1]) if seq else 4096
    return out


def training_rows(cal: dict) -> list[Row]:
    rows: list[Row] = []
    eos = next(t for t in cal["measured_training"] if t["id"] == "dgxc_v24_11_eos_weak_scaling")
    last_cfg: dict[str, str] = {}
    for run in eos["runs"]:
        name = run["model"]
        if "cfg" in run:
            last_cfg[name] = run["cfg"]
        cfg_text = run.get("cfg") or last_cfg.get(name)
        if name.startswith("GPT-3 175B"):
            arch = model_preset("gpt3-175b")
            name = "GPT-3 175B"
        elif name in ARCH:
            arch = model_preset(ARCH[name])
        else:
            continue  # MoE and JAX/MaxText FSDP runs: not in this model's scope (dense Megatron plans only)
        if cfg_text is None:
            key = run["model"].split(" (")[0]
            cfg_text = next((v for k, v in last_cfg.items() if k.startswith(key)), "")
        cfg = _cfg(cfg_text or "")
        if name == "GPT-3 175B" and "seq" not in (cfg_text or ""):
            cfg["seq"] = 2048
        precision = run["precision"].lower()
        gbs_list = run.get("gbs")
        layers_list = run.get("layers") or next(
            (r.get("layers") for r in eos["runs"] if r["model"] == run["model"] and r.get("layers")), None
        )
        for i, (gpus, step) in enumerate(zip(run["gpus"], run["step_s"], strict=False)):
            a = arch
            if layers_list:
                a = TransformerArch(**{**arch.__dict__, "layers": layers_list[i]})
            gbs = gbs_list[i] if gbs_list else None
            tp, pp, cp = cfg.get("tp", 1), cfg.get("pp", 1), cfg.get("cp", 1)
            if gbs is None and "ga" in cfg:  # GBS = DP x MBS x gradient-accumulation steps
                gbs = gpus // (tp * pp * cp) * cfg.get("mbs", 1) * cfg["ga"]
            if gbs is None:  # FP8 rows reuse the BF16 row's batch
                bf = next(r for r in eos["runs"] if r["model"].startswith(run["model"].split(" (")[0]) and r.get("gbs"))
                gbs = bf["gbs"][bf["gpus"].index(gpus)] if gpus in bf["gpus"] else None
                if gbs is None:
                    continue
            dp = gpus // (tp * pp * cp)
            if dp < 1 or gpus % (tp * pp * cp) or (layers_list and layers_list[i] != arch.layers):
                continue  # proxy runs with fewer layers used an unpublished pipeline split
            plan = Plan(tp=tp, pp=pp, cp=cp, vp=cfg.get("vp", 1), mbs=cfg.get("mbs", 1), zero=1, dp=dp)
            c = cluster("H100-SXM", max(1, gpus // 8), min(8, gpus), "ib-ndr")
            placement = Placement(c, c.compact_gpus(gpus))
            job = TrainJob(a, precision, cfg["seq"], gbs)  # type: ignore[arg-type]
            est = evaluate(job, plan, placement)
            rows.append(
                Row(
                    "eos " + name,
                    f"{precision} {gpus} GPUs {plan.label().split(' ZeRO')[0]}",
                    step,
                    est.step_time_s,
                    "s",
                    f"mfu {est.mfu:.1%} mem {est.memory_bytes_per_gpu / 2**30:.0f} GiB fits={est.fits}",
                )
            )
    return rows


def serving_table(ref: dict, split: str) -> tuple[list[Row], list[str]]:
    """Predicted vs measured output tokens/s of each serving row in `split` (tune | holdout | all), and the rows
    skipped (model without a preset here)."""
    rows: list[Row] = []
    skipped: list[str] = []
    for r in serving.serving_rows(ref):
        if split != "all" and r.held_out != (split == "holdout"):
            continue
        try:
            arch = model_preset(r.model)
        except ValueError:
            skipped.append(r.row_id)
            continue
        c = cluster(r.gpu, max(1, r.gpus // 8), min(8, r.gpus))
        placement = Placement(c, c.compact_gpus(r.gpus))
        precision = "fp8" if r.precision == "fp8" else "bf16"
        w = ServeWorkload(r.input_len, r.output_len, rate=r.rate, num_requests=r.num_requests)
        try:
            e = serve(arch, placement.gpu, Layout(r.gpus, r.tp, r.pp), precision, w, placement.group_fn())
        except ServeError as err:
            skipped.append(f"{r.row_id}: {err}")
            continue
        lat = ""
        if r.measured_itl_ms is not None:
            ttft = "-" if e.ttft_s is None else f"{e.ttft_s * 1e3:.0f}"
            lat = f" ttft {ttft}/{r.measured_ttft_ms:.0f} ms itl {e.itl_s * 1e3:.1f}/{r.measured_itl_ms:.0f} ms"
        what = f"{r.model} {r.gpu} TP{r.tp} {r.precision} {r.input_len}/{r.output_len}"
        what += f" @{r.rate:g}/s" if r.rate is not None else " max"
        rows.append(Row(("held-out " if r.held_out else "") + r.group.split("_v")[0], what, r.measured_tokens_per_s,
                        e.tokens_per_s, "tok/s", f"B={e.batch:.0f}/{e.max_batch} {e.bound}{lat}"))  # fmt: skip
    return rows, skipped


def summarise(rows: list[Row]) -> dict[str, float]:
    errs = [abs(r.error) for r in rows]
    return {"n": len(rows), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs)}


# Every table: its key in the --json document, its title, the calibration section it compares with, its rows.
TABLES = (
    ("collectives", "Collectives: busbw, sizes >= 1 MiB", "measured_collectives", collective_rows),
    ("training", "Training: step time", "measured_training", training_rows),
)


def tables(cal: dict) -> tuple[list[tuple[str, str, list[Row]]], list[tuple[str, str]]]:
    """(key, title, rows) of each table the calibration data allows, and (title, why) of each it does not."""
    done, skipped = [], []
    for key, title, section, build in TABLES:
        if section not in cal:
            skipped.append((title, f"needs `{section}` from the calibration file"))
            continue
        try:
            rows = build(cal)
        except (KeyError, StopIteration, TypeError) as e:
            skipped.append((title, f"the calibration file lacks what it needs ({type(e).__name__}: {e})"))
            continue
        (done if rows else skipped).append((key, title, rows) if rows else (title, "no rows in range"))
    return done, skipped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", type=Path, default=None, help=f"default: {DEFAULT}")
    ap.add_argument("--reference", type=Path, default=None, help=f"serving rows; default: {serving.DEFAULT_REFERENCE}")
    ap.add_argument("--split", choices=("all", "tune", "holdout"), default="all",
                    help="serving rows: those the model was tuned against, the held-out quarter, or both")  # fmt: skip
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = args.calibration or DEFAULT
    cal: dict = {}
    if path.exists():
        cal = yaml.safe_load(path.read_text()) or {}
    elif args.calibration is not None:
        print(f"calibration file not found: {path}", file=sys.stderr)
        return 2
    else:  # a plain clone: the measured set lives in ../shared beside the repository
        print(f"calibration file not found: {path} (the measured set lives in ../shared/data/perf_reference beside "
              "the repository; give --calibration PATH); the tables that need it are skipped", file=sys.stderr)  # fmt: skip
    done, skipped = tables(cal)
    ref_path = args.reference or serving.DEFAULT_REFERENCE
    if ref_path.exists():
        ref = yaml.safe_load(ref_path.read_text()) or {}
        for split in ("tune", "holdout"):
            if args.split not in ("all", split):
                continue
            title = f"Serving ({'held-out rows' if split == 'holdout' else 'rows tuned against'}): output tokens/s"
            rows, missing = serving_table(ref, split)
            if missing:
                print(f"{title}: {len(missing)} rows skipped: " + "; ".join(missing[:3]) + " ...", file=sys.stderr)
            (done if rows else skipped).append((f"serving_{split}", title, rows) if rows else (title, "no rows"))
    elif args.reference is not None:
        print(f"reference file not found: {ref_path}", file=sys.stderr)
        return 2
    else:
        skipped.append(("Serving: output tokens/s", f"needs {ref_path.name} from ../shared/data/perf_reference"))
    for title, why in skipped:
        print(f"skipped: {title}: {why}", file=sys.stderr)
    if args.json:
        doc: dict = {key: summarise(rows) for key, _, rows in done}
        for key, _, rows in done:
            if key.startswith("serving"):
                doc[key]["groups"] = {g: summarise([r for r in rows if r.table == g]) for g in {r.table for r in rows}}
        doc["rows"] = [r.__dict__ | {"error": r.error} for _, _, rows in done for r in rows]
        doc["skipped"] = {title: why for title, why in skipped}
        print(json.dumps(doc, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)
    for _, title, rows in done:
        tab = Table(title=title)
        for col in ("table", "case", "measured", "predicted", "error", "detail"):
            tab.add_column(col, justify="right" if col in ("measured", "predicted", "error") else "left")
        for r in rows:
            style = "red" if abs(r.error) > 0.25 else ("yellow" if abs(r.error) > 0.10 else "")
            tab.add_row(
                r.table,
                r.what,
                f"{r.measured:.2f} {r.unit}",
                f"{r.predicted:.2f} {r.unit}",
                f"{r.error:+.1%}",
                r.detail,
                style=style,
            )
        con.print(tab)
        s = summarise(rows)
        target = "median <= 15%, max <= 35%" if title.startswith("Serving") else "median <= 10%, max <= 25%"
        con.print(
            f"[bold]{title}[/]: n={s['n']}  median |error| {s['median_abs_error']:.1%}  max |error| {s['max_abs_error']:.1%}"
            f"  (target: {target})"
        )
        groups = sorted({r.table for r in rows})
        if len(groups) > 1:
            for g in groups:
                gs = summarise([r for r in rows if r.table == g])
                con.print(f"  {g}: n={gs['n']}  median {gs['median_abs_error']:.1%}  max {gs['max_abs_error']:.1%}")
        con.print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
