"""What reading a hub model through the sandbox's read-only mount costs, against a plain directory.

    python benchmarks/hub.py [--runs 5] [--hidden 512] [--layers 8]

A Llama of random weights (about 58M parameters, 230 MB of float32 safetensors with the defaults) is built
locally and added to a hub directory (`storage.hub`: the Hugging Face cache layout, blobs behind relative links).
Jobs on the local executor then time `AutoModelForCausalLM.from_pretrained(...)` inside themselves (the import of
torch and transformers is not counted), in three ways, interleaved run by run:

- hub: sandboxed, the entry bound read-only at /hub with the platform's variables, loaded as "ORG/NAME" offline;
- plain: sandboxed, the same files as a plain directory bound read-only, loaded by path;
- hub-host: unsandboxed, the hub directory on the host (links to blobs), loaded as "ORG/NAME" offline;
- host: unsandboxed, the plain directory on the host, loaded by path.

Files are in the page cache after the first run of each (the first is shown apart). Prints medians.
Needs bubblewrap, torch and transformers (the dev extras).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from suanli.control.storage import hub
from suanli.executors.base import Launch, NodeRank, SandboxRequest
from suanli.executors.local import LocalExecutor
from suanli.storage.hub import HubStore

REPO = "bench/llama-random"
PROBE = (  # torch and the model's code imported first: transformers imports lazily, inside from_pretrained
    "import time, sys, torch\n"
    "from transformers import AutoModelForCausalLM\n"
    "import transformers.models.llama.modeling_llama\n"
    "t = time.perf_counter()\n"
    "m = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
    "print('load_s', time.perf_counter() - t, sum(p.numel() for p in m.parameters()))\n"
)


def build(out: Path, hidden: int, layers: int) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8)  # fmt: skip
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def run_job(base: Path, n: int, target: str, sandbox: SandboxRequest | None, env: dict[str, str]) -> float:
    work, logs = base / f"w{n}", base / f"l{n}"
    work.mkdir()
    logs.mkdir()
    (work / "probe.py").write_text(PROBE)
    python = sys.executable
    launch = Launch(workload_id=f"wl-hub-{n}", attempt=1, command=f"{python} probe.py {target}", workdir=work,
                    env=env, ranks=(NodeRank("local", 0, ()),), log_dir=logs, sandbox=sandbox)  # fmt: skip
    ex = LocalExecutor()
    handle = ex.launch(launch, time.time())
    while (st := ex.poll(handle, time.time())).state == "running":
        time.sleep(0.02)
    text = (logs / "rank-0.log").read_text()
    if st.exit_code != 0 or "load_s" not in text:
        raise SystemExit(f"job failed ({st.reason}):\n{text[-2000:]}")
    return float(text.split("load_s", 1)[1].split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="suanli-hub-bench-") as tmp:
        base = Path(tmp)
        os.chmod(base, 0o755)
        plain = base / "plain"
        params = build(plain, args.hidden, args.layers)
        for p in plain.iterdir():  # save_pretrained writes weights 0600: the sandbox's own uid could not read them
            p.chmod(0o644)
        size = sum(p.stat().st_size for p in plain.iterdir())
        stored = HubStore(base / "hubdir").add_dir("model", REPO, plain)
        binds = hub.binds(HubStore(base / "hubdir"), [stored])
        uid = 0x10000778 if os.geteuid() == 0 else None
        prefix = os.path.realpath(sys.prefix)
        extra = tuple((p, p, False) for p in {prefix, os.path.realpath(sys.base_prefix)} if not p.startswith("/usr/"))
        hub_box = SandboxRequest(uid=uid, gid=uid, mounts=(*extra, *binds.mounts))
        plain_box = SandboxRequest(uid=uid, gid=uid, mounts=(*extra, (str(plain), "/model", False)))
        ways = {
            "hub": (REPO, hub_box, binds.env),
            "plain": ("/model", plain_box, {"HF_HUB_OFFLINE": "1"}),
            "hub-host": (REPO, None, hub.binds(HubStore(base / "hubdir"), [stored], sandboxed=False).env),
            "host": (str(plain), None, {"HF_HUB_OFFLINE": "1"}),
        }
        times: dict[str, list[float]] = {k: [] for k in ways}
        n = 0
        for _ in range(args.runs + 1):
            for name, (target, box, env) in ways.items():
                n += 1
                times[name].append(run_job(base, n, target, box, env))
        print(f"model: {params / 1e6:.1f}M parameters, {size / 1e6:.0f} MB on disk; {args.runs} runs after a first")
        print(f"{'way':<9} {'first s':>8} {'median s':>9} {'min s':>7} {'median vs host':>15}")
        host = statistics.median(times["host"][1:])
        for name, ts in times.items():
            med = statistics.median(ts[1:])
            print(f"{name:<9} {ts[0]:>8.3f} {med:>9.3f} {min(ts[1:]):>7.3f} {med / host:>14.2f}x")


if __name__ == "__main__":
    main()
