"""What the bubblewrap sandbox costs a workload on the local executor, sandboxed vs not, side by side.

    python benchmarks/sandbox_overhead.py [--runs 20] [--work-runs 5]

- launch: from `LocalExecutor.launch` to the first line of the job's output in its log (goal: <= 50 ms added),
  plain, sandboxed on the host network, and sandboxed with `network: private` (pasta set up before the job runs);
- cpu: a CPU-bound loop of the system Python (the same interpreter both ways), timed inside the job (goal: <= 2%);
- io: writing and fsyncing 256 MiB to the workdir, then reading it back, timed inside the job (goal: <= 2%).

Runs as whoever starts it; as root the sandbox takes a uid of its own and a cgroup, as it does in the server.
Prints medians (and p90 for launch) with the sandboxed/plain ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from suanli.executors.base import Launch, NodeRank, SandboxRequest
from suanli.executors.local import LocalExecutor

CPU = "/usr/bin/python3 -c 'import time; t=time.perf_counter(); s=sum(i*i for i in range(6_000_000)); print(time.perf_counter()-t)'"
IO = (
    '/usr/bin/python3 -c \'import os,time; t=time.perf_counter(); f=open("blob","wb"); b=os.urandom(1<<20)\n'
    "for _ in range(256): f.write(b)\n"
    'f.flush(); os.fsync(f.fileno()); f.close(); f=open("blob","rb")\n'
    "while f.read(1<<20): pass\n"
    'f.close(); os.unlink("blob"); print(time.perf_counter()-t)\''
)


def _launch(base: Path, n: int, command: str, sandboxed: bool, network: str = "host") -> Launch:
    work, logs = base / f"w{n}", base / f"l{n}"
    work.mkdir()
    logs.mkdir()
    uid = 0x10000777 if os.geteuid() == 0 else None
    sandbox = SandboxRequest(cpu_milli=0, memory_mib=0, uid=uid, gid=uid, network=network) if sandboxed else None
    return Launch(workload_id=f"wl-bench-{n}", attempt=1, command=command, workdir=work, env={},
                  ranks=(NodeRank("local", 0, ()),), log_dir=logs, sandbox=sandbox)  # fmt: skip


def _run(base: Path, n: int, command: str, sandboxed: bool, network: str = "host") -> tuple[float, str]:
    """(seconds from launch to the first output line, the whole output)."""
    ex = LocalExecutor()
    launch = _launch(base, n, command, sandboxed, network)
    log = launch.log_dir / "rank-0.log"
    t0 = time.perf_counter()
    handle = ex.launch(launch, time.time())
    first = None
    while True:
        if first is None and log.exists() and b"\n" in log.read_bytes():
            first = time.perf_counter() - t0
        if ex.poll(handle, time.time()).state != "running":
            break
        time.sleep(0.001)
    text = log.read_text()
    if first is None:
        first = time.perf_counter() - t0
    return first, text


def _p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, round(q * (len(values) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--work-runs", type=int, default=5)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="suanli-sbx-bench-"))
    n = 0
    launch: dict[bool, list[float]] = {True: [], False: []}
    private: list[float] = []
    work: dict[tuple[str, bool], list[float]] = {}
    for i in range(args.runs):  # interleaved, so drift of the machine hits both alike
        for sandboxed in (i % 2 == 0, i % 2 == 1):
            n += 1
            launch[sandboxed].append(_run(base, n, "echo first", sandboxed)[0])
        if shutil.which("pasta"):
            n += 1
            private.append(_run(base, n, "echo first", True, "private")[0])
    for name, cmd in (("cpu", CPU), ("io", IO)):
        for i in range(args.work_runs):
            for sandboxed in (i % 2 == 0, i % 2 == 1):
                n += 1
                _, text = _run(base, n, cmd, sandboxed)
                lines = [x for x in text.splitlines() if not x.startswith("[suanli]")]
                work.setdefault((name, sandboxed), []).append(float(lines[-1]))
    print(f"{'measure':<34} {'plain':>10} {'sandboxed':>10} {'added':>9} {'ratio':>7}")
    for label, q in (("launch to first line, median", 0.5), ("launch to first line, p90", 0.9)):
        a, b = _p(launch[False], q) * 1000, _p(launch[True], q) * 1000
        print(f"{label:<34} {a:>8.1f}ms {b:>8.1f}ms {b - a:>7.1f}ms {b / a:>6.3f}x")
    for label, q in (("  network: private, median", 0.5), ("  network: private, p90", 0.9)):
        if private:  # against the sandbox on the host network: what pasta adds
            a, b = _p(launch[True], q) * 1000, _p(private, q) * 1000
            print(f"{label:<34} {a:>8.1f}ms {b:>8.1f}ms {b - a:>7.1f}ms {b / a:>6.3f}x  (vs sandboxed, host network)")
    for name, label in (("cpu", "CPU-bound loop, median"), ("io", "256 MiB write+fsync+read, median")):
        a, b = statistics.median(work[(name, False)]), statistics.median(work[(name, True)])
        print(f"{label:<34} {a:>9.3f}s {b:>9.3f}s {b - a:>8.3f}s {b / a:>6.3f}x")
    print(f"({args.runs} launches and {args.work_runs} work runs each way, interleaved; uid {os.geteuid()})")


if __name__ == "__main__":
    main()
