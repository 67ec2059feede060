"""The SSH gateway before authentication: one address cannot take every slot, and one connection cannot make
unbounded lookups.

The attack (a hostile review): 512 bare TCP connections from one address, no account and no key, held every
connection slot of the gateway (reopened each 30 s login timeout) and every tenant's login was refused; and one
unauthenticated connection offered 300 throwaway keys, each a thread and three SQL queries.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncssh

from suanli.ssh.hostkey import ensure_host_key
from suanli.ssh.server import Gateway, Grant, Limits, Target, listen
from tests.control_plane import free_port


class Counting:
    def __init__(self, fp: str) -> None:
        self.fp, self.calls = fp, 0

    async def authorize(self, username: str, fingerprint: str, public_key: str) -> Grant | None:
        self.calls += 1  # in the real gateway: a thread and 3 SQL queries
        return Grant("usr_1", "me@example.com", "wl_box", "box", 0, fingerprint) if fingerprint == self.fp else None

    async def revoked(self, grants: list[Grant]) -> dict[Grant, str]:
        return {}

    async def target(self, grant: Grant) -> Target:
        return Target(lambda argv: ["true"])


def test_idle_connections_from_one_address_do_not_lock_others_out(tmp_path: Path) -> None:
    async def main() -> None:
        key = asyncssh.generate_private_key("ssh-ed25519")
        gw = Gateway(Counting(key.get_fingerprint("sha256")), Limits(max_connections=16, max_waiting_per_address=4))
        port = free_port()
        acc = await listen(gw, "127.0.0.1", port, ensure_host_key(tmp_path))
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]  # no account, no key: bare TCP
        await asyncio.sleep(0.5)
        try:
            assert gw.connections <= 4, gw.connections  # the rest were closed as they came
            async with asyncssh.connect("127.0.0.1", port, username="box", client_keys=[key], known_hosts=None,
                                        local_addr=("127.0.0.2", 0), agent_path=None) as c:  # fmt: skip
                assert c.get_extra_info("username") == "box"  # logged in: connect raises when refused
        finally:
            for _, w in idle:
                w.close()
            acc.close()

    asyncio.run(main())


def test_one_connection_offers_a_bounded_number_of_keys(tmp_path: Path) -> None:
    async def main() -> None:
        key = asyncssh.generate_private_key("ssh-ed25519")
        access = Counting(key.get_fingerprint("sha256"))
        gw = Gateway(access, Limits())
        port = free_port()
        acc = await listen(gw, "127.0.0.1", port, ensure_host_key(tmp_path))
        junk = [asyncssh.generate_private_key("ssh-ed25519") for _ in range(30)]
        try:
            async with asyncssh.connect("127.0.0.1", port, username="box", client_keys=junk, known_hosts=None,
                                        agent_path=None):  # fmt: skip
                raise AssertionError("thirty strangers' keys got in")
        except (asyncssh.PermissionDenied, asyncssh.ConnectionLost, asyncssh.DisconnectError):
            pass
        finally:
            acc.close()
        assert access.calls <= Limits().max_auth_tries, access.calls

    asyncio.run(main())
