"""`suanli deploy NAME --model HUB_NAME|vol:VOLUME/PATH …`, `suanli endpoints ls/describe/scale/rm/usage/keys` and
`suanli keys create --endpoint NAME` / `suanli keys revoke ID`: models served as OpenAI-compatible endpoints."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, console, emit_json, fail, user_errors
from suanli.cli.credentials import PasswordStdinOpt, ServerOpt, jsonable, org_id, when
from suanli.cli.ssh import keys_app

app = typer.Typer(no_args_is_help=True, help="Endpoints: hub models served with the OpenAI API at SERVER/v1.")
RefArg = Annotated[str, typer.Argument(metavar="NAME", help="Endpoint name or id (ep_…).")]


def deploy(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The endpoint's name: clients send it as `model`.")],
    model: Annotated[
        str, typer.Option("--model", metavar="HUB_NAME", help="A hub model, or vol:VOLUME[@N]/PATH (a checkpoint).")
    ],
    gpu: Annotated[str, typer.Option("--gpu", metavar="MODEL", help="GPU model of each replica, or 'any'.")] = "any",
    gpus: Annotated[int, typer.Option("--gpus", min=0, max=64, help="GPUs per replica (tensor parallel); 0: CPU.")] = 1,
    replicas: Annotated[
        int | None, typer.Option("--replicas", min=0, max=16, help="A fixed replica count (default 1).")
    ] = None,
    min_replicas: Annotated[
        int | None, typer.Option("--min-replicas", min=0, max=16, help="Autoscale from this many (0: to zero).")
    ] = None,
    max_replicas: Annotated[int | None, typer.Option("--max-replicas", min=1, max=16, help="…up to this many.")] = None,
    target: Annotated[
        int | None, typer.Option("--target", min=1, max=1024, help="Concurrent requests per replica to aim at.")
    ] = None,
    runtime: Annotated[
        str | None, typer.Option("--runtime", help="vllm (default on GPUs) or transformers (default on CPU).")
    ] = None,
    max_model_len: Annotated[int | None, typer.Option("--max-model-len", min=16, help="Context length (vLLM).")] = None,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Serve a hub model as an OpenAI-compatible endpoint: its replicas are workloads (placed, billed per second,
    retried like any); a replica takes requests once its runtime answers its health probe. A spec file of
    `kind: service` does the same with `suanli run FILE`."""
    doc: dict[str, Any] = {"name": name, "kind": "service", "model": model,
                           "resources": {"gpu": gpu, "gpus": gpus}}  # fmt: skip
    auto = {k: v for k, v in (("min_replicas", min_replicas), ("max_replicas", max_replicas), ("target", target))
            if v is not None}  # fmt: skip
    if auto and replicas is not None:
        fail("give --replicas (a fixed count) or --min-replicas/--max-replicas/--target (autoscaling), not both")
    if auto:
        doc["autoscale"] = auto
    elif replicas is not None:
        doc["replicas"] = replicas
    for key, value in (("runtime", runtime), ("max_model_len", max_model_len)):
        if value is not None:
            doc[key] = value
    deploy_spec(doc, None, server, json_out)


def deploy_spec(spec: dict[str, Any] | str, org: str | None, server: str | None, json_out: bool) -> None:
    with cred.api(server) as c, user_errors():
        e = c.deploy(spec, org_id(c, org) if org else None)
    if json_out:
        emit_json(jsonable(e))
        return
    console.print(f"deployed [bold]{e.id}[/] ({escape(e.name)}): {e.model} on {e.runtime}, {e.desired} replica(s) "
                  f"wanted; follow it: suanli endpoints describe {escape(e.name)}")  # fmt: skip
    console.print(f"a key: suanli keys create --endpoint {escape(e.name)}; then base_url={c.server}/v1, "
                  f"model={escape(e.name)}")  # fmt: skip


@app.command("ls")
def ls(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Your orgs' endpoints: replicas ready of wanted, and the bounds."""
    with cred.api(server) as c:
        rows = c.endpoints()
    if json_out:
        emit_json(jsonable(rows))
        return
    table = Table(title="endpoints")
    for col in ("name", "id", "model", "runtime", "GPUs/replica", "ready/wanted", "min-max"):
        table.add_column(col)
    for e in rows:
        table.add_row(escape(e.name), e.id, e.model, e.runtime, f"{e.gpus} {e.gpu or ''}".strip(),
                      f"{e.ready}/{e.desired}", f"{e.min_replicas}-{e.max_replicas}")  # fmt: skip
    console.print(table)


@app.command("describe")
def describe(ref: RefArg, server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """An endpoint's replicas (workloads: `suanli describe` them) and its events: every autoscaling decision."""
    with cred.api(server) as c:
        e = c.endpoint(ref)
    if json_out:
        emit_json(jsonable(e))
        return
    console.print(f"[bold]{escape(e.name)}[/] {e.id}: {e.model} ({e.repo_id}) on {e.runtime}, {e.gpus} GPU(s) per "
                  f"replica; {e.ready} ready of {e.desired} wanted ({e.min_replicas}-{e.max_replicas})")  # fmt: skip
    table = Table(title="replicas")
    for col in ("workload", "name", "state", "ready", "attempt"):
        table.add_column(col)
    for r in e.replicas:
        table.add_row(r.workload_id, escape(r.name), r.state, "yes" if r.ready else "no", str(r.attempt))
    console.print(table)
    for ev in e.events:
        console.print(f"{when(ev.at)}  {ev.kind:8}  {escape(ev.reason)}")


@app.command("scale")
def scale(
    ref: RefArg,
    replicas: Annotated[int, typer.Option("--replicas", min=0, max=16, help="The fixed count (0: to zero).")],
    server: ServerOpt = None,
) -> None:
    """Set a fixed replica count; extras stop (not-ready ones first), new ones are submitted as workloads."""
    with cred.api(server) as c, user_errors():
        e = c.endpoint_scale(ref, replicas)
    console.print(f"{escape(e.name)}: {e.desired} replica(s) wanted")


@app.command("rm")
def rm(ref: RefArg, server: ServerOpt = None) -> None:
    """Stop every replica and delete the endpoint and its keys."""
    with cred.api(server) as c, user_errors():
        e = c.endpoint_remove(ref)
    console.print(f"removed {e.id} ({escape(e.name)}); its replicas are stopping")


@app.command("usage")
def usage(ref: RefArg, server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Requests and tokens per key per minute, newest first."""
    with cred.api(server) as c:
        rows = c.endpoint_usage(ref)
    if json_out:
        emit_json(jsonable(rows))
        return
    table = Table(title=f"usage of {escape(ref)}")
    for col in ("minute (UTC)", "key", "requests", "prompt tokens", "completion tokens"):
        table.add_column(col)
    for u in rows:
        table.add_row(when(u.minute), u.key_id, str(u.requests), str(u.prompt_tokens), str(u.completion_tokens))
    console.print(table)


@app.command("keys")
def keys(ref: RefArg, server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """The endpoint's API keys (their prefixes; a key is shown only when created)."""
    with cred.api(server) as c:
        rows = c.endpoint_keys(ref)
    if json_out:
        emit_json(jsonable(rows))
        return
    table = Table(title=f"keys of {escape(ref)}")
    for col in ("id", "name", "prefix", "created", "revoked"):
        table.add_column(col)
    for k in rows:
        table.add_row(
            k.id, escape(k.name), k.prefix + "…", when(k.created_at), when(k.revoked_at) if k.revoked_at else ""
        )
    console.print(table)


@keys_app.command("create")
def keys_create(
    endpoint: Annotated[str, typer.Option("--endpoint", metavar="NAME", help="The endpoint the key opens.")],
    name: Annotated[str, typer.Option("--name", help="A name to recognise it by.")] = "default",
    password_stdin: PasswordStdinOpt = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """An API key for an endpoint (shown once; only its SHA-256 is kept): `Authorization: Bearer KEY` at SERVER/v1.
    A key never expires, so unless you are logged in with a token that never does, it needs your password: from
    stdin (--password-stdin), else asked."""
    with cred.api(server) as c, user_errors():
        k = cred.with_password(lambda pw: c.endpoint_key_create(endpoint, name, pw), password_stdin)
    if json_out:
        emit_json(jsonable(k))
        return
    console.print(f"{k.id} ({escape(k.name)}) for {escape(endpoint)}; the key (shown once):")
    console.print(k.key or "", markup=False, highlight=False)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(metavar="ID", help="An endpoint key's id (ek_…).")],
    server: ServerOpt = None,
) -> None:
    """Revoke an endpoint key: the gateway refuses it within seconds."""
    with cred.api(server) as c, user_errors():
        k = c.endpoint_key_revoke(key_id)
    console.print(f"revoked {k.id} ({escape(k.name)})")


def register(root: typer.Typer) -> None:
    root.command("deploy")(deploy)
    root.add_typer(app, name="endpoints")


def quote_serve(model: str, rps: str, *, input_len: int, output_len: int, slo_ttft_ms: str, slo_itl_ms: str,
                gpu: str, precision: str | None, spot: bool, server: str | None, json_out: bool) -> None:  # fmt: skip
    """`suanli quote --serve --model M --rps R`: the server checks every number (a 422 naming the field)."""
    options: dict[str, Any] = {"input_len": input_len, "output_len": output_len, "slo_ttft_ms": slo_ttft_ms,
                               "slo_itl_ms": slo_itl_ms, "gpu": gpu, "billing_mode": "spot" if spot else None,
                               "precision": [precision] if precision else None}  # fmt: skip
    with cred.api(server) as c, user_errors():
        q = c.quote_serve(model, rps, **options)
    if json_out:
        emit_json(jsonable(q))
        return
    cur = q.currency
    table = Table(title=f"serving {q.model} at {q.rps} req/s ({q.input_len} in, {q.output_len} out; mean TTFT <= "
                        f"{q.slo_ttft_ms} ms, ITL <= {q.slo_itl_ms} ms), {q.billing_mode}")  # fmt: skip
    for col in ("cluster", "GPU", "replica", "replicas", "GPUs", "TTFT ms", "ITL ms", f"{cur}/h", f"{cur}/1M tokens",
                f"{cur}/1M out", "free now"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("cluster", "GPU", "replica") else "right")
    for o in q.offers:
        table.add_row(
            o.cluster, o.gpu, f"{o.gpus_per_replica} GPU TP{o.tp} PP{o.pp} EP{o.ep} {o.precision}", str(o.replicas),
            str(o.gpus), "-" if o.ttft_ms is None else f"{o.ttft_ms:,.0f}", f"{o.itl_ms:,.1f}",
            f"{o.rate_per_hour:,.2f}", f"{o.per_1m_tokens:,.4f}", f"{o.per_1m_output_tokens:,.4f}",
            "yes" if o.available_now else "no",
        )  # fmt: skip
    console.print(table)
    if q.cannot_meet_slo:
        console.print(f"[red]no replica layout keeps the SLO on:[/red] {escape(', '.join(q.cannot_meet_slo))}")
    if not q.offers:
        raise typer.Exit(1)
