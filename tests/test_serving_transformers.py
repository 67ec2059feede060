"""A real runtime end to end: a tiny random-weight Llama built by the test, added to the hub, deployed with
`suanli`'s transformers adapter (the real `transformers serve`, in a bubblewrap sandbox on CPU, the model read
offline through the hub's read-only mount), and the official `openai` client from deploy to the first token:
completions, a stream chunk by chunk, chat, the model list, and the tokens metered."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.control_plane import admin_token, bearer, live_server, signup
from tests.hub_fixtures import make_model, need
from tests.serving_helpers import FAST, add_hub_model, stop_all, wait_ready

openai = pytest.importorskip("openai", reason="openai is not installed (it is in the dev extras)")
pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
    reason="bubblewrap is not installed (apt install bubblewrap); CI installs and requires it",
)
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def _gpu_memory_mib() -> int | None:
    """Memory in use on GPU 0 (nvidia-smi), or None on a host without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    r = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)  # fmt: skip
    return int(r.stdout.split()[0]) if r.returncode == 0 and r.stdout.strip() else None


ON_GPU = pytest.mark.skipif(_gpu_memory_mib() is None, reason="no NVIDIA GPU on this host (CI has none)")


@pytest.mark.parametrize("gpus", [0, pytest.param(1, marks=ON_GPU, id="on-a-gpu")])
def test_transformers_serve_replica_from_deploy_to_first_token(tmp_path: Path, gpus: int) -> None:
    need("torch", "transformers", "accelerate", "fastapi", "uvicorn")
    model = make_model(tmp_path / "model")
    (model / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    db_url = f"sqlite+pysqlite:///{tmp_path / 'suanli.db'}"
    with live_server(tmp_path / "home", db_url, env=FAST) as srv:
        http = httpx.Client(base_url=srv.url, timeout=30)
        adm = bearer(admin_token(http))
        assert http.post("/api/v1/admin/clusters", json={"local": True, "name": "this-host"}, headers=adm).status_code == 201  # fmt: skip
        add_hub_model(db_url, srv.home, "tiny-llama", "acme/tiny-llama", model)
        tenant = signup(http, "tenant@example.com")
        http.post(f"/api/v1/admin/orgs/{tenant.org_id}/transactions", json={"kind": "topup", "amount": "100"},
                  headers=adm).raise_for_status()  # fmt: skip
        try:
            idle = _gpu_memory_mib()
            t0 = time.monotonic()
            r = http.post("/api/v1/endpoints", headers=tenant.headers, json={"spec": {
                "name": "tiny", "kind": "service", "model": "tiny-llama", "runtime": "transformers",
                "resources": {"gpus": gpus} if gpus else {"gpus": 0, "cpus": 1, "memory": "4Gi"}}})  # fmt: skip
            assert r.status_code == 201, r.text
            key = http.post(
                "/api/v1/endpoints/tiny/keys", json={"password": "tenant-password"}, headers=tenant.headers
            ).json()["key"]
            c = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=key, max_retries=0, timeout=300)
            # the first request waits (a bounded cold start) until the runtime answers its probe
            first = c.completions.create(model="tiny", prompt="hello world", max_tokens=4)
            to_first = time.monotonic() - t0
            if gpus:  # the replica's CUDA context and weights are on the GPU it was given
                used = _gpu_memory_mib()
                assert idle is not None and used is not None and used > idle + 200, (idle, used)
            assert first.model and len(first.choices[0].text.split()) == 4
            assert first.usage is not None and first.usage.completion_tokens == 4
            ep = wait_ready(http, tenant, "tiny", 1)
            assert ep["replicas"][0]["ready"] and ep["runtime"] == "transformers"
            # the runtime itself answers only its gateway (`serving/replica_guard.py`): its probe, and nothing else
            # without the replica's secret, whichever route
            direct = f"http://127.0.0.1:{ep['replicas'][0]['port']}"
            assert httpx.get(f"{direct}/health", timeout=10).status_code == 200
            for route in ("/v1/models", "/v1/completions", "/v1/chat/completions"):
                r = httpx.post(f"{direct}{route}", json={"model": "acme/tiny-llama", "prompt": "x"}, timeout=10)
                assert r.status_code == 401, (route, r.status_code, r.text[:200])
            # a stream of SSE events: its text is the three words asked for (the tiny model never picks a special
            # token, whose text would be empty: see make_model) and it says why it ended. How many events carry them
            # is the runtime's choice: transformers serve sends tokens that are ready together as one event ('the the
            # the' in one, in a trial); that the gateway relays each event as it comes is test_gateway_e2e's check
            stream = c.completions.create(model="tiny", prompt="hello", max_tokens=3, stream=True, temperature=0)
            chunks = [ch for ch in stream if ch.choices]
            texts = [ch.choices[0].text for ch in chunks]
            assert len("".join(texts).split()) == 3 and chunks[-1].choices[0].finish_reason == "length", texts
            chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                             max_tokens=2)  # fmt: skip
            assert chat.choices[0].message.content is not None
            assert [m.id for m in c.models.list()] == ["tiny"]
            with pytest.raises(openai.NotFoundError):  # transformers serve has no embeddings route
                c.embeddings.create(model="tiny", input="x")
            deadline = time.monotonic() + 10
            while sum(u["completion_tokens"] for u in http.get("/api/v1/endpoints/tiny/usage",
                                                               headers=tenant.headers).json()) < 9:  # fmt: skip
                assert time.monotonic() < deadline
                time.sleep(0.5)
            print(f"deploy to first token: {to_first:.1f} s")
        finally:
            stop_all(http, [tenant])
