"""The SSH gateway's decisions over the database, and the process it runs in.

Who may enter: the login name names an instance (its id, or its name among the orgs of the key's users, with
`.N` for node-rank N); the offered key must be one a member of the instance's org added (`suanli keys add`).
An unknown instance and another org's look the same to the client (authentication fails). Whether it can be
entered is decided per session, from the row as it is then: a stopped instance answers with its state.

The gateway runs in a child process of the server (`GatewayProcess`), like the background loops: SSH traffic
(an scp of gigabytes) then never competes with API requests for the GIL, and a server with `--workers N` runs one
gateway beside them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
from typing import Any

from sqlalchemy import select

from suanli.control.accounts import memberships
from suanli.control.children import WatchedProcess
from suanli.control.settings import Settings
from suanli.db.engine import Database
from suanli.db.models import Membership, SshKey, User, Workload
from suanli.executors import executor
from suanli.executors.base import NotRunning
from suanli.ssh.hostkey import ensure_host_key
from suanli.ssh.server import Access, Gateway, Grant, Limits, Refused, Target, listen

log = logging.getLogger("suanli.ssh")
USERNAME = re.compile(r"^(?P<ref>[A-Za-z0-9_-]{1,63})(?:\.(?P<rank>\d{1,4}))?$")
EXIT_PORT_IN_USE = 3  # the child's exit code when it cannot listen: not restarted, the log says why


def parse_username(username: str) -> tuple[str, int] | None:
    """`my-box` or `wl_…` (node-rank 0), `my-box.1` (node-rank 1); None for anything else."""
    m = USERNAME.match(username)
    return (m["ref"], int(m["rank"] or 0)) if m else None


def not_running(w: Workload) -> str | None:
    """Why the instance cannot be entered now, in words the client acts on; None when it runs."""
    if w.kind != "instance":
        return f"{w.name} is a job, not an instance: only instances can be entered over SSH"
    if w.state == "running":
        return None
    if w.state == "pending":
        why = f" ({w.pending_reason})" if w.pending_reason else ""
        return f"instance {w.name} is pending{why}; it can be entered once it runs"
    if w.state in ("scheduled", "starting"):
        return f"instance {w.name} is {w.state}; try again in a few seconds"
    why = f" ({w.reason})" if w.reason and w.state != "stopped" else ""
    return f"instance {w.name} is {w.state}{why}; `suanli start {w.name}`"


def revocation(grant: Grant, org_id: str | None, has_key: bool, role: str | None) -> str | None:
    """Why a grant no longer holds, in words for the client; None while it does. A connection outlives the key it
    came in by (a reset removes them all) and its user's membership: each new session asks, and so does the
    gateway's periodic re-check of open connections."""
    if org_id is None:
        return f"instance {grant.name} no longer exists"
    if not grant.fingerprint:
        return None
    if not has_key:
        return "your key was removed (or a new password set by a reset); connect again"
    if role not in memberships.ENTER:
        return f"you are no longer a member of instance {grant.name}'s organisation who may enter"
    return None


class DbAccess(Access):
    """`suanli.ssh.server.Access` over the database; queries run in threads, off the gateway's event loop."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.executors: dict[str, Any] = {}

    async def authorize(self, username: str, fingerprint: str, public_key: str) -> Grant | None:
        return await asyncio.to_thread(self._authorize, username, fingerprint, public_key)

    def _authorize(self, username: str, fingerprint: str, public_key: str) -> Grant | None:
        parsed = parse_username(username)
        if parsed is None:
            return None
        ref, rank = parsed
        with self.db.read() as s:
            owners = s.execute(select(SshKey.user_id, User.email).join(User, User.id == SshKey.user_id)
                               .where(SshKey.fingerprint == fingerprint, SshKey.public_key == public_key)).all()  # fmt: skip
            if not owners:
                return None
            emails = dict(owners)
            member_of: dict[str, str] = {}  # org -> the first of the key's users who is a member
            for org_id, user_id in s.execute(select(Membership.org_id, Membership.user_id)
                                             .where(Membership.user_id.in_(emails),
                                                    Membership.role.in_(memberships.ENTER))  # a viewer reads only
                                             .order_by(Membership.user_id)):  # fmt: skip
                member_of.setdefault(org_id, user_id)
            w = s.get(Workload, ref)
            if w is None and member_of and len(emails) == 1:  # a name, and a key of one account only
                q = select(Workload).where(Workload.name == ref, Workload.org_id.in_(member_of))
                named = list(s.scalars(q.order_by(Workload.created_at.desc()).limit(50)))
                if len({x.org_id for x in named}) > 1:
                    return None  # that name in two of the user's orgs: the id says which, a guess would not
                w = named[0] if named else None
            if w is None or w.org_id not in member_of:
                return None
            user_id = member_of[w.org_id]
            return Grant(user_id, emails[user_id], w.id, w.name, rank, fingerprint)

    async def target(self, grant: Grant) -> Target:
        return await asyncio.to_thread(self._target, grant)

    async def revoked(self, grants: list[Grant]) -> dict[Grant, str]:
        return await asyncio.to_thread(self._revoked, grants) if grants else {}

    def _revoked(self, grants: list[Grant]) -> dict[Grant, str]:
        users, ids = {g.user_id for g in grants}, {g.workload_id for g in grants}
        with self.db.read() as s:  # three reads for every open connection of the gateway
            orgs = {w: org for w, org in s.execute(select(Workload.id, Workload.org_id).where(Workload.id.in_(ids)))}
            keys = {(u, fp) for u, fp in s.execute(select(SshKey.user_id, SshKey.fingerprint)
                                                   .where(SshKey.user_id.in_(users)))}  # fmt: skip
            roles = {(org, u): role for org, u, role in s.execute(select(Membership.org_id, Membership.user_id,
                                                                         Membership.role)
                                                                  .where(Membership.user_id.in_(users)))}  # fmt: skip
        gone = {}
        for g in grants:
            org = orgs.get(g.workload_id)
            why = revocation(g, org, (g.user_id, g.fingerprint) in keys, roles.get((org, g.user_id)))
            if why is not None:
                gone[g] = why
        return gone

    def _target(self, grant: Grant) -> Target:
        with self.db.read() as s:
            w = s.get(Workload, grant.workload_id)
            if w is None:
                raise Refused(f"instance {grant.name} no longer exists")
            key = select(SshKey.id).where(SshKey.user_id == grant.user_id, SshKey.fingerprint == grant.fingerprint)
            role = s.scalar(select(Membership.role).where(Membership.org_id == w.org_id,
                                                          Membership.user_id == grant.user_id))  # fmt: skip
            why = revocation(grant, w.org_id, s.scalar(key) is not None, role) or not_running(w)
            if why is not None:
                raise Refused(why)
            name, handle, executor_name = w.name, dict(w.handle or {}), w.executor
        if executor_name in ("ray", "slurm"):
            raise Refused(f"instance {name} runs on {executor_name} nodes; the gateway enters instances on this "
                          "server's host only (run your own sshd in the instance and use `ports:`)")  # fmt: skip
        ex = self.executors.get(executor_name)
        if ex is None:
            ex = self.executors[executor_name] = executor(executor_name)
        enter_argv = getattr(ex, "enter_argv", None)
        if enter_argv is None or not handle:
            raise Refused(f"instance {name} runs on {executor_name or 'no'} nodes, where there is nothing to enter")

        def enter(argv: list[str]) -> list[str]:
            try:
                return list(enter_argv(handle, grant.node_rank, argv))
            except NotRunning as e:
                raise Refused(f"instance {name}: {e}") from None

        return Target(enter)


def gateway_limits(settings: Settings) -> Limits:
    return Limits(max_connections_per_user=settings.ssh_max_connections_per_user)


async def serve(settings: Settings, db: Database, stop: asyncio.Event) -> None:
    """Listen until `stop` is set."""
    key = ensure_host_key(settings.home)
    gw = Gateway(DbAccess(db), gateway_limits(settings))
    acceptor = await listen(gw, settings.host, settings.ssh_port, key)
    log.info("ssh gateway on %s:%d", settings.host, settings.ssh_port)
    watch = asyncio.get_running_loop().create_task(gw.watch())
    try:
        await stop.wait()
    finally:
        watch.cancel()
        acceptor.close()
        await acceptor.wait_closed()


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent check in `main` still ends it
        pass


def run_gateway(settings_json: str, server_pid: int) -> None:
    """The child's main: serve until SIGTERM, or until the server process is gone."""
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    settings = Settings.model_validate_json(settings_json)
    db = Database(settings.db_url)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the server, which stops us in order

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)

        async def orphaned() -> None:
            while os.getppid() == server_pid:
                await asyncio.sleep(1.0)
            stop.set()

        watch = loop.create_task(orphaned())
        try:
            await serve(settings, db, stop)
        finally:
            watch.cancel()

    try:
        asyncio.run(main())
    except OSError as e:  # the port is taken (another server?), or the address is not ours
        log.error("ssh gateway cannot listen on %s:%d: %s (set ssh_port, 0 disables the gateway)",
                  settings.host, settings.ssh_port, e)  # fmt: skip
        raise SystemExit(EXIT_PORT_IN_USE) from None
    finally:
        db.dispose()


class GatewayProcess(WatchedProcess):
    """The gateway in a child process of the server, started again if it dies (unless it could not listen)."""

    def __init__(self, settings: Settings) -> None:
        ensure_host_key(settings.home)  # before any worker answers GET /ssh with its fingerprint
        super().__init__(run_gateway, settings.model_dump_json(), "suanli-ssh", stop_timeout_s=10.0,
                         final=frozenset({EXIT_PORT_IN_USE}))  # fmt: skip
