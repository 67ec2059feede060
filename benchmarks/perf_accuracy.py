"""Predicted vs measured: every measured table in the calibration set, with errors.

Usage: python benchmarks/perf_accuracy.py [--calibration PATH] [--moe PATH] [--split calibration|held-out|both] [--json]

Reads ../shared/data/perf_reference/calibration.yaml (or --calibration); in a plain clone without ../shared it
says so and skips the tables that need that file (each table compares with one of its sections). Each measured
system is described here only by its hardware (GPU, node count, NICs, fabric) and its run configuration (the
published parallel plan); the model is never given the measured result. Targets (issue): median
|error| <= 10% and max <= 25% for busbw at sizes >= 1 MiB and for step time.

The Mixture-of-Experts tables read ../shared/data/perf_reference/moe_and_inference.yaml (or --moe): NVIDIA
Megatron-Bridge's published tokens/s/GPU with full configurations (benchmarks/perf_moe_rows.py), split once by
a hash of each row's configuration into a calibration part and a held-out part (30%), reported separately.

The serving tables read the `inference:` rows of the same file: TensorRT-LLM's max-throughput and online-serving
measurements (benchmarks/perf_serving_rows.py), output tokens/s predicted by `perf serve` for each; a quarter of
them, chosen by a hash of each row's identity before the serving model existed, is held out. Targets: median
|error| <= 15%, max <= 35%.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
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
from suanli.topology import parse

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "perf_reference" / "calibration.yaml"
DEFAULT_MOE = DEFAULT.with_name("moe_and_inference.yaml")
MiB = 1 << 20


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
    group: str = ""

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
                a = dataclasses.replace(arch, layers=layers_list[i])
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


def bridge_rows(moe: dict, moe_only: bool, split: str) -> list[Row]:
    """Megatron-Bridge training rows (MoE, or the dense ones) of one split: calibration or held-out."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from perf_moe_rows import cases
    from suanli.perf import PlanError

    rows: list[Row] = []
    for c in cases(moe):
        if c.moe != moe_only or c.held_out != (split == "held-out"):
            continue
        try:
            est = evaluate(c.job, c.plan, c.placement)
        except PlanError as e:
            rows.append(Row(split, c.label, c.measured_step_s, float("nan"), "s", f"refused: {e}", c.group))
            continue
        b = est.breakdown
        detail = (f"mfu {est.mfu:.1%} ep {b.get('ep_exposed', 0) / est.step_time_s:.0%} "
                  f"bubble {b['pp_bubble'] / est.step_time_s:.0%} fits={est.fits}")  # fmt: skip
        rows.append(Row(split, c.label, c.measured_step_s, est.step_time_s, "s", detail, c.group))
    return rows


def serving_rows(ref: dict, split: str) -> list[Row]:
    """Predicted vs measured output tokens/s of each TensorRT-LLM serving row in `split` (calibration | held-out).
    Rows of models without a preset, or whose layout the model refuses, show as refused (an infinite error)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from perf_serving_rows import serving_rows as load

    rows: list[Row] = []
    for r in load(ref):
        if r.held_out != (split == "held-out"):
            continue
        what = f"{r.model} {r.gpu} TP{r.tp} {r.precision} {r.input_len}/{r.output_len}"
        what += f" @{r.rate:g}/s" if r.rate is not None else " max"
        try:
            c = cluster(r.gpu, max(1, r.gpus // 8), min(8, r.gpus))
            placement = Placement(c, c.compact_gpus(r.gpus))
            precision = "fp8" if r.precision == "fp8" else "bf16"
            w = ServeWorkload(r.input_len, r.output_len, rate=r.rate, num_requests=r.num_requests,
                              max_num_tokens=r.max_num_tokens)  # fmt: skip
            e = serve(model_preset(r.model), placement.gpu, Layout(r.gpus, r.tp, r.pp), precision, w,
                      placement.group_fn())  # fmt: skip
        except (ServeError, ValueError) as err:
            rows.append(Row(split, what, r.measured_tokens_per_s, float("nan"), "tok/s", f"refused: {err}", r.group))
            continue
        lat = ""
        if r.measured_itl_ms is not None:
            ttft = "-" if e.ttft_s is None else f"{e.ttft_s * 1e3:.0f}"
            lat = f" ttft {ttft}/{r.measured_ttft_ms:.0f} ms itl {e.itl_s * 1e3:.1f}/{r.measured_itl_ms:.0f} ms"
        detail = f"B={e.batch:.0f}/{e.max_batch} {e.bound}{lat}"
        rows.append(Row(split, what, r.measured_tokens_per_s, e.tokens_per_s, "tok/s", detail, r.group))
    return rows


def summarise(rows: list[Row]) -> dict[str, float]:
    errs = [abs(r.error) if r.predicted == r.predicted else math.inf for r in rows]
    return {"n": len(rows), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs)}


def by_group(rows: list[Row]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(r.group, []).append(r)
    return {g: summarise(rs) for g, rs in sorted(groups.items())}


PUBLISHED_TITLE = "Collectives: published nccl-tests (A3 Mega TCPXO, B200), sizes >= 1 MiB"
# Every table: its key in the --json document, its title, the calibration section it compares with, its rows.
TABLES = (
    ("collectives", "Collectives: busbw, sizes >= 1 MiB", "measured_collectives", collective_rows),
    ("training", "Training: step time", "measured_training", training_rows),
)


def tables(
    cal: dict, moe: dict | None = None, split: str = "both"
) -> tuple[list[tuple[str, str, list[Row]]], list[tuple[str, str]]]:
    """(key, title, rows) of each table the calibration data allows, and (title, why) of each it does not."""
    done, skipped = [], []
    for sp in ("calibration", "held-out"):
        if split not in (sp, "both"):
            continue
        for moe_only, key, what in ((True, "moe_training", "MoE"), (False, "bridge_dense_training", "dense")):
            title = f"Megatron-Bridge {what} training: step time ({sp} split)"
            if moe is None:
                skipped.append((title, "needs moe_and_inference.yaml"))
                continue
            rows = bridge_rows(moe, moe_only, sp)
            (done if rows else skipped).append((f"{key}_{sp}", title, rows) if rows else (title, "no rows"))
        title = f"TensorRT-LLM serving: output tokens/s ({sp} split)"
        if moe is None:
            skipped.append((title, "needs moe_and_inference.yaml"))
            continue
        rows = serving_rows(moe, sp)
        (done if rows else skipped).append((f"serving_{sp}", title, rows) if rows else (title, "no rows"))
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:  # loaded as a module (tests), not run as a script
        sys.path.insert(0, here)
    from perf_published_rows import published_rows  # data in the repository: runs in a plain clone too

    done.append(("collectives_published", PUBLISHED_TITLE, published_rows(Row)))
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
    ap.add_argument("--moe", type=Path, default=None, help=f"default: {DEFAULT_MOE}")
    ap.add_argument("--split", choices=("calibration", "held-out", "both"), default="both",
                    help="which part of the MoE rows to report (the held-out part is never used for tuning)")  # fmt: skip
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    moe_path = args.moe or DEFAULT_MOE
    moe = yaml.safe_load(moe_path.read_text()) if moe_path.exists() else None
    if moe is None and args.moe is not None:
        print(f"MoE reference file not found: {moe_path}", file=sys.stderr)
        return 2
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
    done, skipped = tables(cal, moe, args.split)
    for title, why in skipped:
        print(f"skipped: {title}: {why}", file=sys.stderr)
    if args.json:
        doc: dict = {key: summarise(rows) for key, _, rows in done}
        doc["groups"] = {key: by_group(rows) for key, _, rows in done if rows and rows[0].group}
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
        if rows and rows[0].group:
            for g, gs in by_group(rows).items():
                con.print(
                    f"  {g}: n={gs['n']} median |error| {gs['median_abs_error']:.1%} max {gs['max_abs_error']:.1%}"
                )
        s = summarise(rows)
        target = (
            "median <= 15%, max <= 35%" if title.startswith("TensorRT-LLM serving") else "median <= 10%, max <= 25%"
        )
        con.print(
            f"[bold]{title}[/]: n={s['n']}  median |error| {s['median_abs_error']:.1%}  max |error| {s['max_abs_error']:.1%}"
            f"  (target: {target})\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
