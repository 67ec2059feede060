"""Whose X-Forwarded-For the server believes (found by a hostile review of what a sandbox on the server's host can
reach). A tenant's job shares the host's network and connects to the API from 127.0.0.1, the one address uvicorn
believes by default: a forged `X-Forwarded-For` made every request a new address to the per-address signup limit
(trial credit farmed without end) and to the login throttle. Now no proxy is believed unless the operator names it
(`trusted_proxies`). A real server process each, as a sandboxed job reaches it: over loopback HTTP."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.control_plane import live_server

LIMIT = 2


def _signups(url: str, n: int, forged: bool) -> list[int]:
    with httpx.Client(base_url=url, timeout=60) as c:
        return [
            c.post(
                "/api/v1/signup",
                json={"email": f"{'f' if forged else 'p'}{i}@example.com", "password": "tenant-password"},
                headers={"X-Forwarded-For": f"198.51.100.{i + 1}"} if forged else {},
            ).status_code
            for i in range(n)
        ]


@pytest.mark.parametrize("trusted", ["", "127.0.0.1"])
def test_a_forged_forwarded_for_counts_only_behind_a_proxy_the_operator_named(tmp_path: Path, trusted: str) -> None:
    env = {"SUANLI_SIGNUP_PER_ADDRESS_PER_HOUR": str(LIMIT), "SUANLI_TRUSTED_PROXIES": trusted}
    with live_server(tmp_path / "home", f"sqlite+pysqlite:///{tmp_path / 'db'}", env=env) as s:
        assert _signups(s.url, LIMIT + 1, forged=False) == [201] * LIMIT + [429]
        forged = _signups(s.url, 4, forged=True)
    if trusted:  # behind the operator's own proxy, each client is its own address
        assert forged == [201] * 4, forged
    else:  # the connection's address: the limit holds whatever the header says
        assert forged == [429] * 4, forged


@pytest.mark.parametrize("bad", ["10.0.0.1; rm -rf /", "proxy.example.com", "10.0.0.1\n", "x" * 1001])
def test_trusted_proxies_takes_addresses_and_networks_only(tmp_path: Path, bad: str) -> None:
    from pydantic import ValidationError

    from suanli.cli.server import forwarding
    from suanli.control.settings import Settings

    with pytest.raises(ValidationError, match="trusted_proxies"):
        Settings(home=tmp_path, trusted_proxies=bad)
    good = Settings(home=tmp_path, trusted_proxies="10.0.0.0/8, ::1")
    assert forwarding(good) == {"proxy_headers": True, "forwarded_allow_ips": "10.0.0.0/8, ::1"}
    assert forwarding(Settings(home=tmp_path)) == {"proxy_headers": False}
