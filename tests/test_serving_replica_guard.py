"""A replica's runtime answers only its gateway (`serving/replica_guard.py`), with a real uvicorn server run as a
console script the way `vllm serve` and `transformers serve` run: every request but the probe needs the replica's
secret. Found by a hostile review: any job on the node (sandboxes share the host's network) read /proc/net/tcp, found
a replica's loopback port and was served completions with no key, no charge and no cap."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from suanli.serving import replica_guard
from suanli.serving.runtimes import Replica, runtime

APP = """
import sys, uvicorn

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b"served " + scope["path"].encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})

def main():
    uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")).run()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """`fakeserve PORT` installed as a console script (a distribution's entry point), run under the guard."""
    site = tmp_path / "site"
    (site / "fakeserve-0.1.dist-info").mkdir(parents=True)
    (site / "fakeserve_app.py").write_text(APP)
    (site / "fakeserve-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeserve\nVersion: 0.1\n")
    (site / "fakeserve-0.1.dist-info" / "entry_points.txt").write_text(
        "[console_scripts]\nfakeserve = fakeserve_app:main\n"
    )
    bin_dir = tmp_path / "bin"  # a console script and its interpreter beside it, as pip installs them in a venv
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # this venv's, with uvicorn
    (bin_dir / "python3").chmod(0o755)
    (bin_dir / "fakeserve").write_text(
        f"#!{sys.executable}\nimport sys\nfrom fakeserve_app import main\nsys.exit(main())\n"
    )
    (bin_dir / "fakeserve").chmod(0o755)
    port, key = _free_port(), "k" * 43
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(site),
           **replica_guard.env(key, "/health")}  # fmt: skip
    proc = subprocess.Popen(["/bin/sh", "-c", replica_guard.command(["fakeserve", str(port)])], env=env)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError("the guarded server never answered its probe")
        yield port, key
    finally:
        proc.terminate()
        proc.wait(10)


def test_only_the_probe_and_requests_with_the_secret_are_served(served: tuple[int, str]) -> None:
    port, key = served
    url = f"http://127.0.0.1:{port}"
    assert httpx.get(f"{url}/health").text == "served /health"
    for path in ("/v1/chat/completions", "/invocations", "/tokenize", "/metrics", "/health/", "/HEALTH"):
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": key}, {"x-api-key": key}):
            r = httpx.post(f"{url}{path}", headers=headers, json={})
            assert r.status_code == 401, (path, headers, r.text)
            assert "gateway only" in r.text
    r = httpx.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json={})
    assert (r.status_code, r.text) == (200, "served /v1/chat/completions")


def test_a_replica_with_a_secret_runs_its_runtime_under_the_guard_and_one_without_as_before() -> None:
    for name in ("vllm", "transformers"):
        rt = runtime(name)
        bare = Replica("org/model", "chat", 40000, 1)
        keyed = Replica("org/model", "chat", 40000, 1, key="s" * 43)
        assert rt.command(bare).startswith(f"exec {name} serve ")
        assert rt.command(keyed).startswith(f'exec "$(dirname "$(command -v {name})")/python3" -c ')
        assert rt.command(keyed).endswith(f" {name} serve org/model --host 127.0.0.1 --port 40000 " + (
            "--served-model-name chat --tensor-parallel-size 1" if name == "vllm" else
            "--device auto --log-level warning"))  # fmt: skip
        assert "s" * 43 not in rt.command(keyed)  # the secret travels in the environment, never in argv
        assert rt.env(keyed)[replica_guard.KEY_ENV] == "s" * 43
        assert rt.env(keyed)[replica_guard.OPEN_ENV] == rt.probe_path
        assert replica_guard.KEY_ENV not in rt.env(bare)


def test_a_runtime_that_is_no_console_script_starts_only_when_it_says_it_checks_the_secret(tmp_path: Path) -> None:
    """A shell wrapper cannot be guarded: it does not start (never unguarded), unless a file beside it says it
    checks REPLICA_KEY itself."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    (bin_dir / "wrapped").write_text('#!/bin/sh\necho served "$REPLICA_KEY"\n')
    (bin_dir / "wrapped").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **replica_guard.env("k" * 43, "/health")}

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/bin/sh", "-c", replica_guard.command(["wrapped"])], env=env, capture_output=True,
                              text=True, timeout=30)  # fmt: skip

    out = run()
    assert out.returncode != 0 and "served" not in out.stdout and "cannot be guarded" in out.stderr
    (bin_dir / "wrapped.checks-replica-key").write_text("")
    out = run()
    assert out.returncode == 0 and out.stdout.strip() == "served " + "k" * 43  # it gets the secret to check


def test_a_runtime_with_no_python_beside_it_does_not_start(tmp_path: Path) -> None:
    """The guard runs in the runtime's own interpreter or not at all: never the runtime unguarded."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fakeserve").write_text("#!/bin/sh\necho served\n")
    (bin_dir / "fakeserve").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **replica_guard.env("k" * 43, "/health")}
    out = subprocess.run(["/bin/sh", "-c", replica_guard.command(["fakeserve"])], env=env, capture_output=True,
                         text=True, timeout=30)  # fmt: skip
    assert out.returncode != 0 and "served" not in out.stdout
