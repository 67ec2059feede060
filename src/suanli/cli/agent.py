"""`suanli agent`: the node agent an operator runs on each GPU server of a Ray or Slurm cluster, and `suanli admin
agent-tokens`: the tokens it runs with, each posting one node's samples and opening nothing else."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Annotated

import typer
from rich.table import Table

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, console, emit_json
from suanli.cli.credentials import ServerOpt, when
from suanli.cli.terminal import shown


def agent(
    node: Annotated[str, typer.Option("--node", help="This node's name in suanli (`suanli admin nodes`).")],
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="SUANLI_TOKEN",
            help="This node's agent token ('suanli admin agent-tokens create NODE'), or an operator's.",
        ),
    ] = None,
    interval: Annotated[float, typer.Option("--interval", min=0.5, max=3600, help="Seconds between readings.")] = 5.0,
    once: Annotated[bool, typer.Option("--once", help="Read and send once, then exit.")] = False,
    server: ServerOpt = None,
) -> None:
    """Read this node's GPUs through NVML every INTERVAL seconds and post them to the server (samples and the
    node's heartbeat: health rules drain a node that goes silent). Stops on SIGTERM or Ctrl-C."""
    from suanli.client import Client
    from suanli.telemetry.agent import AgentLoop
    from suanli.telemetry.nvml_sampler import NvmlSampler

    sampler = NvmlSampler(node)
    with Client(cred.resolve(server), token or cred.token_for(cred.resolve(server))) as c:
        loop = AgentLoop(sampler, c.post_samples, interval_s=interval)
        stop = threading.Event()
        # SIGTERM acts as Ctrl-C (KeyboardInterrupt, suppressed below): a handler calling stop.set() could take the
        # Event's lock while this same thread held it inside stop.wait, and deadlock (as the loop process's did).
        signal.signal(signal.SIGTERM, _interrupt_once)
        with contextlib.suppress(KeyboardInterrupt):
            console.print(f"agent for {node}: a reading every {interval:g} s; stop with Ctrl-C or SIGTERM")
            loop.run(stop, ticks=1 if once else None)
    if sampler.disabled_reason:
        console.print(f"[yellow]no GPU readings on {node}: NVML {sampler.disabled_reason}[/yellow]")
    console.print(f"sent {loop.sent} samples" + (f" ({loop.failures} failed tries)" if loop.failures else ""))


def _interrupt_once(signum: int, frame: object) -> None:
    """The first SIGTERM stops the agent as Ctrl-C does; a second one, during its shutdown, ends it at once (rather
    than raising KeyboardInterrupt out of the shutdown and exiting 130)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)


agent_tokens_app = typer.Typer(
    no_args_is_help=True, help="Node agents' tokens: each posts one node's GPU samples and opens nothing else."
)


@agent_tokens_app.command("create")
def agent_token_create(
    node: Annotated[str, typer.Argument(metavar="NODE", help="The node's name ('suanli admin nodes').")],
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """A token for 'suanli agent --node NODE' on that node, shown once. Put it there instead of an operator's
    token: whoever escaped a sandbox on the node could then post its samples, nothing more."""
    with cred.api(server) as c:
        out = c.agent_token_create(node)
    if json_out:
        emit_json(out)
        return
    console.print(f"agent token {out['id']} for {shown(out['node'])} (shown once):\n{out['token']}")
    console.print(f"on that node: suanli agent --node {shown(out['node'])} --token <token>")


@agent_tokens_app.command("ls")
def agent_token_list(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Every agent token (never the token itself)."""
    with cred.api(server) as c:
        rows = c.agent_tokens()
    if json_out:
        emit_json(rows)
        return
    table = Table(title="agent tokens")
    for col in ("id", "node", "starts", "created", "revoked"):
        table.add_column(col)
    for t in rows:
        table.add_row(t["id"], shown(t["node"]), t["prefix"] + "…", when(t["created_at"]), when(t["revoked_at"]))
    console.print(table)


@agent_tokens_app.command("revoke")
def agent_token_revoke(
    token_id: Annotated[str, typer.Argument(metavar="ID", help="The token's id ('suanli admin agent-tokens ls').")],
    server: ServerOpt = None,
) -> None:
    """Refuse the samples posted with it from now on."""
    with cred.api(server) as c:
        out = c.agent_token_revoke(token_id)
    console.print(f"revoked agent token {out['id']} of {shown(out['node'])}")
