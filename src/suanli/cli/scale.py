"""`suanli scale REF --gpus N`: resize running elastic work (registered with the workload commands)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from suanli.cli import credentials as cred
from suanli.cli.common import console
from suanli.cli.credentials import ServerOpt

RefArg = Annotated[str, typer.Argument(metavar="REF", help="Workload id (wl_…) or name (the newest of that name).")]


def scale(
    ref: RefArg,
    gpus: Annotated[int, typer.Option("--gpus", min=1, metavar="N", help="GPUs to run on, within its {min, max}.")],
    server: ServerOpt = None,
) -> None:
    """Resize running elastic work: the next scheduling pass shrinks it onto N of its GPUs or places the extra ones
    (topology-aware; it waits, saying why in `suanli describe`, until they are free). Its ranks restart with the new
    world size and SUANLI_RESTART_REASON=resize; it is billed at the new size from then, and stays at that size."""
    with cred.api(server) as c:
        w = c.scale(ref, gpus)
    now = w.allocation.gpus if w.allocation is not None else w.gpus
    console.print(f"{w.id} ({escape(w.name)}) runs on {now} GPUs; scaling to {gpus}: the next scheduling pass "
                  "restarts its ranks on the new GPUs (see suanli describe)")  # fmt: skip
