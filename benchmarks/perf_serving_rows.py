"""Serving rows of the inference reference set, and the held-out split of them.

`perf_accuracy.py` loads this file beside it. Each row of `inference:` in
../shared/data/perf_reference/moe_and_inference.yaml becomes a `ServingCase` (the hardware and workload the
measurement ran, never its result) plus the measured values. The split is fixed by hashing a row's identity
(group, model, GPU, parallelism, precision, lengths, request rate), not by looking at errors: a quarter of the rows
are held out and only reported, never used while changing the model.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

HOLDOUT_MODULUS = 4  # one row in four (by hash) is held out

# Names the reference uses for models and GPUs → the project's presets and catalog names.
MODEL_NAMES = {
    "llama v3.1 8b": "llama3.1-8b",
    "llama 3.1 8b": "llama3.1-8b",
    "llama v3.1 70b": "llama3.1-70b",
    "llama 3.1 70b": "llama3.1-70b",
    "llama v3.1 405b": "llama3.1-405b",
    "mixtral 8x7b": "mixtral-8x7b",
    "mixtral 8x22b": "mixtral-8x22b",
}


# The engine's token budget per iteration (max_num_tokens) in each source's setup: trtllm-bench builds its engines
# with dataset-driven settings (the model takes 32,768 tokens for them); the v0.14 online table ran Triton with
# engines built by trtllm-build, whose default is 8,192.
ENGINE_MAX_NUM_TOKENS = {"trtllm_perf_overview_v0.17": 32768, "trtllm_online_serving_v0.14": 8192}


def _gpu_name(label: str) -> str:
    return "H200" if label.upper().startswith("H200") else "H100-SXM" if label.upper().startswith("H100") else label


@dataclass(frozen=True)
class ServingRow:
    row_id: str
    group: str
    model: str  # preset name
    gpu: str  # catalog name
    gpus: int
    tp: int
    pp: int
    precision: str
    input_len: int
    output_len: int
    rate: float | None  # requests/s; None: fed at infinite rate (max throughput)
    num_requests: int | None
    measured_tokens_per_s: float  # output tokens/s, all GPUs
    measured_ttft_ms: float | None = None
    measured_itl_ms: float | None = None
    max_num_tokens: int = 8192

    @property
    def held_out(self) -> bool:
        return is_held_out(self.row_id)


def is_held_out(row_id: str) -> bool:
    return int(hashlib.sha256(row_id.encode()).hexdigest()[:8], 16) % HOLDOUT_MODULUS == 0


# trtllm-bench feeds this many requests per ISL/OSL pair (the max-throughput table's notes).
_OFFLINE_REQUESTS = {(128, 128): 30000, (128, 2048): 3000, (128, 4096): 1500, (2048, 128): 3000, (2048, 2048): 1500,
                     (5000, 500): 1500, (1000, 1000): 3000, (500, 2000): 3000, (20000, 2000): 1000}  # fmt: skip


def serving_rows(ref: dict) -> list[ServingRow]:
    """Every inference row whose model the project has a preset for is returned; `skipped` rows are not."""
    out: list[ServingRow] = []
    for group in ref.get("inference", []):
        gid = group["group"]
        for r in group["rows"]:
            model = MODEL_NAMES.get(str(r["model"]).lower(), str(r["model"]))
            gpu = _gpu_name(str(r["gpu"]))
            rate_raw = r.get("request_rate_qps")
            rate = None if rate_raw is None or str(rate_raw).upper() == "INF" else float(rate_raw)
            isl, osl = int(r["isl"]), int(r["osl"])
            tp, pp = int(r.get("tp") or 1), int(r.get("pp") or 1)
            precision = str(r["precision"]).lower()
            row_id = f"{gid}|{model}|{gpu}|tp{tp}|pp{pp}|{precision}|{isl}/{osl}|{rate_raw or 'max'}"
            requests = r.get("num_requests") or _OFFLINE_REQUESTS.get((isl, osl))
            out.append(
                ServingRow(
                    row_id, gid, model, gpu, int(r.get("gpus") or tp * pp), tp, pp, precision, isl, osl, rate,
                    int(requests) if requests else None, float(r["output_tokens_per_s_total"]),
                    float(r["mean_ttft_ms"]) if "mean_ttft_ms" in r else None,
                    float(r["mean_itl_ms"]) if "mean_itl_ms" in r else None,
                    ENGINE_MAX_NUM_TOKENS.get(gid, 8192),
                )
            )  # fmt: skip
    return out
