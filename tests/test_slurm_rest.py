"""The slurmrestd transport without Slurm: addresses, JWT headers over TCP, sbatch options as REST properties,
slurmrestd's errors in its own words, and the setting that turns it on. Against the real slurmrestd: the `[rest]`
tests of tests/test_slurm_executor.py."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from suanli.control.errors import Invalid
from suanli.control.scheduling import engines
from suanli.control.settings import load
from suanli.executors.slurm_api import BatchJob, Component, SlurmError
from suanli.executors.slurm_rest import SlurmREST, site_properties

ME = pwd.getpwuid(os.getuid()).pw_name


def recording(answer: dict[str, Any], status: int = 200) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json={"meta": {}, "errors": [], **answer})

    return httpx.MockTransport(handle), seen


def test_over_tcp_the_jwt_from_slurm_jwt_and_this_user_go_with_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JWT", raising=False)
    with pytest.raises(ValueError, match="SLURM_JWT"):
        SlurmREST("http://slurm-head:6820")
    monkeypatch.setenv("SLURM_JWT", "token-from-scontrol")
    transport, seen = recording({"jobs": []})
    assert SlurmREST("https://slurm-head:6820/", transport=transport).job_records("12") is None
    assert str(seen[0].url) == "https://slurm-head:6820/slurm/v0.0.38/job/12"
    assert (seen[0].headers["X-SLURM-USER-TOKEN"], seen[0].headers["X-SLURM-USER-NAME"]) == ("token-from-scontrol", ME)
    transport, seen = recording({"jobs": []})  # a unix socket: slurmrestd knows the caller from the socket
    SlurmREST("unix:///run/slurmrestd.sock", transport=transport).job_records("12")
    assert "X-SLURM-USER-TOKEN" not in seen[0].headers


@pytest.mark.parametrize("bad", ["slurmrestd:6820", "ftp://host", "unix:", "http://"])
def test_an_address_is_a_unix_socket_or_an_http_url(bad: str) -> None:
    with pytest.raises(ValueError, match="slurmrestd address"):
        SlurmREST(bad)


def test_slurmrestd_errors_come_back_in_its_words() -> None:
    gone = {"description": "Unable to find JobId=7", "error_number": 2017, "error": "Invalid job id specified"}
    transport, _ = recording({"errors": [gone], "jobs": []}, status=500)
    api = SlurmREST("unix:/run/slurmrestd.sock", transport=transport)
    assert api.job_records("7") is None  # a job Slurm does not know
    refused = {"description": 'Unknown key "shoe_size"', "error_number": 9001, "error": "Failure parsing"}
    transport, _ = recording({"errors": [refused]}, status=500)
    api = SlurmREST("unix:/run/slurmrestd.sock", transport=transport)
    job = BatchJob("suanli-w-a1", Path(__file__), Path("/tmp"), "o", "e", (Component(("n1",)),),
                   site_args=("--shoe-size=44",))  # fmt: skip
    with pytest.raises(SlurmError, match=r'Failure parsing: Unknown key "shoe_size" \(HTTP 500\)'):
        api.submit(job)
    assert api.node_records(["n1"]) == []  # best effort, like scontrol's
    api.cancel("7", pending_only=True)  # never raises


@pytest.mark.parametrize(
    ("args", "properties"),
    [
        (("--account=gpu-team", "--qos", "high"), {"account": "gpu-team", "qos": "high"}),
        (
            ("--time=60", "--mem-per-cpu=2G", "-x", "n3"),
            {"time_limit": "60", "memory_per_cpu": "2G", "exclude_nodes": "n3"},
        ),
        (("-A", "a", "-t30", "-q=q1", "--hold"), {"account": "a", "time_limit": "30", "qos": "q1", "hold": True}),
        (("--gres-flags=enforce-binding",), {"gres_flags": "enforce-binding"}),
    ],
)
def test_site_sbatch_options_become_rest_properties(args: tuple[str, ...], properties: dict[str, Any]) -> None:
    assert site_properties(args) == properties


def test_an_sbatch_option_rest_cannot_take_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'-Z'"):
        site_properties(("-Z",))


def test_the_slurm_rest_setting_makes_the_executor_use_slurmrestd(tmp_path: Path) -> None:
    settings = load(environ={"SUANLI_SLURM": "true", "SUANLI_SLURM_REST": "unix:/run/slurmrestd.sock"},
                    flags={"home": tmp_path})  # fmt: skip
    (engine,) = engines.configured(settings)
    assert isinstance(engine.executor.api, SlurmREST) and engine.executor.api.address == "unix:/run/slurmrestd.sock"
    config = tmp_path / "suanli.yaml"
    config.write_text("slurm: {partition: gpu, rest: unix:/run/slurmrestd.sock}\n")
    settings = load(environ={}, config_file=config, flags={"home": tmp_path})
    assert (settings.slurm, settings.slurm_partition, settings.slurm_rest) == (True, "gpu", "unix:/run/slurmrestd.sock")
    (engine,) = engines.configured(load(environ={"SUANLI_SLURM": "true"}, flags={"home": tmp_path}))
    assert not isinstance(engine.executor.api, SlurmREST)  # the tools alone
    with pytest.raises(Invalid, match="slurm_rest"):
        load(environ={"SUANLI_SLURM_REST": "slurmrestd:6820"}, flags={"home": tmp_path})


def test_a_server_for_slurmrestd_over_http_without_a_token_says_so_and_does_not_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
    env |= {"SUANLI_SLURM": "true", "SUANLI_SLURM_REST": "http://127.0.0.1:9", "SUANLI_HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "suanli.cli.main", "server", "--port", "0", "--ssh-port", "0"],
                       env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 2 and "set SLURM_JWT" in p.stderr, p.stderr
