"""How this process talks to Ray: one driver connection per process, its settings, and calls bounded in time.

Ray reads its settings (token authentication; how long a GCS outage may last before Ray ends the driver's
process, 60 s by default, which would take the server with it) from the environment when imported;
`configure_process` sets them before connecting and `refresh_auth` makes an imported `ray` read them again. Calls
that go to Ray's GCS block for as long as it is away: `bounded` runs them on threads of their own and gives up
waiting after a timeout, so a poll never hangs on Ray. `import ray` happens on first use only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

GCS_RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"

_connect_lock = threading.Lock()
_gcs_calls = ThreadPoolExecutor(max_workers=4, thread_name_prefix="suanli-ray-gcs")


def connect(address: str, namespace: str, auth_token: str | None, gcs_outage_s: float) -> Any:
    """The `ray` module, connected to the cluster at `address` as a driver (once per process), once the cluster is
    known to refuse drivers without its token (`require_token`)."""
    import ray

    with _connect_lock:
        refused, at = _checked.get(address, ("", -1e9))
        if refused and time.monotonic() - at < RECHECK_S:
            raise OpenCluster(refused)
        if refused or address not in _checked:
            try:
                require_token(address)
                _checked[address] = ("", time.monotonic())
            except OpenCluster as e:
                _checked[address] = (str(e), time.monotonic())
                raise
        if not ray.is_initialized():
            configure_process(auth_token, gcs_outage_s)
            ray.init(address=address, namespace=namespace, ignore_reinit_error=True, logging_level=logging.WARNING,
                     log_to_driver=False)  # fmt: skip
    return ray


_checked: dict[str, tuple[str, float]] = {}  # address -> (why it was refused, or "": it requires a token; when)
AUTH_CHECK_S = 60.0
RECHECK_S = 300.0  # a refused cluster is asked again this long after (its operator may have turned tokens on)
_PROBE = "import ray, sys; ray.init(address=sys.argv[1], logging_level=40); print('CONNECTED', flush=True)"


class OpenCluster(RuntimeError):
    """The Ray cluster lets in a driver that has no token: tenant work is not sent there."""


def require_token(address: str, timeout_s: float = AUTH_CHECK_S) -> None:
    """Refuse a cluster that lets a driver in without its token. Tenant ranks share their node's network (NCCL
    needs it), and Ray's GCS, client server and job API there run whatever a driver sends as the Ray user, outside
    every sandbox: on a cluster without token authentication any tenant's job could. A driver with no token and no
    token file (a fresh HOME) tries to connect; the cluster must answer it `Unauthenticated`. One that lets it in,
    or does not say within `timeout_s`, raises `OpenCluster` (fail closed)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="suanli-ray-auth-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update({"HOME": home, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"})
        proc = subprocess.Popen([sys.executable, "-c", _PROBE, address], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=home)  # fmt: skip
        verdict = ""
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode(errors="replace")
                if "Unauthenticated" in line or "InvalidAuthToken" in line:
                    verdict = "token required"
                    break
                if line.startswith("CONNECTED"):
                    verdict = "open"
                    break
        finally:
            timer.cancel()
            proc.kill()
            proc.wait()
            proc.stdout.close()
    if verdict != "token required":
        why = "lets a driver in without a token" if verdict == "open" else "did not refuse a driver without a token"
        raise OpenCluster(
            f"the Ray cluster at {address} {why}: tenant work there could run as the Ray user outside its sandbox; "
            "start its nodes with RAY_AUTH_MODE=token (docs/executors.md)"
        )


def configure_process(token: str | None, gcs_outage_s: float) -> None:
    """This process's Ray settings, before it connects: token authentication, and how long a GCS outage may last
    before Ray ends the process (unless set already)."""
    if token:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = token
    os.environ.setdefault(GCS_RECONNECT_ENV, str(int(gcs_outage_s)))
    refresh_auth()


def refresh_auth() -> None:
    """Make an imported `ray` see its RAY_* settings (RAY_AUTH_MODE, RAY_AUTH_TOKEN[_PATH]…) as os.environ has them."""
    if "ray" in sys.modules:
        with contextlib.suppress(Exception):
            from ray._raylet import AuthenticationTokenLoader, Config

            Config.initialize("")
            AuthenticationTokenLoader.instance().reset_cache()


def bounded(fn: Callable[[], Any], timeout: float) -> Any:
    """`fn()` (a call that may wait on the GCS), or TimeoutError once `timeout` seconds have passed; the call goes
    on in its thread."""
    try:
        return _gcs_calls.submit(fn).result(timeout=timeout)
    except FutureTimeout:
        raise TimeoutError(f"Ray's GCS did not answer within {timeout:g}s") from None


def first_line(e: BaseException) -> str:
    """An exception as one line of at most 300 characters (Ray's carry whole remote tracebacks)."""
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]
