"""Helpers for control-plane tests: settings, an in-process app per backend, a real server process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from suanli.control.settings import Settings, load

ADMIN_EMAIL = "ops@example.com"
ADMIN_PASSWORD = "ops-password-1"


def settings(home: Path, db_url: str, **overrides: Any) -> Settings:
    flags: dict[str, Any] = {"home": home, "db": db_url, "admin_email": ADMIN_EMAIL, "admin_password": ADMIN_PASSWORD,
                             "background": False}  # fmt: skip
    return load({**flags, **overrides}, environ={})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Tenant:
    email: str
    token: str
    user_id: str
    org_id: str

    @property
    def headers(self) -> dict[str, str]:
        return bearer(self.token)


def signup(client: httpx.Client, email: str, password: str = "tenant-password") -> Tenant:
    r = client.post("/api/v1/signup", json={"email": email, "password": password})
    assert r.status_code == 201, r.text
    body = r.json()
    return Tenant(email, body["token"], body["user"]["id"], body["org"]["id"])


def join(client: httpx.Client, owner: Tenant, org_id: str, member: Tenant, role: str = "member") -> None:
    """`owner` invites `member` into the org with `role`, and `member` accepts: nobody joins without consent."""
    r = client.post(f"/api/v1/orgs/{org_id}/invitations", json={"email": member.email, "role": role},
                    headers=owner.headers)  # fmt: skip
    assert r.status_code == 201, r.text
    r = client.post(f"/api/v1/invitations/{r.json()['id']}/accept", headers=member.headers)
    assert r.status_code == 200, r.text


def admin_token(client: httpx.Client) -> str:
    r = client.post("/api/v1/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
    assert r.status_code == 200, r.text
    return r.json()["token"]


class InProcess(httpx.BaseTransport):
    """The SDK's httpx over an in-process test client (`api`), whichever HTTP package that client is built on
    (Starlette's test client moves to `httpx2` when it is installed, whose transports the SDK's httpx cannot use)."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self.api.request(request.method, str(request.url), headers=dict(request.headers), content=request.read())
        headers = [
            (k, v) for k, v in r.headers.multi_items() if k.lower() not in ("content-encoding", "content-length")
        ]
        return httpx.Response(r.status_code, headers=headers, content=r.content)  # the body comes decoded


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    url: str
    proc: subprocess.Popen[bytes]
    home: Path
    log: Path


@contextmanager
def live_server(
    home: Path, db_url: str, *, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> Iterator[LiveServer]:
    """`suanli server` as a real process on a free port, stopped (SIGTERM, then SIGKILL) on exit."""
    port = free_port()
    home.mkdir(parents=True, exist_ok=True)
    log = home / f"server-{port}.log"
    full_env = {**os.environ, "SUANLI_HOME": str(home), "SUANLI_ADMIN_EMAIL": ADMIN_EMAIL,
                "SUANLI_ADMIN_PASSWORD": ADMIN_PASSWORD, "SUANLI_SSH_PORT": "0", **(env or {})}  # fmt: skip
    # (no SSH gateway unless a test asks for one: parallel servers would all want port 2222)
    cmd = [sys.executable, "-m", "suanli.cli.main", "server", "--port", str(port), "--db", db_url, *args]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        yield LiveServer(url, proc, home, log)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90.0) -> None:
    """Until `/healthz` answers; a server on a busy 2-core machine (spawning workers, migrating) may take 30 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server not healthy after {timeout} s: {log.read_text(errors='replace')[-2000:]}")


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def spawned(pid: int) -> list[int]:
    """A server's children started by multiprocessing (API workers, the loop process), not its resource tracker."""
    return [k for k in children(pid) if "multiprocessing" in (c := cmdline(k)) and "resource_tracker" not in c]


def poll(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """`check()`'s first truthy answer, asked every 0.3 s; an AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        out = check()
        if out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout:g} s")
        time.sleep(0.3)


def team_with_member(api: Any) -> tuple[dict[str, str], Tenant, Tenant, str]:
    """An 8-GPU cluster and a team funded with 1000: (the operator's headers, its owner, a member, the team's id)."""
    operator = bearer(admin_token(api))
    assert api.post("/api/v1/admin/clusters", json={"preset": "1x8:H20"}, headers=operator).status_code == 201
    owner, alice = signup(api, "owner@example.com"), signup(api, "alice@example.com")
    org = api.post("/api/v1/orgs", json={"name": "lab"}, headers=owner.headers).json()["id"]
    join(api, owner, org, alice, "member")
    r = api.post(f"/api/v1/admin/orgs/{org}/transactions", json={"amount": "1000", "key": "seed"}, headers=operator)
    assert r.status_code == 201, r.text
    return operator, owner, alice, org
