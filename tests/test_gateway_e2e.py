"""The gateway end to end: a `suanli server` process, endpoints whose replicas are workloads running a runtime's real
command line in bubblewrap sandboxes (here the fake runtime, installed as `vllm` and `transformers` in a published
environment, speaking the OpenAI API), the hub model mounted read-only, and the official `openai` client: chat,
streaming, completions, embeddings and errors; a replica killed under load; scale to zero and a cold start."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.control_plane import LiveServer, Tenant, admin_token, bearer, live_server
from tests.serving_helpers import (
    FAST,
    add_hub_model,
    describe,
    fake_environment,
    funded_tenants,
    minimal_model,
    runtime_pid,
    stop_all,
    wait_ready,
)

openai = pytest.importorskip("openai", reason="openai is not installed (it is in the dev extras)")
pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("SUANLI_REQUIRE_BWRAP"),
    reason="bubblewrap is not installed (apt install bubblewrap); CI installs and requires it",
)
CPU = {"gpus": 0, "cpus": 0.25, "memory": "256Mi"}


@dataclass
class World:
    srv: LiveServer
    http: httpx.Client
    tenant: Tenant
    mallory: Tenant
    key: str


def _deploy(http: httpx.Client, who: Tenant, spec: dict) -> dict:
    r = http.post("/api/v1/endpoints", json={"spec": spec}, headers=who.headers)
    assert r.status_code == 201, r.text
    return r.json()


def _key(http: httpx.Client, who: Tenant, ref: str) -> tuple[str, str]:
    r = http.post(
        f"/api/v1/endpoints/{ref}/keys", json={"password": "tenant-password", "name": "test"}, headers=who.headers
    )
    assert r.status_code == 201, r.text
    return r.json()["key"], r.json()["id"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("gateway-e2e")
    env_dir = fake_environment(tmp / "fakert")
    db_url = f"sqlite+pysqlite:///{tmp / 'suanli.db'}"
    with live_server(tmp / "home", db_url, env={**FAST, "SUANLI_ENVIRONMENTS": f"fakert={env_dir}"}) as srv:
        http = httpx.Client(base_url=srv.url, timeout=30)
        adm = bearer(admin_token(http))
        assert http.post("/api/v1/admin/clusters", json={"local": True, "name": "this-host"}, headers=adm).status_code == 201  # fmt: skip
        add_hub_model(db_url, srv.home, "tiny", "acme/tiny", minimal_model(tmp / "model"))
        tenant, mallory = funded_tenants(http, adm, "tenant@example.com", "mallory@example.com")
        _deploy(http, tenant, {"name": "chat", "kind": "service", "model": "tiny", "runtime": "vllm", "image": "fakert",
                               "resources": CPU, "replicas": 2, "env": {"FAKE_TOKEN_DELAY_S": "0.02"}})  # fmt: skip
        key, _ = _key(http, tenant, "chat")
        try:
            wait_ready(http, tenant, "chat", 2)
            yield World(srv, http, tenant, mallory, key)
        finally:
            stop_all(http, [tenant, mallory])


def _client(world: World, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{world.srv.url}/v1", api_key=key or world.key, max_retries=0, timeout=60)


def test_openai_client_chat_stream_completions_embeddings(world: World) -> None:
    c = _client(world)
    assert [m.id for m in c.models.list()] == ["chat"]
    r = c.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.model == "chat" and r.choices[0].message.content.startswith("w0 w1 w2")
    assert r.usage is not None and r.usage.completion_tokens == 3
    chunks = list(c.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                            stream=True))  # fmt: skip
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert "] w0 w1 w2 w3 w4 " in text
    assert len([ch for ch in chunks if ch.choices]) == 6  # chunk by chunk, as the runtime sent them
    done = c.completions.create(model="chat", prompt="once", max_tokens=2)
    assert done.choices[0].text.startswith("w0 w1")
    emb = c.embeddings.create(model="chat", input=["a", "bb"])
    assert [len(d.embedding) for d in emb.data] == [3, 3]


def test_stream_arrives_chunk_by_chunk_not_buffered(world: World) -> None:
    """With 0.02 s between tokens, 40 tokens take ~0.8 s: the first must arrive long before the last."""
    with httpx.stream("POST", f"{world.srv.url}/v1/completions", headers=bearer(world.key), timeout=60,
                      json={"model": "chat", "prompt": "x", "max_tokens": 40, "stream": True}) as r:  # fmt: skip
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        t0, times = time.monotonic(), []
        for line in r.iter_lines():
            if line.startswith("data: "):
                times.append(time.monotonic() - t0)
    assert len(times) >= 41 and times[0] < 0.5 * times[-1], times[:3] + times[-3:]


def _long_stream(world: World) -> tuple[httpx.Client, httpx.Response, int, list[str], Iterator[str]]:
    """A 200-token stream (4 s at 0.02 s a token); its first event names the replica's port."""
    client = httpx.Client(timeout=60)
    req = client.build_request("POST", f"{world.srv.url}/v1/completions", headers=bearer(world.key),
                               json={"model": "chat", "prompt": "x", "max_tokens": 200, "stream": True})  # fmt: skip
    r = client.send(req, stream=True)
    lines = r.iter_lines()
    first = next(line for line in lines if line.startswith("data: "))
    port = int(json.loads(first[6:])["choices"][0]["text"].strip(" []"))
    return client, r, port, [first], lines


def test_a_replica_dying_mid_stream_ends_it_with_an_error_event(world: World) -> None:
    wait_ready(world.http, world.tenant, "chat", 2)
    client, r, port, seen, lines = _long_stream(world)
    pid = runtime_pid(port)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    seen += [line for line in lines if line.startswith("data: ")]
    r.close()
    client.close()
    last = json.loads(seen[-1][6:])
    assert last["error"]["code"] == "upstream_disconnected" and len(seen) < 150, seen[-3:]
    deadline = time.monotonic() + 30  # the endpoint says why the replica is not ready...
    while True:
        events = describe(world.http, world.tenant, "chat")["events"]
        if any("not ready: " in e["reason"] for e in events):
            break
        assert time.monotonic() < deadline, events[-5:]
        time.sleep(0.2)
    wait_ready(world.http, world.tenant, "chat", 2)  # ...and it is retried (a failure) and ready again


def test_a_client_that_goes_away_cancels_the_upstream_request(world: World) -> None:
    ep = wait_ready(world.http, world.tenant, "chat", 2)
    client, r, port, _, _ = _long_stream(world)
    r.close()
    client.close()
    wid = next(x["workload_id"] for x in ep["replicas"] if x["port"] == port)
    deadline = time.monotonic() + 10
    while "client went away" not in (log := world.http.get(f"/api/v1/workloads/{wid}/logs",
                                                           headers=world.tenant.headers).json()["data"]):  # fmt: skip
        assert time.monotonic() < deadline, log[-500:]
        time.sleep(0.2)
    n = int(log.split("client went away after ")[-1].split()[0])
    assert n < 100  # of 200: the runtime stopped generating within about 2 s of the client leaving


def test_errors_are_4xx_in_openai_shape(world: World) -> None:
    c = _client(world)
    with pytest.raises(openai.AuthenticationError):
        _client(world, "sk-sl-not-a-key").chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}])  # fmt: skip
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    assert "model" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="chat", messages="not a list")  # type: ignore[arg-type]
    assert "messages" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="chat", prompt="x", max_tokens=10**9)
    assert "max_tokens" in str(e.value)
    h = bearer(world.key)
    for body, status, word in [(b"{not json", 400, "body"), (b"[1]", 400, "body"), (b'{"model": 3}', 400, "model"),
                               (b"[" * 100_000, 400, "body"), (b'{"model":"chat","stream":"yes","prompt":"x"}', 400, "stream")]:  # fmt: skip
        r = world.http.post("/v1/completions", content=body, headers={**h, "content-type": "application/json"})
        assert r.status_code == status and word in r.json()["error"]["message"], (body[:30], r.text)
    r = world.http.post("/v1/completions", content=b"x" * (5 << 20), headers=h)
    assert r.status_code == 413
    r = world.http.post("/v1/completions", json={"model": "chat", "prompt": "x"}, headers=world.tenant.headers)
    assert r.status_code == 401  # an account token is no endpoint key


def test_keys_are_per_endpoint_revocable_and_not_cross_tenant(world: World) -> None:
    http = world.http
    ep = describe(http, world.tenant, "chat")
    r = http.post(
        f"/api/v1/endpoints/{ep['id']}/keys",
        json={"password": "tenant-password", "name": "x"},
        headers=world.mallory.headers,
    )
    assert r.status_code == 404  # another org's endpoint does not exist
    assert http.get(f"/api/v1/endpoints/{ep['id']}", headers=world.mallory.headers).status_code == 404
    key, key_id = _key(http, world.tenant, "chat")
    assert _client(world, key).completions.create(model="chat", prompt="x", max_tokens=1).choices
    assert http.delete(f"/api/v1/endpoint-keys/{key_id}", headers=world.mallory.headers).status_code == 404
    assert http.delete(f"/api/v1/endpoint-keys/{key_id}", headers=world.tenant.headers).status_code == 200
    time.sleep(5.5)  # the gateway's key cache
    with pytest.raises(openai.AuthenticationError):
        _client(world, key).completions.create(model="chat", prompt="x", max_tokens=1)


def test_a_replica_killed_under_load_requests_move_and_it_restarts(world: World) -> None:
    http, c = world.http, _client(world)
    ep = wait_ready(http, world.tenant, "chat", 2)
    victim = ep["replicas"][0]
    pid = runtime_pid(victim["port"])
    assert pid is not None
    ok, broken, failed = [], [], []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                parts = [ch.choices[0].text for ch in c.completions.create(model="chat", prompt="x", max_tokens=10,
                                                                             stream=True) if ch.choices]  # fmt: skip
                ok.append("".join(parts))
            except openai.APIError as e:  # the stream of the killed replica ends with an error event
                broken.append(str(e))
            except Exception as e:
                failed.append(repr(e))

    threads = [threading.Thread(target=load) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    before = len(ok)
    os.kill(pid, signal.SIGKILL)
    time.sleep(3)
    after_kill = len(ok)
    stop.set()
    for t in threads:
        t.join(60)
    assert not failed, failed[:3]
    assert before > 0 and after_kill > before  # requests kept being served by the other replica
    assert len(broken) <= 6  # at most the streams in flight on the killed replica broke off
    # The killed replica's workload is retried (a failure) and its runtime answers again.
    deadline = time.monotonic() + 90
    while True:
        cur = {r["workload_id"]: r for r in describe(http, world.tenant, "chat")["replicas"]}
        if (
            cur.get(victim["workload_id"], {}).get("ready")
            and cur[victim["workload_id"]]["attempt"] > victim["attempt"]
        ):
            break
        assert time.monotonic() < deadline, cur
        time.sleep(0.3)
    time.sleep(1.5)  # the gateway's view of ready replicas is a second old at most
    served = {
        c.completions.create(model="chat", prompt="x", max_tokens=1).choices[0].text.split("[")[-1] for _ in range(8)
    }
    assert len(served) == 2  # both replicas serve again (least outstanding spreads sequential requests)


def test_scale_to_zero_after_idle_and_cold_start(world: World) -> None:
    http = world.http
    _deploy(http, world.tenant, {"name": "lazy", "kind": "service", "model": "tiny", "runtime": "transformers",
                                 "image": "fakert", "resources": CPU,
                                 "autoscale": {"min_replicas": 0, "max_replicas": 1, "idle_s": 5, "cold_start_s": 60}})  # fmt: skip
    key, _ = _key(http, world.tenant, "lazy")
    time.sleep(1)
    assert describe(http, world.tenant, "lazy")["desired"] == 0
    t0 = time.monotonic()
    r = _client(world, key).completions.create(model="lazy", prompt="x", max_tokens=2)
    cold = time.monotonic() - t0
    assert r.choices[0].text.startswith("w0 w1") and cold < 60
    ep = describe(http, world.tenant, "lazy")
    assert any("cold start" in e["reason"] for e in ep["events"]), ep["events"]
    deadline = time.monotonic() + 60
    while (ep := describe(http, world.tenant, "lazy"))["desired"] != 0 or ep["replicas"]:
        assert time.monotonic() < deadline, ep
        time.sleep(0.5)
    assert any(e["kind"] == "scale" and "idle" in e["reason"] for e in ep["events"]), ep["events"]
    r = _client(world, key).completions.create(model="lazy", prompt="x", max_tokens=1)  # a second cold start
    assert r.choices[0].text.startswith("w0")


def test_scale_and_remove(world: World) -> None:
    http = world.http
    r = http.post("/api/v1/endpoints/chat/scale", json={"replicas": 1}, headers=world.tenant.headers)
    assert r.status_code == 200 and r.json()["desired"] == 1
    assert http.post("/api/v1/endpoints/chat/scale", json={"replicas": 99}, headers=world.tenant.headers).status_code == 422  # fmt: skip
    assert http.post("/api/v1/endpoints/chat/scale", json={"replicas": 1}, headers=world.mallory.headers).status_code == 404  # fmt: skip
    deadline = time.monotonic() + 30
    while len(describe(http, world.tenant, "chat")["replicas"]) != 1:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert _client(world).completions.create(model="chat", prompt="x", max_tokens=1).choices
    assert http.delete("/api/v1/endpoints/lazy", headers=world.tenant.headers).status_code == 200
    assert http.get("/api/v1/endpoints/lazy", headers=world.tenant.headers).status_code == 404


def _cli(world: World, *args: str, code: int = 0, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SUANLI_SERVER": world.srv.url, "SUANLI_TOKEN": world.tenant.token, "COLUMNS": "200",
           "SUANLI_HOME": str(world.srv.home / "cli")}  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "suanli.cli.main", *args], env=env, capture_output=True, text=True,
                       timeout=120, input=stdin)  # fmt: skip
    assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
    return r


def test_cli_deploy_run_keys_usage_scale_rm(world: World, tmp_path: Path) -> None:
    r = _cli(world, "deploy", "cold", "--model", "tiny", "--gpus", "0", "--replicas", "0", "--json")
    assert json.loads(r.stdout)["desired"] == 0 and json.loads(r.stdout)["runtime"] == "transformers"
    r = _cli(world, "deploy", "bad", "--model", "nope", "--gpus", "0", code=2)
    assert "model" in r.stdout + r.stderr
    spec = tmp_path / "svc.yaml"
    spec.write_text("name: viacli\nkind: service\nmodel: tiny\nruntime: vllm\nimage: fakert\nreplicas: 1\n"
                    "resources: {gpus: 0, cpus: 0.25, memory: 256Mi}\n")  # fmt: skip
    assert "deployed" in _cli(world, "run", str(spec)).stdout
    without = _cli(world, "keys", "create", "--endpoint", "viacli", code=2, stdin="")  # a key outlives the login
    assert "password" in without.stderr and "--password-stdin" in without.stderr, without.stderr
    key = _cli(world, "keys", "create", "--endpoint", "viacli", "--json", "--password-stdin", stdin="tenant-password\n")
    secret, key_id = json.loads(key.stdout)["key"], json.loads(key.stdout)["id"]
    wait_ready(world.http, world.tenant, "viacli", 1)
    c = _client(world, secret)
    c.completions.create(model="viacli", prompt="x", max_tokens=4)
    list(
        c.chat.completions.create(
            model="viacli", messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True
        )
    )
    ls = _cli(world, "endpoints", "ls").stdout
    assert "viacli" in ls and "cold" in ls
    assert "ready" in _cli(world, "endpoints", "describe", "viacli").stdout
    deadline = time.monotonic() + 10  # the gateway reports usage every second
    while True:
        rows = json.loads(_cli(world, "endpoints", "usage", "viacli", "--json").stdout)
        if sum(u["requests"] for u in rows) == 2:
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)
    assert sum(u["prompt_tokens"] for u in rows) == 6 and sum(u["completion_tokens"] for u in rows) == 6
    assert {u["key_id"] for u in rows} == {key_id}  # the stream's usage too (the gateway asked for include_usage)
    assert key_id in _cli(world, "endpoints", "keys", "viacli").stdout
    assert "revoked" in _cli(world, "keys", "revoke", key_id).stdout
    assert "0 replica(s)" in _cli(world, "endpoints", "scale", "viacli", "--replicas", "0").stdout
    for name in ("viacli", "cold"):
        assert "removed" in _cli(world, "endpoints", "rm", name).stdout


def test_a_volume_checkpoint_is_served_read_only(world: World) -> None:
    http, who = world.http, world.tenant
    assert http.post("/api/v1/volumes", json={"name": "ckpt", "size": "8Mi"}, headers=who.headers).status_code == 201
    r = http.put("/api/v1/volumes/ckpt/files", params={"path": "checkpoint-1200/config.json"},
                 content=b'{"model_type": "llama"}', headers=who.headers)  # fmt: skip
    assert r.status_code in (200, 201), r.text
    _deploy(http, who, {"name": "tuned", "kind": "service", "model": "vol:ckpt/checkpoint-1200", "runtime": "vllm",
                        "image": "fakert", "resources": CPU, "replicas": 1})  # fmt: skip
    key, _ = _key(http, who, "tuned")
    (replica,) = wait_ready(http, who, "tuned", 1)["replicas"]
    port = replica["port"]
    # The runtime answers only requests with its replica's secret (the gateway's), which its owner can read
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 401
    w = http.get(f"/api/v1/workloads/{replica['workload_id']}", headers=who.headers).json()
    secret = w["spec"]["env"]["REPLICA_KEY"]
    auth = {"authorization": f"Bearer {secret}"}
    (model,) = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=auth, timeout=10).json()["data"]
    assert (model["root"], model["writable"]) == ("/mnt/model/checkpoint-1200", False)  # the mounted path, read-only
    out = _client(world, key).completions.create(model="tuned", prompt="x", max_tokens=3)
    assert out.usage is not None and out.usage.completion_tokens == 3
    assert http.delete("/api/v1/endpoints/tuned", headers=who.headers).status_code == 200
