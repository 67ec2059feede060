"""Published Mixture-of-Experts (and recent dense) training rows from moe_and_inference.yaml, as model inputs.

Each row becomes (system, job, plan) described only by hardware and the published configuration; the measured
step time is `gbs * seq / (tokens/s/GPU * GPUs)`. Rows are split once, deterministically, into a calibration
part and a held-out part by hashing the row's configuration (model, GPU, GPU count, precision, batch, plan:
every release of one configuration falls on the same side), 30% held out. The split was fixed before any
error was looked at; the held-out rows are reported, never used to change the model.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from suanli.perf import Placement, Plan, TrainJob, model_preset
from suanli.perf.training import RECOMPUTE_MODULES
from suanli.topology import parse

HELD_OUT_PERCENT = 30
RECIPE_FLAGS = Path(__file__).resolve().parent / "data" / "bridge_moe_recipe_flags.yaml"
MODELS = {
    "DeepSeekV3": "deepseek-v3",
    "DeepSeekV3 (w/o MTP)": "deepseek-v3-nomtp",
    "DeepSeekV3 (w/ MTP)": "deepseek-v3",
    "Kimi_K2": "kimi-k2",
    "Qwen3_30B_a3B": "qwen3-30b-a3b",
    "Qwen3_235B_a22B": "qwen3-235b-a22b",
    "GPT OSS 120B": "gpt-oss-120b",
    "Mixtral-8x7B": "mixtral-8x7b",
    "LLAMA3_70B": "llama3.1-70b",
    "LLAMA3.1_405B": "llama3.1-405b",
    "LLAMA3_8B": "llama3.1-8b",
}
PRECISION = {"MXFP8": "mxfp8", "FP8-MX": "mxfp8", "FP8": "fp8", "FP8-CS": "fp8", "FP8-CS (FP8-MX)": "fp8",
             "BF16": "bf16", "NVFP4": "nvfp4"}  # fmt: skip
# systems as published: DGX/HGX boards of 8 with one 400G NIC per GPU (B300: 800G CX-8); NVL72 racks of
# 18 trays x 4 GPUs in one NVLink domain, 400G (GB200) / 800G (GB300) per GPU
SYSTEMS = {
    "H100": ("H100-SXM", 8, 1, "ib-ndr"),
    "B200": ("B200", 8, 1, "ib-ndr"),
    "B300": ("B300", 8, 1, "ib-xdr"),
    "GB200": ("GB200", 4, 18, "ib-ndr"),
    "GB300": ("GB300", 4, 18, "ib-xdr"),
}


@dataclass(frozen=True)
class Case:
    key: str
    label: str
    group: str
    moe: bool
    held_out: bool
    measured_step_s: float
    job: TrainJob
    plan: Plan
    placement: Placement


def held_out(key: str) -> bool:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 100 < HELD_OUT_PERCENT


def _placement(gpu: str, gpus: int) -> Placement:
    name, gpn, domain_nodes, fabric = SYSTEMS[gpu]
    nodes = -(-gpus // gpn)
    if domain_nodes > 1:  # whole racks; the job takes the first GPUs of them
        nodes = -(-nodes // domain_nodes) * domain_nodes
    group = {"name": "n", "count": nodes, "gpu": name, "gpus_per_node": gpn, "nics": gpn}
    if domain_nodes > 1:
        group["nvlink_domain_nodes"] = domain_nodes
    c = parse({"name": "bench", "node_groups": [group], "fabric": fabric, "nodes_per_leaf": 32})
    return Placement(c, c.compact_gpus(gpus))


def _int(v: object, default: int = 1) -> int | None:
    if v is None:
        return default
    if isinstance(v, int):
        return v
    return None  # "a (b)" cells of 25.09: two configurations in one cell


def recipe_settings() -> dict[tuple, dict]:
    """(release, model, gpu, precision, gpus, gbs, mbs, tp, pp, vp, ep) -> the Plan settings of the row's
    Megatron-Bridge recipe: EP all-to-all overlap, token dispatcher, FP8 attention and selective recompute (data/bridge_moe_recipe_flags.yaml, read from
    the recipes, with its sources). A row no recipe matches keeps the Plan's defaults."""
    keys = ("release", "model", "gpu", "precision", "gpus", "gbs", "mbs", "tp", "pp", "vp", "ep")
    out = {}
    for r in yaml.safe_load(RECIPE_FLAGS.read_text()):
        if r["recipe"] is not None:
            out[tuple(r[k] for k in keys)] = {"moe_a2a_overlap": bool(r["moe_a2a_overlap"]),
                                              "moe_dispatcher": r["moe_dispatcher"],
                                              "fp8_attention": bool(r["fp8_attention"])}  # fmt: skip
            mods = tuple(m for m in r.get("recompute_modules") or () if m in RECOMPUTE_MODULES)
            if mods:
                out[tuple(r[k] for k in keys)] |= {"recompute": "selective", "recompute_modules": mods}
    return out


def cases(moe_yaml: dict) -> list[Case]:
    out: list[Case] = []
    settings = recipe_settings()
    groups = {g["group"]: g for g in moe_yaml["training"]}
    rows = list(groups["megatron_bridge_performance_summary"]["rows"])
    for r in groups.get("nemo_framework_performance_summary_pages", {}).get("rows", []):
        if "gbs" in r and "tok_s_gpu" in r and isinstance(r.get("tok_s_gpu"), int | float):
            rows.append({**r, "task": "Pre-Training", "moe": True, "release": r["release"]})
    for r in rows:
        if r.get("task") != "Pre-Training" or r["model"] not in MODELS or r.get("fsdp"):
            continue
        prec = PRECISION.get(str(r.get("precision")))
        vals = {k: _int(r.get(k)) for k in ("gbs", "mbs", "seq", "tp", "pp", "cp", "vp", "ep", "gpus")}
        if prec is None or any(v is None for v in vals.values()) or r["gpu"] not in SYSTEMS:
            continue
        v: dict[str, int] = vals  # type: ignore[assignment]
        name = MODELS[r["model"]]
        arch = model_preset(name.removesuffix("-nomtp"))
        if name.endswith("-nomtp"):
            arch = replace(arch, mtp_layers=0)
        tp, pp, cp = v["tp"], v["pp"], v["cp"]
        if v["gpus"] % (tp * pp * cp):
            continue
        dp = v["gpus"] // (tp * pp * cp)
        recipe = settings.get(tuple(r.get(k) for k in ("release", "model", "gpu", "precision", "gpus", "gbs", "mbs", "tp",
                                                          "pp", "vp", "ep")), {}) if arch.is_moe else {}  # fmt: skip
        plan = Plan(tp=tp, pp=pp, cp=cp, vp=v["vp"], mbs=v["mbs"], dp=dp, ep=v["ep"] if arch.is_moe else 1, **recipe)
        job = TrainJob(arch, prec, v["seq"], v["gbs"])  # type: ignore[arg-type]
        step = v["gbs"] * v["seq"] / (float(r["tok_s_gpu"]) * v["gpus"])
        key = "|".join(str(x) for x in (r["model"], r["gpu"], v["gpus"], prec, v["gbs"], v["mbs"], v["seq"], tp, pp, cp,
                                         v["vp"], v["ep"]))  # fmt: skip
        label = f"{r['release']} {r['model']} {r['gpu']}x{v['gpus']} {prec} {plan.label().split(' ZeRO')[0]}"
        out.append(Case(key, label, f"{name} {r['gpu']}", arch.is_moe, held_out(key), step, job, plan,
                        _placement(r["gpu"], v["gpus"])))  # fmt: skip
    return out
