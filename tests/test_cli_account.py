"""The tenant and operator CLI as users run it: `suanli …` subprocesses against a real server, both databases.

Each user has their own SUANLI_HOME (saved logins); SUANLI_SERVER points every command at the test server.
Independent commands run concurrently to keep the file quick (each one is a fresh Python process)."""

from __future__ import annotations

import json
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

from tests.cli_helpers import suanli
from tests.control_plane import ADMIN_EMAIL, ADMIN_PASSWORD, free_port, live_server
from tests.sqlite_only import sqlite_db_url  # noqa: F401  (the CLI's subject is not the database)

PRESET = "h20-roce800-128"
NODE = f"{PRESET}.h20-0003"


def doc(p: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(p.stdout)


def together(*calls: tuple[Any, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Run independent CLI calls at once: each is (args, home, server[, kwargs])."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(suanli, *c[:3], **(c[3] if len(c) > 3 else {})) for c in calls]
        return [f.result() for f in futures]


def creds(home: Path) -> dict[str, Any]:
    path = home / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return json.loads(path.read_text())


def test_cli_tenant_and_operator(db_url: str, tmp_path: Path) -> None:
    boss, carol = tmp_path / "boss", tmp_path / "carol"

    # the first admin is made against the database directly, before any server runs
    create = ["admin", "create-user", "--email", "boss@example.com", "--admin", "--password-stdin", "--db", db_url]
    made = suanli(create, boss, "http://127.0.0.1:1", stdin="boss-password\n")
    assert "admin user boss@example.com" in made.stdout

    with live_server(tmp_path / "srv", db_url) as srv:
        url = srv.url
        login, signup = together(
            (["login", "--email", "boss@example.com", "--password-stdin"], boss, url, {"stdin": "boss-password\n"}),
            (["signup", "--email", "carol@example.com", "--password-stdin"], carol, url, {"stdin": "carol-pass-1\n"}),
        )
        assert "boss@example.com (admin)" in login.stdout and "balance 10.00 CNY" in signup.stdout
        assert creds(boss)[url]["email"] == "boss@example.com" and creds(carol)[url]["token"].startswith("sl_")

        reg, bal, who = together(
            (["admin", "register", "--preset", PRESET, "--json"], boss, url),
            (["balance", "--json"], carol, url),
            (["whoami"], carol, url),
        )
        assert (doc(reg)["name"], doc(reg)["gpus"]) == (PRESET, 128)
        assert doc(bal)["balance"] == "10.00" and doc(bal)["currency"] == "CNY" and doc(bal)["exact"] == "10.00000000"
        assert "carol@example.com" in who.stdout and doc(bal)["org_id"] in who.stdout

        price, drain, topup = together(
            (["admin", "prices", "set", "H20", "9.00"], boss, url),
            (["admin", "drain", NODE, "--reason", "fan"], boss, url),
            (["admin", "topup", "carol@example.com", "5", "--key", "pay-1", "--json"], boss, url),
        )
        assert "H20 at 9.00" in price.stdout and f"{NODE}: draining (fan)" in drain.stdout
        assert (doc(topup)["kind"], Decimal(doc(topup)["amount"])) == ("topup", 5)

        quote_args = ["quote", "--model", "llama3.1-8b", "--tokens", "1e9", "--gpu", "H20", "--limit", "3", "--json"]
        offers, quote, bal, csv, bad = together(
            (["offers", "--json"], carol, url),
            (quote_args, carol, url),
            (["balance", "--json"], carol, url),
            (["usage", "--csv"], carol, url),
            (["quote", "--model", "nope", "--tokens", "1e9"], carol, url, {"code": 2}),
        )
        [h20] = doc(offers)
        assert (h20["gpu"], h20["total"], h20["free"]) == ("H20", 128, 120)  # the drained node is not free
        assert Decimal(h20["on_demand_per_gpu_hour"]) == Decimal("9.00")
        quotes = doc(quote)
        costs = [Decimal(q["cost"]) for q in quotes]
        assert 0 < len(quotes) <= 3 and costs == sorted(costs)
        assert all(Decimal(q["rate_per_hour"]) == 9 * q["gpus"] for q in quotes)
        assert all(q["available_now"] == (q["gpus"] <= 120) for q in quotes)
        assert doc(bal)["balance"] == "15.00"
        assert csv.stdout.splitlines() == ["allocation,workload,user,gpu_model,gpus,milli,billing_mode,rate_per_hour,"
                                           "started_at,stopped_at,seconds_charged,cost,cpu_milli,memory_mib,"
                                           "host_rate_per_hour,activity"]  # fmt: skip
        assert bad.stderr.startswith("error: model:") and "llama3.1-8b" in bad.stderr

        # logging out forgets the login here and revokes the token there (SUANLI_TOKEN replays it)
        old = creds(carol)[url]["token"]
        assert "logged out" in suanli(["logout"], carol, url).stdout
        assert url not in creds(carol)
        after, stale = together(
            (["balance"], carol, url, {"code": 2}),
            (["balance"], tmp_path / "elsewhere", url, {"code": 2, "SUANLI_TOKEN": old}),
        )
        assert f"not logged in to {url}" in after.stderr and "suanli login" in after.stderr
        assert "revoked" in stale.stderr


def test_cli_errors_without_a_server(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    home = tmp_path / "home"
    create = ["admin", "create-user", "--email", "nobody", "--password-stdin", "--db", f"sqlite:///{tmp_path}/x.db"]
    unreachable, both, bad_amount, bad_email = together(
        (["balance"], home, down, {"code": 1, "SUANLI_TOKEN": "sl_x"}),
        (["quote", "--model", "llama3.1-8b", "--tokens", "1e9", "--steps", "5"], home, down, {"code": 2}),
        (["admin", "topup", "someone", "ten"], home, down, {"code": 2, "SUANLI_TOKEN": "sl_x"}),
        (create, home, down, {"code": 2, "stdin": "long-enough-1\n"}),
    )
    assert f"cannot reach suanli server at {down}" in unreachable.stderr and "suanli server" in unreachable.stderr
    assert "exactly one of --tokens and --steps" in both.stderr
    assert "invalid AMOUNT 'ten'" in bad_amount.stderr
    assert bad_email.stderr.startswith("error: email:")


def test_cli_signup_keeps_a_saved_login_and_invitations_need_consent(db_url: str, tmp_path: Path) -> None:
    ops, dana, erin = tmp_path / "ops", tmp_path / "dana", tmp_path / "erin"
    with live_server(tmp_path / "srv", db_url) as srv:
        url = srv.url
        suanli(["login", "--email", ADMIN_EMAIL, "--password-stdin"], ops, url, stdin=f"{ADMIN_PASSWORD}\n")
        # `suanli signup` where a login is saved: refused, and the login is kept (it was replaced without a word)
        refused = suanli(["signup", "--email", "dana@example.com", "--password-stdin"], ops, url,
                         stdin="dana-pass-1\n", code=2)  # fmt: skip
        assert f"already logged in to {url} as {ADMIN_EMAIL}" in refused.stderr and "--force" in refused.stderr
        assert creds(ops)[url]["email"] == ADMIN_EMAIL
        code, _, _ = together(
            (["admin", "invites", "create", "--uses", "2", "--note", "new team"], ops, url),
            (["signup", "--email", "dana@example.com", "--password-stdin"], dana, url, {"stdin": "dana-pass-1\n"}),
            (["signup", "--email", "erin@example.com", "--password-stdin"], erin, url, {"stdin": "erin-pass-1\n"}),
        )
        assert code.stdout.startswith("si_") and "2 signups" in code.stderr
        assert "new team" in suanli(["admin", "invites", "list"], ops, url).stdout

        team = doc(suanli(["orgs", "create", "lab", "--json"], dana, url))["id"]
        sent = doc(suanli(["orgs", "invite", "lab", "erin@example.com", "--role", "viewer", "--spend-limit", "25",
                           "--json"], dana, url))  # fmt: skip
        assert sent["code"].startswith("si_") and sent["state"] == "pending"
        assert doc(suanli(["orgs", "members", "lab", "--json"], dana, url))[0]["email"] == "dana@example.com"
        [mine] = doc(suanli(["orgs", "invitations", "--json"], erin, url))
        assert (mine["id"], mine["org_name"], mine["role"], mine["invited_by"]) == (sent["id"], "lab", "viewer",
                                                                                    "dana@example.com")  # fmt: skip
        assert f"joined lab ({team}) as viewer" in suanli(["orgs", "accept", sent["id"]], erin, url).stdout
        members = {m["email"]: m for m in doc(suanli(["orgs", "members", "lab", "--json"], dana, url))}
        assert (members["erin@example.com"]["role"], members["erin@example.com"]["monthly_spend_limit"]) == (
            "viewer", "25.00000000")  # fmt: skip
        assert "is now member of lab" in suanli(["orgs", "role", "lab", "erin@example.com", "member"], dana, url).stdout
        assert "no limit" in suanli(["orgs", "spend-limit", "lab", "erin@example.com", "none"], dana, url).stdout
        last = suanli(["orgs", "role", "lab", "dana@example.com", "admin"], dana, url, code=2)
        assert "at least one owner" in last.stderr
        assert "left lab" in suanli(["orgs", "leave", "lab"], erin, url).stdout

        forced = suanli(["signup", "--email", "frank@example.com", "--password-stdin", "--force"], ops, url,
                        stdin="frank-pass-1\n")  # fmt: skip
        assert f"replacing the login of {ADMIN_EMAIL}" in forced.stdout
        assert creds(ops)[url]["email"] == "frank@example.com"
