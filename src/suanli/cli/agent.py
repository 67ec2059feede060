"""`suanli agent`: the node agent an operator runs on each GPU server of a Ray or Slurm cluster."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Annotated

import typer

from suanli.cli import credentials as cred
from suanli.cli.common import console
from suanli.cli.credentials import ServerOpt


def agent(
    node: Annotated[str, typer.Option("--node", help="This node's name in suanli (`suanli admin nodes`).")],
    token: Annotated[
        str | None, typer.Option("--token", envvar="SUANLI_TOKEN", help="An operator's API token.")
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
