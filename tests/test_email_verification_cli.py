"""`suanli signup`, `whoami` and `verify` as users run them, against a live server that sends its mail to a real SMTP
server (aiosmtpd): the link pasted whole releases the trial credit once; a second paste fails in one line; a resend
after verifying is refused; the SDK's calls say the same."""

from __future__ import annotations

import json
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

from suanli.client import ApiError, Client
from tests.cli_helpers import suanli
from tests.control_plane import live_server
from tests.mail_helpers import LINK, smtp_server
from tests.sqlite_only import sqlite_db_url  # noqa: F401  (the CLI's subject is not the database)


def doc(p: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(p.stdout)


def test_cli_verify_with_the_mailed_link(db_url: str, tmp_path: Path) -> None:
    dora = tmp_path / "dora"
    with smtp_server() as box, live_server(tmp_path / "srv", db_url, env={"SUANLI_SMTP_URL": box.url}) as srv:
        url = srv.url
        p = suanli(["signup", "--email", "dora@example.com", "--password-stdin"], dora, url, stdin="dora-pass-1\n")
        assert "balance 0.00 CNY" in p.stdout and "verify your e-mail" in p.stdout, p.stdout
        me = doc(suanli(["whoami", "--json"], dora, url))
        assert me["email_verified"] is False and me["trial_pending"] is True
        box.wait(1)
        body = box.received[0][1].get_body(("plain",)).get_content()  # type: ignore[union-attr]
        link = LINK.search(body)
        assert link is not None and link.group(0).startswith(url + "/verify?token="), body  # default: HOST:PORT
        out = doc(suanli(["verify", link.group(0), "--json"], tmp_path / "anyone", url))  # no login needed
        assert Decimal(out["credited"]) == Decimal(10) and out["email"] == "dora@example.com"
        p = suanli(["verify", link.group(1)], tmp_path / "anyone", url, code=2)
        assert "token" in p.stderr and "used" in p.stderr, p.stderr
        assert "e-mail verified" in suanli(["whoami"], dora, url).stdout
        p = suanli(["verify", "--resend"], dora, url, code=2)
        assert "already verified" in p.stderr, p.stderr
        p = suanli(["verify"], dora, url, code=2)
        assert "TOKEN" in p.stderr
        with Client(url) as c:
            c.signup("eve@example.com", "eve-password")
            assert c.me().trial_pending is True
            assert c.resend_verification() == "eve@example.com"
            box.wait(3)
            assert c.verify_email(box.token()).credited == Decimal(10)
            assert c.me().email_verified is True
            try:
                c.verify_email("x" * 129)
            except ApiError as e:
                assert e.status == 422 and "token" in e.message
            else:
                raise AssertionError("an oversized token was accepted")
        assert Decimal(doc(suanli(["balance", "--json"], dora, url))["balance"]) == Decimal(10)
