"""`suanli admin …`: operator commands (users and invite codes, money, quotas, clusters and nodes, ledger checks), with
the price book's in `suanli.cli.admin_prices` and the GPU telemetry commands of `suanli.cli.telemetry` (top, events,
fault, node-metrics).

All go through the API with an admin login, except `create-user` and `set-password` (`suanli.cli.admin_users`),
which open the database directly: that is how the first admin is made, before anyone can log in, and how an
operator who forgot their password gets back in.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
import yaml
from rich.table import Table
from rich.text import Text

from suanli.cli import admin_users, telemetry
from suanli.cli import credentials as cred
from suanli.cli.admin_invites import invites_app
from suanli.cli.admin_prices import prices_app
from suanli.cli.agent import agent_tokens_app
from suanli.cli.common import JsonOpt, check_choice, console, emit_json, fail
from suanli.cli.credentials import ServerOpt, jsonable, money, when
from suanli.cli.credit import codes_app
from suanli.cli.hub import admin_app as hub_admin_app
from suanli.cli.terminal import shown
from suanli.cli.workload_views import span

if TYPE_CHECKING:  # the client (httpx) is imported when a command runs
    from suanli.client import Node

app = typer.Typer(
    no_args_is_help=True, help="Operator commands (an admin login; create-user and set-password need none)."
)
app.add_typer(invites_app, name="invites")
app.add_typer(codes_app, name="codes")
app.add_typer(hub_admin_app, name="hub")
app.add_typer(prices_app, name="prices")
app.add_typer(agent_tokens_app, name="agent-tokens")
app.command("create-user")(admin_users.create_user)
app.command("set-password")(admin_users.set_password)
OrgArg = Annotated[str, typer.Argument(metavar="ORG", help="Organisation id or name (a personal org: the email).")]
NodeArg = Annotated[str, typer.Argument(metavar="NODE", help="Node name or id.")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why (shown in 'suanli admin nodes').")]
MemoOpt = Annotated[str, typer.Option("--memo", help="A note kept with the transaction.")]
KeyOpt = Annotated[
    str | None, typer.Option("--key", help="Idempotency key: a retry with the same key posts nothing twice.")
]


# ---- users and orgs -----------------------------------------------------------------------------------------
@app.command("users")
def users(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Every user."""
    with cred.api(server) as c:
        rows = c.admin_users()
    if json_out:
        emit_json(jsonable(rows))
        return
    table = Table(title="users")
    for col in ("email", "id", "admin", "personal org", "created"):
        table.add_column(col)
    for u in rows:
        table.add_row(shown(u.email), u.id, "yes" if u.is_admin else "", u.personal_org_id, when(u.created_at))
    console.print(table)


@app.command("orgs")
def orgs(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Every organisation, with its quotas."""
    from suanli.cli.orgs import orgs_table

    with cred.api(server) as c:
        rows = c.admin_orgs()
    if json_out:
        emit_json(jsonable(rows))
        return
    console.print(orgs_table(rows, "organisations (all)"))


def _move(org: str, amount: str, kind: str, memo: str, key: str | None, server: str | None, json_out: bool) -> None:
    value = cred.parse_amount(amount)
    if value == 0:
        fail(f"invalid AMOUNT {amount!r}: must be more than 0")
    with cred.api(server) as c:
        t = c.admin_move(org, value, kind=kind, memo=memo, key=key)
    if json_out:
        emit_json(jsonable(t))
        return
    console.print(f"{kind} {org}: {money(t.amount)} (transaction {t.id}, key {t.key})")


@app.command("topup")
def topup(
    org: OrgArg,
    amount: Annotated[str, typer.Argument(help="Amount paid in, e.g. 100 or 12.50.")],
    memo: MemoOpt = "",
    key: KeyOpt = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Add money paid in to an organisation's balance."""
    _move(org, amount, "topup", memo, key, server, json_out)


@app.command("credit")
def credit(
    org: OrgArg,
    amount: Annotated[str, typer.Argument(help="Amount, e.g. 20.")],
    refund: Annotated[bool, typer.Option("--refund", help="Book it as a refund rather than goodwill credit.")] = False,
    memo: MemoOpt = "",
    key: KeyOpt = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Give an organisation credit (goodwill) or a refund."""
    _move(org, amount, "refund" if refund else "credit", memo, key, server, json_out)


quotas_app = typer.Typer(
    no_args_is_help=True, help="Quotas: the most GPUs, host CPU cores and memory an organisation holds at once."
)
app.add_typer(quotas_app, name="quotas")
QUOTA_MAX = {"GPUS": 1_000_000, "--cpus": 100_000_000, "--memory-gib": 1_000_000_000}  # as the API bounds them


def _limit(text: str, what: str) -> int | None:
    """A whole number >= 0, or None for 'none' (no limit)."""
    if text.strip().lower() == "none":
        return None
    try:
        limit = int(text)
    except ValueError:
        limit = -1
    if not 0 <= limit <= QUOTA_MAX[what]:
        fail(f"invalid {what} {text!r}: a whole number from 0 to {QUOTA_MAX[what]:,}, or 'none'")
    return limit


def _quota(value: int | None, unit: str = "") -> str:
    return "none" if value is None else f"{value}{unit}"


@quotas_app.command("set")
def quota_set(
    org: OrgArg,
    gpus: Annotated[
        str | None, typer.Argument(metavar="[GPUS|none]", help="GPU count, or 'none' for no limit.")
    ] = None,
    cpus: Annotated[str | None, typer.Option("--cpus", help="Host CPU cores, or 'none' for no limit.")] = None,
    memory_gib: Annotated[
        str | None, typer.Option("--memory-gib", help="Host memory in GiB, or 'none' for no limit.")
    ] = None,
    server: ServerOpt = None,
) -> None:
    """Limit the GPUs, host CPU cores and memory an organisation holds at once (or lift a limit); only the quotas
    given change."""
    limits: dict[str, int | None] = {}
    for key, text, what in (("gpus", gpus, "GPUS"), ("cpus", cpus, "--cpus"), ("memory_gib", memory_gib,
                                                                                  "--memory-gib")):  # fmt: skip
        if text is not None:
            limits[key] = _limit(text, what)
    if not limits:
        fail("give GPUS, --cpus or --memory-gib")
    with cred.api(server) as c:
        o = c.admin_set_quota(org, **limits)
    console.print(f"{shown(o.name)}: GPU quota {_quota(o.quota_gpus)}, CPU quota {_quota(o.quota_cpus, ' cores')}, "
                  f"memory quota {_quota(o.quota_memory_gib, ' GiB')}")  # fmt: skip


@app.command("ledger-check")
def ledger_check(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Recompute every balance from its entries; exit 1 if any stored balance disagrees."""
    with cred.api(server) as c:
        check = c.admin_ledger_check()
    if json_out:
        emit_json(jsonable(check))
    elif check.ok:
        console.print("ledger ok: every balance matches its entries")
    else:
        table = Table(title="ledger mismatches")
        for col in ("account", "stored", "recomputed"):
            table.add_column(col, justify="left" if col == "account" else "right")
        for acct, pair in sorted(check.mismatches.items()):
            table.add_row(acct, *(str(v) for v in pair))
        console.print(table)
    if not check.ok:
        raise typer.Exit(1)


# ---- clusters and nodes -------------------------------------------------------------------------------------
@app.command("clusters")
def clusters(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Registered clusters."""
    with cred.api(server) as c:
        rows = c.admin_clusters()
    if json_out:
        emit_json(jsonable(rows))
        return
    table = Table(title="clusters")
    for col in ("name", "id", "source", "nodes", "GPUs", "registered"):
        table.add_column(col, justify="right" if col in ("nodes", "GPUs") else "left")
    for r in rows:
        table.add_row(r.name, r.id, r.source, f"{r.nodes:,}", f"{r.gpus:,}", when(r.created_at))
    console.print(table)


@app.command("register")
def register(
    preset: Annotated[str | None, typer.Option("--preset", help="Topology preset or NxG[:MODEL] (virtual).")] = None,
    spec: Annotated[Path | None, typer.Option("--spec", metavar="FILE.yaml", help="Cluster spec (virtual).")] = None,
    local: Annotated[bool, typer.Option("--local", help="The server's own host, discovered through NVML.")] = False,
    name: Annotated[str | None, typer.Option("--name", help="Cluster name (default: the spec's).")] = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Register nodes: a preset or a spec file (virtual nodes), or the server's host (--local)."""
    if sum([preset is not None, spec is not None, local]) != 1:
        fail("give exactly one of --preset, --spec and --local")
    doc = None
    if spec is not None:
        try:
            doc = yaml.safe_load(spec.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as e:
            fail(f"--spec {spec}: {' '.join(str(e).split())}")
        if not isinstance(doc, dict):
            fail(f"--spec {spec}: expected a cluster spec mapping (name, node_groups, fabric, …)")
    with cred.api(server) as c:
        row = c.admin_register_cluster(preset=preset, spec=doc, local=local, name=name)
    if json_out:
        emit_json(jsonable(row))
        return
    console.print(f"registered {row.name} ({row.id}): {row.nodes:,} nodes, {row.gpus:,} GPUs")


@app.command("remove-cluster")
def remove_cluster(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Cluster name or id.")], server: ServerOpt = None
) -> None:
    """Remove a cluster and its nodes from the inventory (refused while work holds its GPUs)."""
    with cred.api(server) as c:
        c.admin_remove_cluster(name)
    console.print(f"removed cluster {name}")


@app.command("nodes")
def nodes(
    state: Annotated[str | None, typer.Option("--state", help="ready|draining|down.")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="Cluster name or id.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="Most nodes to list.")] = 1000,
    offset: Annotated[int, typer.Option("--offset", help="Skip this many first.")] = 0,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Nodes in the inventory (by cluster, in order)."""
    if state is not None:
        state = check_choice(state, ("ready", "draining", "down"), "--state")
    with cred.api(server) as c:
        rows = c.admin_nodes(state=state, cluster=cluster, limit=limit, offset=offset)
    if json_out:
        emit_json(jsonable(rows))
        return
    table = Table(title=f"nodes ({len(rows):,})")
    for col in ("name", "kind", "state", "health", "last seen", "GPU", "GPUs", "NVLink domain", "leaf", "reason"):
        table.add_column(col, justify="right" if col in ("GPUs", "NVLink domain", "leaf", "last seen") else "left")
    for n in rows:
        table.add_row(n.name, n.kind, n.state, _node_health(n), _seen(n.last_seen_at), n.gpu_model or "-",
                      str(n.gpu_count), str(n.nvlink_domain), str(n.leaf), n.state_reason)  # fmt: skip
    console.print(table)


def _node_health(n: Node) -> Text:
    if n.unhealthy_gpus:
        return Text(f"{n.unhealthy_gpus} GPU{'s' if n.unhealthy_gpus != 1 else ''} unhealthy", style="bold red")
    return Text("ok", style="green")


def _seen(at: datetime | None) -> str:
    """How long ago the node's GPUs last reported ('never': no sample yet)."""
    if at is None:
        return "never"
    at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return f"{span((datetime.now(UTC) - at).total_seconds())} ago"


@app.command("node")
def node(name: NodeArg, server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """One node and its GPUs."""
    with cred.api(server) as c:
        n = c.admin_node(name)
    if json_out:
        emit_json(jsonable(n))
        return
    reason = f" ({n.state_reason})" if n.state_reason else ""
    console.print(f"[bold]{n.name}[/] ({n.id}), {n.kind}, {n.state}{reason}")
    console.print(f"cluster {n.cluster_id}; NVLink domain {n.nvlink_domain}, leaf {n.leaf}, spine {n.spine}")
    table = Table(title=f"{n.gpu_count} x {n.gpu_model or 'no GPU'}")
    for col in ("index", "model", "memory", "MIG", "health", "uuid"):
        table.add_column(col, no_wrap=col != "health")
    for g in n.gpus:
        health = Text("ok", style="green") if g.healthy else Text(f"✗ {g.health_reason or 'unhealthy'}", "bold red")
        table.add_row(str(g.index), g.model, f"{g.memory_mib:,} MiB", "on" if g.mig_mode else "", health, g.uuid)
    console.print(table)
    if n.unhealthy_gpus:
        console.print(f"repair (after fixing the hardware): suanli admin undrain {n.name}")


def _set_state(name: str, state: str, reason: str, server: str | None) -> None:
    with cred.api(server) as c:
        n = c.admin_set_node_state(name, state, reason)
    console.print(f"{n.name}: {n.state}" + (f" ({n.state_reason})" if n.state_reason else ""))


@app.command("drain")
def drain(name: NodeArg, reason: ReasonOpt = "", server: ServerOpt = None) -> None:
    """Drain a node: running work finishes, nothing new is placed on it."""
    _set_state(name, "draining", reason, server)


@app.command("undrain")
def undrain(name: NodeArg, server: ServerOpt = None) -> None:
    """Put a drained or down node back in service."""
    _set_state(name, "ready", "", server)


@app.command("down")
def down(name: NodeArg, reason: ReasonOpt = "", server: ServerOpt = None) -> None:
    """Take a node out of service: it no longer counts as capacity, and its work stops as a node failure."""
    _set_state(name, "down", reason, server)


# ---- telemetry: top, events, fault, node-metrics ------------------------------------------------------------
telemetry.register_admin(app)
