"""The SSH gateway's cost: connect + `echo` round trips, and scp throughput, against OpenSSH's own sshd.

Usage: python benchmarks/ssh_latency.py [--runs 30] [--size-mib 1024] [--no-private-sshd]

A real `suanli server` (SQLite) with its gateway runs an instance in its bubblewrap sandbox on the local executor.
Through the gateway: `ssh -p PORT my-box@127.0.0.1 -- echo hi` `--runs` times (a new connection each: key
exchange, public-key auth with a database lookup, entering the sandbox, the exit status), then an scp of a
`--size-mib` file into the instance's disk and back out, next to a plain `cp` of the same file. For comparison the
same is done against an sshd on this host: the one on port 22 if it runs and lets this user in with the
benchmark's key or the user's own, else (unless `--no-private-sshd`) a private `/usr/sbin/sshd` on a free port
that trusts the benchmark's key; without either the column says why it is empty. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.control_plane import admin_token, bearer, free_port, live_server, signup  # noqa: E402
from tests.ssh_helpers import wait_listening  # noqa: E402

OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
        "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes"]  # fmt: skip


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def round_trips(argv: list[str], runs: int) -> list[float] | str:
    """Seconds per `argv` (which must print "hi"), or why it failed."""
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if p.stdout.strip() != "hi":
            return f"failed: {(p.stderr.strip() or p.stdout.strip())[:120]}"
        out.append(time.perf_counter() - t)
    return out


def timed(argv: list[str]) -> float | str:
    t = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    return time.perf_counter() - t if p.returncode == 0 else f"failed: {p.stderr.strip()[:120]}"


@contextmanager
def private_sshd(tmp: Path, pubkey: Path) -> Iterator[int | str]:
    """OpenSSH's sshd on a free port trusting `pubkey`, or why there is none."""
    sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
    if sshd is None:
        yield "no sshd installed (openssh-server)"
        return
    port = free_port()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "sshd_host")], check=True)
    auth = tmp / "authorized_keys"
    shutil.copy(pubkey, auth)
    auth.chmod(0o600)
    cfg = tmp / "sshd_config"
    cfg.write_text(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp / 'sshd_host'}\nAuthorizedKeysFile {auth}\n"
                   "StrictModes no\nUsePAM no\nPasswordAuthentication no\nPermitRootLogin prohibit-password\n"
                   f"PidFile {tmp / 'sshd.pid'}\nSubsystem sftp internal-sftp\nPrintMotd no\nPrintLastLog no\n")  # fmt: skip
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(cfg)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield port if proc.poll() is None else f"sshd did not start: {proc.stderr.read().decode()[-200:] if proc.stderr else ''}"  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(10)


def host_sshd(key: Path) -> tuple[list[str], str]:
    """ssh options that reach a running sshd on port 22 as this user, or why not."""
    try:
        socket.create_connection(("127.0.0.1", 22), timeout=1).close()
    except OSError:
        return [], "no sshd listens on port 22"
    for extra in (["-i", str(key)], []):
        argv = ["ssh", *OPTS[:-2], *extra, "-p", "22", "127.0.0.1", "echo", "hi"]
        if subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip() == "hi":
            return [*OPTS[:-2], *extra, "-p", "22"], ""
    return [], "an sshd listens on port 22 but does not let this user in non-interactively"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--no-private-sshd", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="suanli-ssh-bench-"))
    try:
        run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, tmp: Path) -> None:
    key = tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    ssh_port = free_port()
    env = {"SUANLI_SSH_PORT": str(ssh_port), "SUANLI_SCHEDULE_INTERVAL_S": "0.2"}
    with live_server(tmp / "home", f"sqlite+pysqlite:///{tmp / 'suanli.db'}", env=env) as srv:
        http = httpx.Client(base_url=srv.url, timeout=30)
        adm = bearer(admin_token(http))
        http.post("/api/v1/admin/clusters", json={"local": True, "name": "this-host"}, headers=adm).raise_for_status()
        t = signup(http, "bench@example.com")
        http.post(f"/api/v1/admin/orgs/{t.org_id}/transactions", json={"kind": "topup", "amount": "100"},
                  headers=adm).raise_for_status()  # fmt: skip
        http.post("/api/v1/keys", json={"public_key": Path(f"{key}.pub").read_text(), "password": "tenant-password"}, headers=t.headers).raise_for_status()  # fmt: skip
        spec = {"name": "my-box", "kind": "instance", "command": "sleep infinity", "resources": {"gpus": 0}}
        box = http.post("/api/v1/workloads", json={"spec": spec}, headers=t.headers).json()["id"]
        deadline = time.monotonic() + 60
        while http.get(f"/api/v1/workloads/{box}", headers=t.headers).json()["state"] != "running":
            if time.monotonic() > deadline:
                raise SystemExit("the instance did not start")
            time.sleep(0.2)
        wait_listening(ssh_port)
        gw = [*OPTS, "-i", str(key), "-p", str(ssh_port)]
        rows: dict[str, dict[str, str]] = {}
        gw_rt = round_trips(["ssh", *gw, "my-box@127.0.0.1", "--", "echo", "hi"], args.runs)

        host_opts, host_note = host_sshd(key)
        label = "host sshd (port 22)"
        with private_sshd(tmp, Path(f"{key}.pub")) if not host_opts and not args.no_private_sshd else _none() as p:
            if not host_opts and isinstance(p, int):
                host_opts, label = [*OPTS, "-i", str(key), "-p", str(p)], f"private sshd ({host_note})"
            elif not host_opts and isinstance(p, str):
                host_note = f"{host_note}; {p}"
            host_rt = (round_trips(["ssh", *host_opts, "127.0.0.1", "echo", "hi"], args.runs) if host_opts
                       else host_note)  # fmt: skip
            rows["connect + echo p50"] = {"gw": _ms(gw_rt, 0.5), "host": _ms(host_rt, 0.5)}
            rows["connect + echo p99"] = {"gw": _ms(gw_rt, 0.99), "host": _ms(host_rt, 0.99)}

            big = tmp / "big.bin"
            with open(big, "wb") as f:
                for _ in range(args.size_mib):
                    f.write(os.urandom(1 << 20))
            mib = args.size_mib
            disk = srv.home / "workloads" / box / "disk"
            scp_gw = [o if o != "-p" else "-P" for o in gw]
            up = timed(["scp", "-q", *scp_gw, str(big), "my-box@127.0.0.1:big.bin"])
            if not isinstance(up, str) and (disk / "big.bin").stat().st_size != big.stat().st_size:
                up = "failed: the copy on the instance's disk differs in size"
            down = timed(["scp", "-q", *scp_gw, "my-box@127.0.0.1:big.bin", str(tmp / "back.bin")])
            (tmp / "back.bin").unlink(missing_ok=True)
            (disk / "big.bin").unlink(missing_ok=True)
            host_up = host_down = host_note
            if host_opts:
                scp_host = [o if o != "-p" else "-P" for o in host_opts]
                host_up = timed(["scp", "-q", *scp_host, str(big), f"127.0.0.1:{tmp / 'via-sshd.bin'}"])
                host_down = timed(["scp", "-q", *scp_host, f"127.0.0.1:{tmp / 'via-sshd.bin'}", str(tmp / "back.bin")])
                (tmp / "via-sshd.bin").unlink(missing_ok=True)
                (tmp / "back.bin").unlink(missing_ok=True)
            cp = timed(["cp", str(big), str(tmp / "copy.bin")])
            (tmp / "copy.bin").unlink(missing_ok=True)
            rows[f"scp {mib} MiB in"] = {"gw": _rate(up, mib), "host": _rate(host_up, mib), "cp": _rate(cp, mib)}
            rows[f"scp {mib} MiB out"] = {"gw": _rate(down, mib), "host": _rate(host_down, mib), "cp": _rate(cp, mib)}
        http.close()
    print(f"\n{args.runs} connections each; {os.cpu_count()} cores; the server, the clients and sshd share them\n")
    print(f"| measure | suanli gateway (sandbox) | {label if host_opts else 'host sshd'} | plain cp |")
    print("|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['gw']} | {r['host']} | {r.get('cp', '-')} |")


@contextmanager
def _none() -> Iterator[None]:
    yield None


def _ms(xs: list[float] | str, q: float) -> str:
    return xs if isinstance(xs, str) else f"{pct(xs, q) * 1000:.0f} ms"


def _rate(seconds: float | str, mib: int) -> str:
    return seconds if isinstance(seconds, str) else f"{mib / seconds:,.0f} MiB/s ({seconds:.1f} s)"


if __name__ == "__main__":
    main()
