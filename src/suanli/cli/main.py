"""The `suanli` entry point: the root Typer app and its sub-apps (one module per sub-app)."""

from __future__ import annotations

from typing import Annotated

import typer

from suanli import __version__
from suanli.cli import (
    account,
    admin,
    agent,
    credit,
    hub,
    perf,
    server,
    serving,
    sim,
    ssh,
    telemetry,
    topology,
    volumes,
    workloads,
)

app = typer.Typer(
    name="suanli",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    help="suanli (算力): GPU compute leasing with a topology-aware, performance-model-driven scheduler.",
    epilog="Exit codes: 0 done; 2 bad input, or a request the server refused (not logged in, not found, invalid); "
    "1 the server could not be reached or failed, or a workload followed with `run --follow` did not succeed.",
)
app.add_typer(perf.app, name="perf")
app.add_typer(topology.app, name="topology")
app.command("sim")(sim.sim)
app.command("server")(server.server)
app.command("up")(server.up)
account.register(app)
workloads.register(app)
telemetry.register(app)
ssh.register(app)
serving.register(app)
agent.register(app)
app.add_typer(hub.app, name="hub")
app.add_typer(volumes.app, name="volumes")
app.add_typer(admin.app, name="admin")
app.command("redeem")(credit.redeem)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"suanli {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """suanli (算力): GPU compute leasing with a topology-aware, performance-model-driven scheduler."""


if __name__ == "__main__":  # `python -m suanli.cli.main`, as tests start the server
    app()
