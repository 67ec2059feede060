"""What a replica's runtime answers: only requests that carry its secret (the gateway's), and its probe.

A sandbox shares the host's network (docs/isolation.md), so any job on the node could reach a runtime listening on
loopback and be served without a key, a charge or a cap. vLLM's own `--api-key` guards `/v1` routes only (its
`/invocations` serves completions too), and `transformers serve` has none. So the runtime's command runs under this
guard: `exec <the python beside vllm> -c SOURCE vllm serve ...`. It wraps the ASGI app the runtime hands to uvicorn
(both runtimes serve through `uvicorn.Config`) in a check of `Authorization: Bearer <REPLICA_KEY>` on every HTTP and
WebSocket request but `REPLICA_OPEN_PATH` (the probe), then runs the runtime's console script in-process.

It imports nothing of suanli: the replica's environment (an image, a published prefix) needs only the runtime. A
runtime that is no console script of that Python (a shell wrapper) does not start, unless a file
`<executable>.checks-replica-key` beside it says it checks the secret itself (the tests' fake runtime does). API
servers a runtime spawns in new processes (vLLM's `--api-server-count` above 1, which suanli never asks for) are out
of its reach; for vLLM the secret is also its own `VLLM_API_KEY`, which guards their `/v1` routes.
"""

from __future__ import annotations

import shlex

KEY_ENV = "REPLICA_KEY"
OPEN_ENV = "REPLICA_OPEN_PATH"

SOURCE = """
import hmac, os, sys
from importlib.metadata import entry_points
argv = sys.argv[1:]
found = [e for e in entry_points(group="console_scripts") if e.name == argv[0]]
if not found:
    import shutil
    exe = shutil.which(argv[0])
    if exe and os.path.exists(exe + ".checks-replica-key"):
        os.execvp(argv[0], argv)
    sys.exit(f"replica guard: {argv[0]} is no console script of {sys.executable}, so it cannot be guarded: not started")
secret = os.environ.pop("REPLICA_KEY", "")
open_path = os.environ.pop("REPLICA_OPEN_PATH", "/health")
if not secret:
    sys.exit("replica guard: no REPLICA_KEY")
key = ("Bearer " + secret).encode()
os.environ["VLLM_API_KEY"] = secret  # a second lock: vLLM checks it on /v1 in API servers it spawns, out of reach
import uvicorn
DENY = b'{"error": {"message": "this replica answers its gateway only", "type": "unauthorized"}}'
class Guard:
    def __init__(self, app):
        self.app = app
    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and scope.get("path") != open_path:
            sent = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(sent, key):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(DENY))]})
                await send({"type": "http.response.body", "body": DENY})
                return
        await self.app(scope, receive, send)
config_init = uvicorn.Config.__init__
def guarded_init(self, app, *args, **kwargs):
    if isinstance(app, str):
        sys.exit("replica guard: the runtime names its app by import path; it cannot be guarded")
    config_init(self, app if app is None else Guard(app), *args, **kwargs)
uvicorn.Config.__init__ = guarded_init
sys.argv = argv
sys.exit(found[0].load()())
""".strip()


def command(argv: list[str]) -> str:
    """The shell command that runs the runtime's argv under the guard, in the Python beside the runtime's executable
    (a console script's own interpreter: `python3` first on the PATH may be another one, without the runtime, and the
    guard would then find no console script to wrap). No such Python: the command fails, the replica never starts."""
    here = f'"$(dirname "$(command -v {shlex.quote(argv[0])})")/python3"'
    return f"exec {here} -c {shlex.quote(SOURCE)} {shlex.join(argv)}"


def env(key: str, open_path: str) -> dict[str, str]:
    return {KEY_ENV: key, OPEN_ENV: open_path}
