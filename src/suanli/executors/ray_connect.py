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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

GCS_RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"

_connect_lock = threading.Lock()
_gcs_calls = ThreadPoolExecutor(max_workers=4, thread_name_prefix="suanli-ray-gcs")


def connect(address: str, namespace: str, auth_token: str | None, gcs_outage_s: float) -> Any:
    """The `ray` module, connected to the cluster at `address` as a driver (once per process)."""
    import ray

    with _connect_lock:
        if not ray.is_initialized():
            configure_process(auth_token, gcs_outage_s)
            ray.init(address=address, namespace=namespace, ignore_reinit_error=True, logging_level=logging.WARNING,
                     log_to_driver=False)  # fmt: skip
    return ray


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
