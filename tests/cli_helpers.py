"""Running the `suanli` CLI for tests: the Typer app in-process (`invoke`), or `python -m suanli.cli.main` as a
subprocess against a live server (`suanli`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from suanli.cli.main import app


def _runner() -> CliRunner:
    try:  # Click < 8.2 mixes stderr into stdout unless told not to
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:
        return CliRunner()


RUNNER = _runner()


def invoke(args: list[str], code: int = 0) -> Any:
    """Run the CLI; assert its exit code and re-raise an unexpected exception."""
    result = RUNNER.invoke(app, args)
    assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr, result.exception)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def suanli(
    args: list[str], home: Path, server: str, *, stdin: str | None = None, code: int = 0, **env: str
) -> subprocess.CompletedProcess[str]:
    """`suanli …` as a subprocess (no SUANLI_* of ours but `env`); asserts its exit code, and that a failure says why
    in exactly one `error:` line on stderr."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("SUANLI_")}
    full.update(SUANLI_HOME=str(home), SUANLI_SERVER=server, COLUMNS="200", **env)
    p = subprocess.run([sys.executable, "-m", "suanli.cli.main", *args], input=stdin, capture_output=True,
                       text=True, env=full, timeout=120)  # fmt: skip
    assert p.returncode == code, (args, p.returncode, p.stdout, p.stderr)
    if code:
        assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("error: "), p.stderr
    return p


def logged_in(api: Any, email: str, password: str) -> Any:
    """An SDK client of the in-process server (`api`, a TestClient), logged in as `email`."""
    from suanli.client import Client
    from tests.control_plane import InProcess

    c = Client("http://testserver", transport=InProcess(api))
    c.login(email, password)
    return c


def act_as(monkeypatch: Any, c: Any) -> None:
    """The CLI's commands talk to the in-process server as `c` (an SDK client), errors reported as the CLI does."""
    from collections.abc import Iterator
    from contextlib import contextmanager

    from suanli.cli import credentials as cred
    from suanli.client import ApiError

    @contextmanager
    def api(server: str | None, *, auth: bool = True) -> Iterator[Any]:
        try:
            yield c
        except ApiError as e:
            cred.api_fail(e)

    monkeypatch.setattr(cred, "api", api)
