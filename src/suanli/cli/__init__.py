"""The `suanli` command line: thin Typer/Rich front ends over the pure core packages.

Every command accepts `--json` and then prints exactly one JSON document on stdout; bad input is reported
as one line on stderr with exit code 2.
"""
