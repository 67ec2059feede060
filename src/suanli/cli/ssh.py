"""`suanli keys …` (your SSH public keys) and `suanli ssh INSTANCE [-- COMMAND]` (the real `ssh`, pointed at the
server's SSH gateway with the right port, login name and host key)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import typer
from rich.table import Table

from suanli.cli import credentials as cred
from suanli.cli.common import JsonOpt, console, emit_json, fail
from suanli.cli.credentials import PasswordStdinOpt, ServerOpt, jsonable, when
from suanli.cli.terminal import shown, visible

keys_app = typer.Typer(
    no_args_is_help=True,
    help="SSH public keys (add, ls, rm): they log in to your orgs' instances. Endpoint API keys (create --endpoint, "
    "revoke).",
)
KNOWN_HOSTS = "ssh_known_hosts"
HOST_KEY = re.compile(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|"
                      r"sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]{16,16384}={0,3}")  # fmt: skip


@keys_app.command("add")
def keys_add(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="A public key file (~/.ssh/id_ed25519.pub).")],
    name: Annotated[
        str | None, typer.Option("--name", help="A name to recognise it by (default: its comment).")
    ] = None,
    password_stdin: PasswordStdinOpt = False,
    server: ServerOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Add an SSH public key (ed25519, ECDSA, or RSA of 2048 bits or more). A key never expires, so unless you are
    logged in with a token that never does, it needs your password: from stdin (--password-stdin), else asked."""
    if not file.name.endswith(".pub") and (file.with_name(file.name + ".pub")).exists():
        fail(f"{file} looks like a private key; give {file}.pub")
    try:
        text = file.read_text(encoding="utf-8")[:65536]
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read {file}: {e}")
    if "PRIVATE KEY" in text:  # refused here, so a private key never leaves this machine
        fail(f"{file} is a private key; give the public one ({file}.pub)")
    with cred.api(server) as c:
        k = cred.with_password(lambda pw: c.ssh_key_add(text, name, pw), password_stdin)
    if json_out:
        emit_json(jsonable(k))
        return
    console.print(f"added {shown(k.id)} ({shown(k.name)}): {shown(k.fingerprint)}")


@keys_app.command("ls")
def keys_ls(server: ServerOpt = None, json_out: JsonOpt = False) -> None:
    """Your SSH public keys."""
    with cred.api(server) as c:
        rows = c.ssh_keys()
    if json_out:
        emit_json(jsonable(rows))
        return
    table = Table(title="SSH keys")
    for col in ("id", "name", "algorithm", "fingerprint", "added"):
        table.add_column(col)
    for k in rows:
        table.add_row(k.id, k.name, k.algorithm, k.fingerprint, when(k.created_at))
    console.print(table)


@keys_app.command("rm")
def keys_rm(
    key: Annotated[str, typer.Argument(metavar="ID", help="Key id (key_…) or fingerprint (SHA256:…).")],
    server: ServerOpt = None,
) -> None:
    """Remove a key: new logins with it are refused (open sessions stay)."""
    with cred.api(server) as c:
        k = c.ssh_key_remove(key)
    console.print(f"removed {shown(k.id)} ({shown(k.name)})")


def ssh_argv(
    url: str, port: int, instance: str, host_key: str | None, known_hosts: Path, extra: list[str], command: list[str]
) -> list[str]:
    """The `ssh` command line: the server URL's host, the gateway's port, the instance as the login name, and the
    host key the server reported pinned in a known_hosts file of our own (so nothing is trusted blindly)."""
    host = urlsplit(url).hostname or "127.0.0.1"
    argv = ["ssh", "-p", str(port)]
    if host_key and not HOST_KEY.fullmatch(host_key):  # a newline would pin keys for other hosts in our file
        fail("the server reported an SSH host key that is not one key ('TYPE BASE64'); not trusting it")
    if host_key:
        entry = f"[{host}]:{port} {host_key}\n"
        lines = known_hosts.read_text().splitlines(keepends=True) if known_hosts.exists() else []
        kept = [ln for ln in lines if not ln.startswith(f"[{host}]:{port} ")]
        if entry not in lines:
            known_hosts.parent.mkdir(parents=True, exist_ok=True)
            known_hosts.write_text("".join([*kept, entry]))
        argv += ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    return [*argv, *extra, f"{instance}@{host}", *(["--", *command] if command else [])]


def ssh(
    instance: Annotated[str, typer.Argument(metavar="INSTANCE", help="Instance name or id (NAME.N: node-rank N).")],
    command: Annotated[
        list[str] | None, typer.Argument(metavar="[-- COMMAND]", help="Run this instead of a shell.")
    ] = None,
    identity: Annotated[Path | None, typer.Option("-i", "--identity", help="Private key file for ssh.")] = None,
    forward: Annotated[
        list[str] | None, typer.Option("-L", "--forward", help="Local forward LPORT:127.0.0.1:PORT (repeatable).")
    ] = None,
    tty: Annotated[bool, typer.Option("-t", "--tty", help="Force a terminal (for a COMMAND that needs one).")] = False,
    print_only: Annotated[bool, typer.Option("--print", help="Print the ssh command instead of running it.")] = False,
    server: ServerOpt = None,
) -> None:
    """Open a shell in a running instance, or run COMMAND in it, with the real `ssh` client."""
    url = cred.resolve(server)
    with cred.api(server) as c:
        info = c.ssh_info()
    if not info.enabled or info.port is None:
        fail(f"{url} runs no SSH gateway (its ssh_port is 0)")
    extra: list[str] = ["-i", str(identity)] if identity else []
    for spec in forward or []:
        extra += ["-L", spec]
    if tty:
        extra.append("-t")
    argv = ssh_argv(url, info.port, instance, info.host_key, cred.home() / KNOWN_HOSTS, extra, command or [])
    if print_only:
        typer.echo(" ".join(argv))
        return
    if shutil.which("ssh") is None:
        fail("the OpenSSH client (ssh) is not installed (Debian/Ubuntu: apt install openssh-client)")
    os.execvp("ssh", argv)


def _open(link_url: str, print_only: bool, what: str) -> None:
    if print_only:
        typer.echo(visible(link_url, keep=""))
        return
    console.print(
        f"{what}: [bold]{shown(link_url)}[/bold]\n(the link works once, within a minute; it signs this browser in)"
    )
    import webbrowser

    with contextlib.suppress(Exception):
        webbrowser.open(link_url)


def jupyter(
    instance: Annotated[str, typer.Argument(metavar="INSTANCE", help="Instance name or id.")],
    print_only: Annotated[bool, typer.Option("--print", help="Print the link only; open no browser.")] = False,
    server: ServerOpt = None,
) -> None:
    """Open a running instance's JupyterLab in the browser (started now if the instance was not started with
    `jupyter: true`). The server proxies it at /i/<id>/lab/; no port of the node is opened."""
    with cred.api(server) as c:
        link = c.open_link(instance)
    what = "JupyterLab is starting" if link.started_jupyter else "JupyterLab"
    _open(link.url, print_only, what)


def open_port(
    workload: Annotated[str, typer.Argument(metavar="WORKLOAD", help="Workload name or id.")],
    port: Annotated[int, typer.Argument(metavar="PORT", help="One of the ports its spec lists (`ports:`).")],
    print_only: Annotated[bool, typer.Option("--print", help="Print the link only; open no browser.")] = False,
    server: ServerOpt = None,
) -> None:
    """Open a service a running workload serves on its loopback (TensorBoard, a demo app) in the browser, through
    the server's proxy at /i/<id>/port/PORT/."""
    with cred.api(server) as c:
        link = c.open_link(workload, port)
    _open(link.url, print_only, f"port {port}")


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
    app.command("ssh")(ssh)
    app.command("jupyter")(jupyter)
    app.command("open")(open_port)
