"""Issue: `POST /workdirs` read the whole body (up to `max_upload_bytes`, 64 MiB by default) before it asked whether
the caller may upload for that org at all, so a stranger could make the server take in 64 MiB per request for an
org it does not belong to, and an org with no storage left was told so only after its upload had arrived. Attack
first, over a real socket: the headers of a large upload are sent and the body is held back; the refusal must come
before any of the body is read."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx

from tests.control_plane import join, live_server, signup

API = "/api/v1"
BODY = 32 << 20  # what the request says it will send: never sent


def _answer_before_the_body(url: str, token: str, org: str) -> str:
    """Send the request line and headers of a 32 MiB upload and no body; what the server answers within 10 s."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = (f"POST {API}/workdirs?org={org} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/gzip\r\nContent-Length: {BODY}\r\n\r\n")  # fmt: skip
        sock.sendall(head.encode())
        sock.sendall(b"\x1f\x8b" + b"\0" * 1022)  # the first KiB, then nothing
        got = b""
        try:
            while not _whole(got) and (chunk := sock.recv(4096)):  # the head and the body may come apart
                got += chunk
        except TimeoutError:
            if not got:
                return "(no answer: the server waits for the body)"
        return got.decode(errors="replace")


def _whole(answer: bytes) -> bool:
    """Whether `answer` holds a response's head and all of the body its Content-Length announces."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return True


def test_an_upload_for_someone_elses_org_is_refused_before_its_body(tmp_path: Path) -> None:
    db_url = f"sqlite+pysqlite:///{tmp_path}/suanli.db"
    with live_server(tmp_path / "home", db_url) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        victim, stranger = signup(api, "victim@example.com"), signup(api, "stranger@example.com")
        token = stranger.headers["Authorization"].removeprefix("Bearer ")
        answer = _answer_before_the_body(srv.url, token, victim.org_id)
        assert answer.startswith("HTTP/1.1 404"), answer
        answer = _answer_before_the_body(srv.url, "not-a-token", victim.org_id)
        assert answer.startswith("HTTP/1.1 401"), answer
        team = api.post(f"{API}/orgs", json={"name": "lab"}, headers=victim.headers).json()["id"]
        join(api, victim, team, stranger, role="viewer")  # a viewer may not fill the team's storage
        answer = _answer_before_the_body(srv.url, token, team)
        assert answer.startswith("HTTP/1.1 403"), answer


def test_an_upload_for_an_org_with_no_room_left_is_refused_before_its_body(tmp_path: Path) -> None:
    db_url = f"sqlite+pysqlite:///{tmp_path}/suanli.db"
    env = {"SUANLI_STORAGE_QUOTA_BYTES": "0"}
    with live_server(tmp_path / "home", db_url, env=env) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        who = signup(api, "full@example.com")
        token = who.headers["Authorization"].removeprefix("Bearer ")
        answer = _answer_before_the_body(srv.url, token, who.org_id)
        assert answer.startswith("HTTP/1.1 409") and "storage_quota_bytes" in answer, answer
