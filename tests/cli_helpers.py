"""Running the `suanli` Typer app in-process for tests."""

from __future__ import annotations

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
