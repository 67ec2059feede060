"""Volumes: copying in and out through the API against a plain `cp`, and what a snapshot costs.

Usage: python benchmarks/volumes.py [--size-mib 1024] [--files 10000] [--file-kib 4] [--runs 3] [--no-s3]
                                   [--s3-size-mib 128]

A real `suanli server` (SQLite) on this host; a tenant's volume on the local backend (the server's disk). For a
`--size-mib` file of random bytes and a tree of `--files` files of `--file-kib` KiB: `suanli volumes cp` into the
volume and back out (the SDK's `volume_upload`/`volume_download`, as the CLI runs them on the server's host: the
open files passed over the same-host socket; and over HTTP, as from another host: sha256 checked both ways, a tree
as one tar stream) next to `cp` / `cp -r` of the same data between two directories of the same disk. With
moto and s3fs installed (and not `--no-s3`), the same into a volume on the S3 backend (a moto S3 server on this
host: the copy lands in the working copy and is pushed to the bucket before the call returns) next to s3fs's own
`put`/`get` of the same data (a copy out of an S3 volume reads the server's working copy); the large file there is
`--s3-size-mib` (moto's server failed to complete a 1 GiB multipart upload: "seek of closed file"). Then a snapshot of the
local volume (the first copies every file into the blob store), one file changed, a second snapshot: its time and
the bytes it added, as a share of the volume. Medians of `--runs`. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.control_plane import live_server, signup  # noqa: E402

from suanli.cli.malloc import tune_for_streams  # noqa: E402
from suanli.client import Client  # noqa: E402


def median_time(fn: Callable[[], object], runs: int, before: Callable[[], object] | None = None) -> float:
    out = []
    for _ in range(runs):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def rounds(fns: dict[str, Callable[[], object]], runs: int, before: Callable[[], object]) -> dict[str, float]:
    """Median seconds of each way, taken in turns (one of each per round, so a busy minute hits all alike), each
    from the same start: `before` clears the destination and the page cache's dirty data is written back first
    (a copy of 1 GiB otherwise pays for the writeback of the one before it)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            before()
            os.sync()
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def clear(*paths: Path) -> None:
    for o in paths:
        shutil.rmtree(o, ignore_errors=True) if o.is_dir() else o.unlink(missing_ok=True)


def tree_bytes(top: Path) -> int:
    return sum(p.stat().st_size for p in top.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--file-kib", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-s3", action="store_true", help="skip the S3 backend")
    ap.add_argument("--s3-size-mib", type=int, default=128, help="the large file on S3 (moto keeps parts in memory)")
    args = ap.parse_args()
    tune_for_streams()  # as `suanli volumes cp` does
    moto = None
    if not args.no_s3:
        try:
            from moto.server import ThreadedMotoServer

            moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
            moto.start()
        except ImportError:
            print("moto[server] or s3fs is not installed: the S3 backend is not measured")
    with tempfile.TemporaryDirectory(prefix="suanli-vol-bench-", dir=os.environ.get("TMPDIR", "/var/tmp")) as tmp_s:
        tmp = Path(tmp_s)
        big = tmp / "big.bin"
        with open(big, "wb") as f:
            for _ in range(args.size_mib):
                f.write(os.urandom(1 << 20))
        tree = tmp / "tree"
        for i in range(args.files):
            d = tree / f"d{i % 100:02d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"f{i:05d}.bin").write_bytes(os.urandom(args.file_kib << 10))
        tree_size = tree_bytes(tree)
        db = f"sqlite+pysqlite:///{tmp / 'server.db'}"
        env = {"SUANLI_VOLUME_MAX_BYTES": str(1 << 40), "SUANLI_TRIAL_CREDIT": "1000"}
        s3 = None
        if moto is not None:
            from suanli.storage.s3 import S3Config

            host, port = moto.get_host_and_port()
            s3 = S3Config("bench", "", f"http://{host}:{port}", "bench-key", "bench-secret")
            s3.filesystem().mkdir("bench")
            env.update(SUANLI_VOLUME_S3_BUCKET="bench", SUANLI_VOLUME_S3_ENDPOINT=str(s3.endpoint),
                       SUANLI_VOLUME_S3_KEY_ID="bench-key", SUANLI_VOLUME_S3_SECRET="bench-secret")  # fmt: skip
        with live_server(tmp / "home", db, env=env) as srv:
            with httpx.Client(base_url=srv.url) as http:
                tenant = signup(http, "bench@example.com")
            c = Client(srv.url, tenant.token, timeout=600)
            vol = c.volume_create("bench", f"{2 * args.size_mib + 1024}Mi")
            data = srv.home / "volumes" / vol.org_id / "vols" / vol.id / "data"
            rows = []
            datasets = ((f"1 file, {args.size_mib} MiB", big, big.stat().st_size, False),
                        (f"{args.files} files of {args.file_kib} KiB", tree, tree_size, True))  # fmt: skip

            def plain(src: Path, dst: Path, recursive: bool) -> None:
                subprocess.run(
                    ["cp", "-r", str(src), str(dst)] if recursive else ["cp", str(src), str(dst)], check=True
                )

            for label, src, nbytes, recursive in datasets:
                name = src.name
                into, out = tmp / f"plain-{name}", tmp / f"out-{name}"

                t_in = rounds({
                    "cp": lambda s=src, d=into, r=recursive: plain(s, d, r),
                    "same-host": lambda s=src, n=name: c.volume_upload("bench", s, n, resume=False),
                    "http": lambda s=src, n=name: c.volume_upload("bench", s, n, resume=False, same_host=False),
                }, args.runs, before=lambda d=into, n=name: clear(d, data / n))  # fmt: skip
                t_out = rounds({
                    "cp": lambda n=name, o=out, r=recursive: plain(data / n, o, r),
                    "same-host": lambda n=name, o=out: c.volume_download("bench", n, o),
                    "http": lambda n=name, o=out: c.volume_download("bench", n, o, same_host=False),
                }, args.runs, before=lambda o=out: clear(o))  # fmt: skip
                mb = nbytes / 1e6
                for d, t in (("in", t_in), ("out", t_out)):
                    rows.append(("local", label, d, "cp", mb / t["cp"], mb / t["same-host"], mb / t["http"]))
            if s3 is not None:
                vol_s3 = c.volume_create("bench-s3", f"{2 * args.size_mib + 1024}Mi", backend="s3")
                data_s3 = srv.home / "volumes" / vol_s3.org_id / "vols" / vol_s3.id / "data"
                fs = s3.filesystem()
                s3_big = tmp / "s3big.bin"
                with open(big, "rb") as f, open(s3_big, "wb") as out:
                    out.write(f.read(args.s3_size_mib << 20))
                s3_data = ((f"1 file, {args.s3_size_mib} MiB", s3_big, s3_big.stat().st_size, False), datasets[1])
                for label, src, nbytes, recursive in s3_data:
                    name = src.name
                    mb = nbytes / 1e6
                    out = tmp / f"s3-out-{name}"
                    t_in = rounds({
                        "put": lambda s_=src, n=name, r=recursive: fs.put(str(s_), f"bench/plain/{n}", recursive=r),
                        "same-host": lambda s_=src, n=name: c.volume_upload("bench-s3", s_, n, resume=False),
                        "http": lambda s_=src, n=name: c.volume_upload("bench-s3", s_, n, resume=False,
                                                                       same_host=False),
                    }, args.runs, before=lambda n=name: clear(data_s3 / n))  # fmt: skip
                    t_out = rounds({
                        "get": lambda n=name, o=out, r=recursive: fs.get(f"bench/plain/{n}", str(o), recursive=r),
                        "same-host": lambda n=name, o=out: c.volume_download("bench-s3", n, o),
                        "http": lambda n=name, o=out: c.volume_download("bench-s3", n, o, same_host=False),
                    }, args.runs, before=lambda o=out: clear(o))  # fmt: skip
                    rows.append(("s3 (moto)", label, "in", "s3fs put", mb / t_in["put"], mb / t_in["same-host"],
                                 mb / t_in["http"]))  # fmt: skip
                    rows.append(("s3 (moto)", label, "out", "s3fs get", mb / t_out["get"], mb / t_out["same-host"],
                                 mb / t_out["http"]))  # fmt: skip
            print(f"\n### Copy throughput (MB/s, medians of {args.runs})\n")
            print("`cp` as the CLI runs it on the server's host (same-host: open files passed, copied in the kernel) "
                  "and over HTTP (`same_host=False`, as from another host: sha256 checked both ways).\n")  # fmt: skip
            print(
                "| backend | data | direction | baseline | baseline MB/s | same-host MB/s | ratio | HTTP MB/s | ratio |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            for backend, label, d, base, a, b, h in rows:
                print(f"| {backend} | {label} | {d} | {base} | {a:,.1f} | {b:,.1f} | {b / a:.2f}x | {h:,.1f} | "
                      f"{h / a:.2f}x |")  # fmt: skip

            t0 = time.perf_counter()
            first = c.volume_snapshot("bench", "first")
            t_first = time.perf_counter() - t0
            changed = data / "tree" / "d00" / "f00000.bin"
            changed.write_bytes(os.urandom(args.file_kib << 10))
            t0 = time.perf_counter()
            second = c.volume_snapshot("bench", "one file changed")
            t_second = time.perf_counter() - t0
            total = second.bytes
            print(f"\n### Snapshots of the volume ({total / 1e6:,.0f} MB in {second.files:,} files)\n")
            print("| snapshot | time | bytes added | share of the volume |")
            print("|---|---|---|---|")
            print(f"| first (every file into the blob store) | {t_first:.2f} s | {first.added_bytes:,} | "
                  f"{first.added_bytes / max(1, total):.1%} |")  # fmt: skip
            print(f"| second, one {args.file_kib} KiB file changed | {t_second:.3f} s | {second.added_bytes:,} | "
                  f"{second.added_bytes / max(1, total):.4%} |")  # fmt: skip
            c.close()
    if moto is not None:
        moto.stop()


if __name__ == "__main__":
    main()
