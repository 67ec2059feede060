"""`suanli passwd`, `forgot-password`, `reset-password` and `suanli admin set-password` as users run them: subprocesses
against a live server that mails a real SMTP server (aiosmtpd), and the operator's command on the database
directly, with no server, for someone locked out."""

from __future__ import annotations

import json
import re
from pathlib import Path

from suanli.client import ApiError, Client
from tests.cli_helpers import suanli
from tests.control_plane import live_server
from tests.mail_helpers import smtp_server
from tests.sqlite_only import sqlite_db_url  # noqa: F401  (the CLI's subject is not the database)

RESET_LINK = re.compile(r"https?://\S+/reset\?token=[A-Za-z0-9_-]+")


def test_cli_change_forget_and_reset(db_url: str, tmp_path: Path) -> None:
    fay, laptop = tmp_path / "fay", tmp_path / "laptop"
    with smtp_server() as box, live_server(tmp_path / "srv", db_url, env={"SUANLI_SMTP_URL": box.url}) as srv:
        url = srv.url
        suanli(["signup", "--email", "fay@example.com", "--password-stdin"], fay, url, stdin="fay-password-1\n")
        suanli(["login", "--email", "fay@example.com", "--password-stdin"], laptop, url, stdin="fay-password-1\n")
        p = suanli(["passwd", "--password-stdin"], fay, url, stdin="wrong-password\nfay-password-2\n", code=2)
        assert "current_password" in p.stderr, p.stderr
        p = suanli(["passwd", "--password-stdin", "--json"], fay, url, stdin="fay-password-1\nfay-password-2\n")
        assert json.loads(p.stdout) == {
            "email": "fay@example.com",
            "revoked_tokens": 1,
            "removed_ssh_keys": 0,
            "revoked_endpoint_keys": 0,
        }
        assert "fay@example.com" in suanli(["whoami"], fay, url).stdout  # this login stays
        assert "revoked" in suanli(["whoami"], laptop, url, code=2).stderr  # the laptop's is gone

        p = suanli(["forgot-password", "--email", "fay@example.com"], tmp_path / "anyone", url)
        assert "if an account has this address" in p.stdout
        box.wait(2)
        with box.lock:
            bodies = [m.get_body(("plain",)).get_content() for _, m in box.received]  # type: ignore[union-attr]
        link = next(m.group(0) for b in bodies if (m := RESET_LINK.search(b)))
        p = suanli(["reset-password", "--stdin"], tmp_path / "anyone", url, stdin=f"{link}\nfay-password-3\n")
        assert "password set for fay@example.com; 1 token(s) revoked, 0 SSH key(s) removed" in p.stdout, p.stdout
        p = suanli(["reset-password", "--stdin"], tmp_path / "anyone", url, stdin=f"{link}\nx-password-4\n", code=2)
        assert "used already" in p.stderr, p.stderr
        assert "revoked" in suanli(["whoami"], fay, url, code=2).stderr
        p = suanli(["login", "--email", "fay@example.com", "--password-stdin"], fay, url, stdin="fay-password-3\n")
        assert "logged in" in p.stdout
        with Client(url) as c:
            c.login("fay@example.com", "fay-password-3")
            assert c.change_password("fay-password-3", "fay-password-5").revoked_tokens == 1
            try:
                c.reset_password("x" * 129, "fay-password-6")
            except ApiError as e:
                assert e.status == 422 and "token" in e.message
            else:
                raise AssertionError("an oversized token was accepted")


def test_admin_set_password_on_the_database_directly(db_url: str, tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    nowhere = "http://127.0.0.1:1"
    create = ["admin", "create-user", "--email", "ops@example.com", "--admin", "--password-stdin", "--db", db_url]
    suanli(create, ops, nowhere, stdin="ops-password-1\n")
    with live_server(tmp_path / "srv", db_url) as srv:
        suanli(["login", "--email", "ops@example.com", "--password-stdin"], ops, srv.url, stdin="ops-password-1\n")
        token = json.loads((ops / "credentials.json").read_text())[srv.url]["token"]
    set_pw = ["admin", "set-password", "--email", " OPS@example.com ", "--password-stdin", "--db", db_url]
    p = suanli(set_pw, tmp_path / "root", nowhere, stdin="ops-password-2\n")
    assert "password set for ops@example.com; 1 token(s) revoked, 0 SSH key(s) removed" in p.stdout, p.stdout
    short = suanli(set_pw, tmp_path / "root", nowhere, stdin="short\n", code=2)
    assert short.stderr.startswith("error: password: at least 8"), short.stderr
    nobody = ["admin", "set-password", "--email", "nobody@example.com", "--password-stdin", "--db", db_url]
    assert "no user has the email" in suanli(nobody, tmp_path / "root", nowhere, stdin="long-enough-1\n", code=2).stderr
    with live_server(tmp_path / "srv", db_url) as srv:
        assert "revoked" in suanli(["whoami"], tmp_path / "old", srv.url, code=2, SUANLI_TOKEN=token).stderr
        with Client(srv.url) as c:
            assert c.login("ops@example.com", "ops-password-2").user.is_admin
            try:
                c.login("ops@example.com", "ops-password-1")
            except ApiError as e:
                assert e.status == 401
            else:
                raise AssertionError("the old password still logs in")


def test_cli_token_outliving_the_login_needs_the_password(db_url: str, tmp_path: Path) -> None:
    """`suanli tokens create` from a 30-day login: a week's token as before; one that never expires only with the
    password (`--password-stdin`, or a prompt on a terminal); without it, one line saying what is needed."""
    gil = tmp_path / "gil"
    with live_server(tmp_path / "srv", db_url) as srv:
        url = srv.url
        suanli(["signup", "--email", "gil@example.com", "--password-stdin"], gil, url, stdin="gil-password-1\n")
        p = suanli(["tokens", "create", "week", "--expires-in-days", "7", "--json"], gil, url)
        assert json.loads(p.stdout)["expires_at"] is not None
        p = suanli(["tokens", "create", "forever"], gil, url, stdin="", code=2)
        assert "password" in p.stderr and "--password-stdin" in p.stderr, p.stderr
        p = suanli(["tokens", "create", "forever", "--password-stdin"], gil, url, stdin="not-it\n", code=2)
        assert "wrong password" in p.stderr, p.stderr
        p = suanli(["tokens", "create", "forever", "--password-stdin", "--json"], gil, url, stdin="gil-password-1\n")
        made = json.loads(p.stdout)
        assert made["expires_at"] is None
        with Client(url, made["token"]) as c:
            assert c.me().user.email == "gil@example.com"
