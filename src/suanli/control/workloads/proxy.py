"""The instance proxy's decisions: who may open an instance's JupyterLab or ports in a browser, and where they are.

A tenant asks the API (with their bearer token) to open an instance; they get a URL with a ticket: random, a
minute long, single use, stored only as its SHA-256. Redeeming it at `/i/<id>/auth` trades it for a session: a
new secret in an HttpOnly, SameSite=Strict cookie scoped to `/i/<id>/`, valid for `SESSION_S`. The API token never
appears in a URL, and a ticket copied out of a log is dead by the time anyone reads it.

Every proxied request is checked against the session, the user's membership of the instance's org (a member who
left loses access at once) and the instance's state. Operators get no special access, as over SSH.

Where the instance is: JupyterLab listens on a Unix socket in the instance's proxy directory (bound into the
sandbox at `/run/suanli-proxy`), so no port of the node is opened to anybody; the proxy adds the per-attempt
Jupyter token the browser never sees. A `ports:` service listens on the instance's loopback, and is only
reached when a process of that instance's sandbox holds the listening socket.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from suanli.control.accounts import memberships
from suanli.control.accounts.accounts import Principal
from suanli.control.errors import Conflict, Forbidden, Invalid, NotFound, Unavailable
from suanli.control.ids import new_secret, token_hash
from suanli.control.workloads import workloads
from suanli.db.models import ApiToken, Membership, ProxySession, Workload
from suanli.executors import executor
from suanli.executors.base import NotRunning
from suanli.storage import workdirs
from suanli.workloads.spec import WorkloadSpec

TICKET_S = 60
SESSION_S = 12 * 3600
COOKIE = "suanli_proxy"
SANDBOX_DIR = "/run/suanli-proxy"  # the proxy directory as the sandbox sees it
SOCKET = "jupyter.sock"
TOKEN_FILE = ".jupyter-token"  # in the attempt's log directory: the server's, never mounted in a sandbox
JUPYTER_LOG = "jupyter.log"
STARTED_FILE = ".jupyter-started"  # in the attempt's log directory: JupyterLab was started on demand
LOG_TAIL_BYTES = 8192
SANDBOX_WAIT_S = 10.0  # how long a just-launched instance may take to have a sandbox to enter
# JupyterLab on a Unix socket; its token comes from JUPYTER_TOKEN in the instance's environment (never an argv).
# Remote access is allowed because every request arrives through the proxy with a Host header of the server's.
# Its kernels talk over Unix sockets too (`transport=ipc`, in the instance's own proxy directory): over TCP on
# 127.0.0.1 (jupyter_client's default) any job on the host network subscribed to a kernel's output channel and
# read every cell another tenant ran.
JUPYTER_COMMAND = (
    'jupyter lab --allow-root --no-browser --ServerApp.sock="$SUANLI_PROXY_DIR/jupyter.sock" '
    '--ServerApp.sock_mode=0600 --ServerApp.base_url="/i/$SUANLI_WORKLOAD_ID/lab/" --ServerApp.root_dir="$PWD" '
    "--ServerApp.allow_remote_access=True "
    '--KernelManager.transport=ipc --KernelManager.ip="$SUANLI_PROXY_DIR/kernel"'
)
# The background job lets go of what its starter passed (the server's stderr pipe, on demand) in a step of its own
# before it opens the log: the log is in the tenant's directory and may be a FIFO whose open blocks for good, and
# dash opens every target of one command's redirections before it moves any descriptor.
JUPYTER_BACKGROUND = (
    f'(exec </dev/null >/dev/null 2>&1; exec {JUPYTER_COMMAND} >"$SUANLI_PROXY_DIR/{JUPYTER_LOG}" 2>&1) &'
)
STARTS_AT_ONCE = 2  # on-demand starts one server process runs at once: each holds a route thread up to 40 s
_starting = threading.BoundedSemaphore(STARTS_AT_ONCE)


def proxy_dir(home: Path, workload_id: str) -> Path:
    return workdirs.workload_dir(home, workload_id) / "proxy"


@dataclass(frozen=True)
class InstanceAccess:
    """What an instance's launch adds so the proxy can reach it: env, a mount, the command to run."""

    env: dict[str, str]
    mount: tuple[str, str, bool] | None
    command: str


def prepare_launch(
    home: Path, w: Workload, spec: WorkloadSpec, log_dir: Path, command: str, sandboxed: bool, owner: int | None
) -> InstanceAccess:
    """An instance's proxy directory (emptied, owned by its sandbox's uid), a fresh Jupyter token for this attempt,
    and its command, behind JupyterLab when the spec asks for it."""
    d = proxy_dir(home, w.id)
    d.mkdir(parents=True, exist_ok=True)
    for entry in d.iterdir():
        with contextlib.suppress(OSError):
            entry.unlink()
    os.chmod(d, 0o700)
    if owner is not None and os.geteuid() == 0:
        os.chown(d, owner, owner)
    token = new_secret()
    fd = os.open(log_dir / TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    env = {"JUPYTER_TOKEN": token, "SUANLI_PROXY_DIR": SANDBOX_DIR if sandboxed else str(d)}
    if spec.jupyter:
        command = f"{JUPYTER_BACKGROUND}\n{command}"
    return InstanceAccess(env, (str(d), SANDBOX_DIR, True) if sandboxed else None, command)


# ---- tickets and sessions -----------------------------------------------------------------------------------------
def _role(s: Session, user_id: str, org_id: str) -> str | None:
    return s.scalar(select(Membership.role).where(Membership.user_id == user_id, Membership.org_id == org_id))


def instance_host_label(workload_id: str) -> str:
    """The DNS label of a workload's own origin: `wl-0123…` (no underscore, which hostnames and certificates
    refuse)."""
    return workload_id.replace("_", "-")


def workload_of_host_label(label: str) -> str | None:
    if not re.fullmatch(r"wl-[0-9a-f]{16}", label):
        return None
    return label.replace("-", "_", 1)


def origin_of(proxy_url: str | None, workload_id: str) -> str:
    """Where a workload's pages are served: its own origin under `proxy_url`, or '' (this server's origin)."""
    return proxy_url.replace("{id}", instance_host_label(workload_id)) if proxy_url else ""


def target_of(spec: WorkloadSpec, port: int | None) -> str:
    """`lab`, or `port:N` for a port the spec lists; a port it does not list is refused naming it."""
    if port is None:
        return "lab"
    if port not in spec.ports:
        listed = ", ".join(map(str, spec.ports)) or "none"
        raise Invalid(f"port: {port} is not one of the workload's ports ({listed}); add it to `ports:` in its spec")
    return f"port:{port}"


def open_ticket(
    s: Session, who: Principal, ref: str, port: int | None, now: datetime
) -> tuple[Workload, str, str, datetime]:
    """A single-use ticket for the caller into a running workload of one of their orgs: (the workload, the
    ticket, where it leads, when it expires). JupyterLab is for instances; ports for any workload that lists them."""
    w = workloads.get(s, who, ref)
    role = _role(s, who.user_id, w.org_id)
    if role is None:
        raise NotFound(f"workload {ref} not found")  # operators get no way in, as over SSH
    if role not in memberships.ENTER:
        raise Forbidden(f"{w.name}: a {role} of its organisation cannot open its instances (viewers read only)")
    spec = workloads.spec_of(w)
    target = target_of(spec, port)
    if target == "lab" and spec.kind != "instance":
        raise Invalid(f"{w.name} is a job: JupyterLab runs in instances (kind: instance)")
    if w.state != "running":
        raise Conflict(f"{w.name} is {w.state}; it can be opened once it runs")
    if w.executor != "local":
        raise Conflict(f"{w.name} runs on {w.executor} nodes; the proxy reaches workloads on this server's host")
    s.execute(delete(ProxySession).where(ProxySession.expires_at < now))
    ticket, expires = new_secret(), now + timedelta(seconds=TICKET_S)
    s.add(ProxySession(id=token_hash(ticket), kind="ticket", user_id=who.user_id, workload_id=w.id, target=target,
                       created_at=now, expires_at=expires, token_id=who.token_id))  # fmt: skip
    return w, ticket, target, expires


def redeem(s: Session, workload_id: str, ticket: str, now: datetime) -> tuple[str, str, datetime]:
    """Trade a ticket for a session: (the session secret, where the ticket leads, when the session ends). A ticket
    works once, within its minute, for the workload it was issued for."""
    key = token_hash(ticket)
    done = s.execute(
        update(ProxySession)
        .where(ProxySession.id == key, ProxySession.kind == "ticket", ProxySession.used_at.is_(None),
               ProxySession.workload_id == workload_id, ProxySession.expires_at >= now)
        .values(used_at=now)
    )  # fmt: skip
    if done.rowcount != 1:
        raise Forbidden("this link has expired or was used already; open the instance again (suanli jupyter NAME)")
    row = s.get(ProxySession, key)
    assert row is not None
    secret = new_secret()
    ends = now + timedelta(seconds=SESSION_S)
    token = s.get(ApiToken, row.token_id) if row.token_id else None
    if token is not None and token.expires_at is not None:
        ends = min(ends, token.expires_at)  # a session outlives no token that asked for it
    s.add(ProxySession(id=token_hash(secret), kind="session", user_id=row.user_id, workload_id=workload_id,
                       target=row.target, created_at=now, expires_at=ends, token_id=row.token_id))  # fmt: skip
    return secret, row.target, ends


@dataclass(frozen=True)
class Grant:
    """A live session of `user_id` into `workload_id`, valid until `expires_at` (re-checked after `checked_at`)."""

    user_id: str
    workload_id: str
    expires_at: datetime


def session(s: Session, workload_id: str, secret: str, now: datetime) -> Grant:
    """The session a cookie holds, if it is one for this workload, unexpired, of a user still in its org."""
    row = s.get(ProxySession, token_hash(secret))
    w = s.get(Workload, workload_id)
    if row is None or row.kind != "session" or row.workload_id != workload_id or row.expires_at < now or w is None:
        raise Forbidden("not signed in to this instance; open it with `suanli jupyter NAME` or `suanli open NAME PORT`")
    if _role(s, row.user_id, w.org_id) not in memberships.ENTER:
        raise Forbidden("you are no longer a member of this instance's org (or only a viewer)")
    if row.token_id is not None:
        token = s.get(ApiToken, row.token_id)
        if token is None or token.revoked_at is not None or (token.expires_at is not None and token.expires_at < now):
            raise Forbidden("the token that opened this session was revoked or expired; open the instance again")
    return Grant(row.user_id, workload_id, row.expires_at)


# ---- where the instance is ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Upstream:
    """How to reach a running workload's service: JupyterLab's socket and token, or a loopback port of its
    sandbox (`sandbox_file` names the sandbox that must hold the listening socket; None when unsandboxed)."""

    name: str
    socket: Path | None = None
    token: str = ""
    port: int | None = None
    sandbox_file: Path | None = None


def upstream(s: Session, home: Path, workload_id: str, target: str) -> Upstream:
    """Where `lab` or `port:N` of a workload is now; Conflict when it is not running."""
    w = s.get(Workload, workload_id)
    if w is None:
        raise NotFound("this instance no longer exists")
    if w.state != "running" or not w.handle:
        raise Conflict(f"{w.name} is {w.state}")
    if w.executor != "local":  # an attempt placed there since a session was opened here
        raise Conflict(f"{w.name} runs on {w.executor} nodes; the proxy reaches workloads on this server's host")
    if target == "lab":
        try:
            token = (workdirs.log_dir(home, w.id, w.attempt) / TOKEN_FILE).read_text().strip()
        except OSError:
            raise Conflict(f"{w.name} was started before JupyterLab was available; stop and start it") from None
        return Upstream(w.name, socket=proxy_dir(home, w.id) / SOCKET, token=token)
    port = int(target.split(":", 1)[1])
    if port not in workloads.spec_of(w).ports:
        raise NotFound(f"port {port} is not one of {w.name}'s ports")
    rank0 = next((r for r in w.handle.get("ranks", []) if int(r.get("node_rank", -1)) == 0), {})
    box = rank0.get("sandbox_file")
    return Upstream(w.name, port=port, sandbox_file=Path(box) if box else None)


def jupyter_log(home: Path, workload_id: str, lines: int = 5) -> str:
    """The last lines JupyterLab wrote when started on demand (why it is not answering), or ''.

    The proxy directory is the tenant's: the log may be a symlink (to /etc/shadow, the server's environment), a
    FIFO (blocking whoever opens it) or endless (/dev/zero). So it is opened without following links and without
    blocking, read only if it is a regular file of the directory's owner, and only its last `LOG_TAIL_BYTES`."""
    d = proxy_dir(home, workload_id)
    try:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        owner = os.fstat(dfd).st_uid
        fd = os.open(JUPYTER_LOG, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        os.close(dfd)
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner:
            return ""
        start = max(0, st.st_size - LOG_TAIL_BYTES)
        text = os.pread(fd, LOG_TAIL_BYTES, start).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)
        os.close(dfd)
    return "\n".join(text.strip().splitlines()[-lines:])


def start_command() -> list[str]:
    """What runs inside a live sandbox to start JupyterLab on demand (`suanli jupyter` on an instance without
    `jupyter: true`): detached, so it lives as long as the instance, not as long as this request."""
    return ["/bin/sh", "-c", f"cd /workspace 2>/dev/null; {JUPYTER_BACKGROUND}"]


def ensure_jupyter(home: Path, w: Workload) -> bool:
    """Start JupyterLab inside a running instance that was not started with `jupyter: true`; whether it was started
    now. Once started it is not started again (the proxy's 503 page shows its log instead); a start that failed
    may be tried again."""
    if workloads.spec_of(w).jupyter:
        return False
    # Marked in the attempt's log directory (the server's), not by the log in the tenant's directory: deleting
    # that must not start another JupyterLab on every request.
    marker = workdirs.log_dir(home, w.id, w.attempt) / STARTED_FILE
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    if not _starting.acquire(blocking=False):  # whatever a start waits on, the route threads left are for others
        marker.unlink(missing_ok=True)
        raise Unavailable(
            "JupyterLab is being started in other instances on this server; try again in a few seconds", 5
        )
    try:
        _start_jupyter(w)
    except BaseException:
        marker.unlink(missing_ok=True)
        raise
    finally:
        _starting.release()
    return True


def _start_jupyter(w: Workload) -> None:
    ex = executor(w.executor)
    enter = getattr(ex, "enter_argv", None)
    if enter is None or not w.handle:
        raise Conflict(f"{w.name} runs on {w.executor} nodes, where JupyterLab cannot be started")
    deadline = time.monotonic() + SANDBOX_WAIT_S
    while True:
        try:
            argv = enter(dict(w.handle), 0, start_command())
            break
        except NotRunning as e:  # just launched: its sandbox may still be coming up
            if time.monotonic() > deadline:
                raise Conflict(f"{w.name}: {e}") from None
            time.sleep(0.2)
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Conflict(f"could not start JupyterLab in {w.name}: {e}") from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip()[-300:]
        raise Conflict(f"could not start JupyterLab in {w.name}: {why or f'exit code {done.returncode}'}")
