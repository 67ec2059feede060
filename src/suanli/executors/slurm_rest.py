"""slurmrestd as the `SlurmAPI` transport, where the operator runs it: Slurm 22.05's OpenAPI plugin `openapi/v0.0.38`
(Debian bookworm's slurmrestd also has v0.0.37 and v0.0.36; v0.0.38 is the newest it has), with httpx.

Where and who:
- `unix:/run/slurmrestd.sock` (slurmrestd `-a rest_auth/local unix:/run/slurmrestd.sock`): slurmrestd takes the
  caller from the socket's peer credentials, and with rest_auth/local it acts only for its own user, so it must run
  as the suanli server's user; no token.
- `http://host:6820` or `https://…` (`-a rest_auth/jwt`): a JWT in SLURM_JWT, as `scontrol token` prints it (Slurm's
  own convention), sent as X-SLURM-USER-TOKEN with X-SLURM-USER-NAME = this process's user. slurmctld needs
  `AuthAltTypes=auth/jwt` for it.

Jobs are submitted with the same options as `sbatch` is given (`slurm_cli.SlurmCLI.submit`) under their REST names
(nodelist, nodes, tasks_per_node, gres, no_requeue, the same explicit environment sbatch runs in, …); the site's
sbatch options are mapped by name (`site_properties`), and slurmrestd names any it refuses. Job and node JSON is
mapped into `scontrol -o`'s fields, so `slurm_nodes` reads both transports the same way.

What 22.05's REST API cannot do, done by the CLI tools for that call only (so they must be on the host still):
- signal the batch shell alone (`scancel --batch --signal=TERM`, how a stop keeps its grace period): DELETE
  /job/{id} signals every step of the job (KILL_FULL_JOB), bwrap's own processes included;
- the switch tree (`scontrol show topology`, no endpoint; hostlists in it expanded by `scontrol show hostnames`).
A cancel of a pending job only is a GET then a DELETE (scancel --state=PENDING filters on the client as well).

Every request has a timeout (`timeout_s` for connecting, and again for reading); an error raises SlurmError with
slurmrestd's own words ("Invalid job id specified: Unable to find JobId=7"), so a slurmrestd that is down or stuck
makes a poll "running" with that reason, as a slurmctld that does not answer the tools does.
"""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from suanli.executors import slurm_nodes
from suanli.executors.base import EngineNode
from suanli.executors.slurm_api import ACTIVE_STATES, JOB_PREFIX, BatchJob, Component, SlurmError
from suanli.executors.slurm_cli import SlurmCLI

VERSION = "v0.0.38"
TOKEN_ENV = "SLURM_JWT"
# sbatch's long options whose REST name is not the option's own with '-' as '_' (slurmrestd's jobs.c job_params).
ALIASES = {"time": "time_limit", "time_min": "time_minimum", "mem": "memory_per_node", "mem_per_cpu": "memory_per_cpu",
           "mem_per_gpu": "memory_per_gpu", "job_name": "name", "chdir": "current_working_directory",
           "output": "standard_output", "error": "standard_error", "input": "standard_input", "ntasks": "tasks",
           "constraint": "constraints", "exclude": "exclude_nodes", "begin": "begin_time", "license": "licenses",
           "tmp": "temporary_disk_per_node", "get_user_env": "get_user_environment", "hint": "cpu_binding_hint"}  # fmt: skip
SHORT = {"A": "account", "q": "qos", "t": "time_limit", "p": "partition", "C": "constraints", "x": "exclude_nodes",
         "J": "name", "c": "cpus_per_task", "L": "licenses", "d": "dependency", "b": "begin_time", "D":
         "current_working_directory", "G": "gpus", "k": "no_kill", "H": "hold"}  # fmt: skip


def site_properties(args: Sequence[str]) -> dict[str, Any]:
    """sbatch options (`--account=a`, `--qos q`, `-t 60`, `--hold`) as v0.0.38 job properties (`account`, …).

    A flag with no value becomes `true`. Names are not checked here: slurmrestd answers an unknown or disabled one
    with its own words ("Unknown key …"), which the submit raises."""
    out: dict[str, Any] = {}
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        i += 1
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            name = key.replace("-", "_")
            name = ALIASES.get(name, name)
        elif arg.startswith("-") and len(arg) >= 2 and arg[1] in SHORT:
            name, eq, value = SHORT[arg[1]], "=" if len(arg) > 2 else "", arg[2:].lstrip("=")
        else:
            raise ValueError(f"sbatch option {arg!r}: not an option slurmrestd can be given")
        if not eq and i < len(items) and not items[i].startswith("-"):
            eq, value = "=", items[i]
            i += 1
        out[name] = value if eq else True
    return out


def _address(address: str) -> tuple[str, str | None]:
    """(base URL, unix socket path or None) of `unix:/path`, `/path`, `http(s)://host:port[/prefix]`."""
    if address.startswith("unix:") or address.startswith("/"):
        path = address.removeprefix("unix:")
        path = "/" + path.lstrip("/")
        if path == "/":
            raise ValueError(f"slurmrestd address {address!r}: no socket path")
        return "http://slurmrestd", path
    u = urlsplit(address)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ValueError(f"slurmrestd address {address!r}: expected unix:/PATH or http(s)://HOST:PORT")
    return address.rstrip("/"), None


def _exit(status: Any) -> str:
    """A wait status (what slurmrestd reports) as scontrol prints it: `exit code:signal`."""
    try:
        code = int(status)
    except (TypeError, ValueError):
        return "0:0"
    return f"{(code >> 8) & 0xFF}:{code & 0x7F}"


def _text(value: Any, null: str = "(null)") -> str:
    return null if value is None or value == "" else str(value)


def _job_record(j: dict[str, Any]) -> dict[str, str]:
    """One job of GET /job/{id} in `scontrol -o show job`'s fields (those suanli reads, and a few to say more)."""
    # scontrol shows the state description, blanks as '_', when there is one; else the reason's name.
    reason = str(j.get("state_description") or "").replace(" ", "_") or _text(j.get("state_reason"), "None")
    rec = {"JobId": str(j.get("job_id", "")), "JobName": _text(j.get("name")),
           "UserId": f"{_text(j.get('user_name'))}({j.get('user_id', '')})", "JobState": _text(j.get("job_state"), "UNKNOWN"),
           "Reason": reason, "NodeList": _text(j.get("nodes")), "BatchHost": _text(j.get("batch_host")),
           "NumNodes": str(j.get("node_count", "")), "ExitCode": _exit(j.get("exit_code")),
           "DerivedExitCode": _exit(j.get("derived_exit_code")), "Partition": _text(j.get("partition")),
           "TresPerNode": _text(j.get("tres_per_node")), "Requeue": "1" if j.get("requeue") else "0",
           "WorkDir": _text(j.get("current_working_directory"))}  # fmt: skip
    if j.get("het_job_id"):
        rec.update(HetJobId=str(j["het_job_id"]), HetJobOffset=str(j.get("het_job_offset", 0)),
                   HetJobIdSet=_text(j.get("het_job_id_set")))  # fmt: skip
    return rec


def _node_record(n: dict[str, Any]) -> dict[str, str]:
    """One node of GET /nodes in `scontrol -o show node`'s fields: `state` + `state_flags` as `DOWN+NOT_RESPONDING`,
    a reason with its `[user@time]` suffix."""
    state = "+".join([str(n.get("state") or "unknown").upper(), *map(str, n.get("state_flags") or [])])
    reason = str(n.get("reason") or "")
    if reason and n.get("reason_changed_at"):
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(n["reason_changed_at"])))
        reason += f" [{_text(n.get('reason_set_by_user'))}@{when}]"
    return {"NodeName": str(n.get("name", "")), "NodeAddr": _text(n.get("address")),
            "NodeHostName": _text(n.get("hostname")), "State": state, "Reason": reason,
            "Gres": _text(n.get("gres")), "GresUsed": _text(n.get("gres_used"), ""), "CPUTot": str(n.get("cpus", "")),
            "RealMemory": str(n.get("real_memory", "")), "Partitions": ",".join(n.get("partitions") or []),
            "AvailableFeatures": _text(n.get("features")), "ActiveFeatures": _text(n.get("active_features"))}  # fmt: skip


def job_of(j: dict[str, Any]) -> slurm_nodes.Job:
    """A job of GET /jobs as `slurm_nodes.own_jobs_gpus` reads it (user, name, nodes one by one, per-node TRES): its
    fields, never text rebuilt from them (a name is free text: any user of the site may put a newline in it)."""
    nodes = [a.get("nodename", "") for a in (j.get("job_resources") or {}).get("allocated_nodes") or []]
    nodes = [n for n in nodes if n] or slurm_nodes.expand_hostlist(str(j.get("nodes") or ""))
    return str(j.get("user_name") or ""), str(j.get("name") or ""), ",".join(nodes), str(j.get("tres_per_node") or "")


def _error_words(err: Any) -> str:
    if not isinstance(err, dict):
        return str(err)
    error, desc = str(err.get("error") or ""), str(err.get("description") or "")
    return f"{error}: {desc}" if error and desc and desc != error else error or desc or str(err)


class SlurmREST:
    """`SlurmAPI` over slurmrestd at `address` (see the module's docstring); `cli` does what REST cannot.

    `token` (default: SLURM_JWT) and `user` (default: this process's) are sent over TCP only. `transport` replaces
    httpx's (tests)."""

    def __init__(
        self,
        address: str,
        *,
        cli: SlurmCLI | None = None,
        timeout_s: float = 20.0,
        token: str | None = None,
        user: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        base, uds = _address(address)
        self.address = address
        self.cli = cli or SlurmCLI(timeout_s=timeout_s)
        self.timeout_s = timeout_s
        self.user = user or pwd.getpwuid(os.getuid()).pw_name
        headers = {"Accept": "application/json"}
        if uds is None:
            token = token or os.environ.get(TOKEN_ENV)
            if not token:
                raise ValueError(f"slurmrestd at {address}: set {TOKEN_ENV} to a JWT (`scontrol token`) for HTTP")
            headers |= {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": token}
        self._http = httpx.Client(
            base_url=base, headers=headers, timeout=httpx.Timeout(timeout_s), trust_env=uds is None,
            transport=transport or (httpx.HTTPTransport(uds=uds) if uds else None),
        )  # fmt: skip

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        """One request to /slurm/v0.0.38/`path`; its JSON. Raises SlurmError on no answer, an HTTP error or a
        non-empty `errors` list, with slurmrestd's words."""
        try:
            r = self._http.request(method, f"/slurm/{VERSION}/{path}", **kw)
        except httpx.HTTPError as e:
            raise SlurmError(f"slurmrestd at {self.address}: {method} {path}: {type(e).__name__}: {e}") from e
        try:
            data = r.json()
        except ValueError:
            data = None
        errors = data.get("errors") if isinstance(data, dict) else None
        if r.is_error or errors:
            words = "; ".join(map(_error_words, errors or [])) or r.text.strip()[:300] or r.reason_phrase
            raise SlurmError(f"slurmrestd {method} {path}: {words} (HTTP {r.status_code})")
        if not isinstance(data, dict):
            raise SlurmError(f"slurmrestd {method} {path}: answered {r.text[:200]!r}, not JSON")
        return data

    # -- jobs -----------------------------------------------------------------------------------------------

    def submit(self, job: BatchJob) -> str:
        """POST /job/submit: `job` for one component, `jobs` for a heterogeneous job (the script goes to the first)."""
        try:
            site = site_properties(job.site_args)
        except ValueError as e:
            raise SlurmError(str(e)) from e
        comps = [self._properties(job, c, site) for c in job.components]
        body = {"script": job.script.read_text(encoding="utf-8"), **({"job": comps[0]} if len(comps) == 1 else
                                                                     {"jobs": comps})}  # fmt: skip
        job_id = self._call("POST", "job/submit", json=body).get("job_id")
        if not isinstance(job_id, int) or job_id <= 0:
            raise SlurmError(f"slurmrestd answered job id {job_id!r} to a submission")
        return str(job_id)

    @staticmethod
    def _properties(job: BatchJob, comp: Component, site: dict[str, Any]) -> dict[str, Any]:
        props: dict[str, Any] = {
            "name": job.name, "no_requeue": True, "current_working_directory": str(job.workdir),
            "standard_output": job.output, "standard_error": job.error, "nodes": str(len(comp.hosts)),
            "tasks_per_node": 1, "nodelist": ",".join(comp.hosts),
            # slurmrestd refuses a job without an environment; nothing of ours goes there but what is given.
            "environment": dict(job.environment) or {"SUANLI_SLURM_JOB": job.name},
        }  # fmt: skip
        if comp.gpus:
            props["gres"] = f"gpu:{comp.gpus}"
        if comp.cpus:
            props["cpus_per_task"] = comp.cpus
        if comp.memory_mib:
            props["memory_per_node"] = comp.memory_mib
        if job.partition:
            props["partition"] = job.partition
        return {**props, **site}

    def job_records(self, job_id: str) -> list[dict[str, str]] | None:
        """GET /job/{id}: one record per heterogeneous component; None for a job Slurm does not know."""
        try:
            data = self._call("GET", f"job/{quote(job_id, safe='')}")
        except SlurmError as e:
            if "Invalid job id" in str(e):
                return None
            raise
        recs = [_job_record(j) for j in data.get("jobs") or [] if isinstance(j, dict)]
        return recs or None

    def cancel(self, job_id: str, *, pending_only: bool = False) -> None:
        """DELETE /job/{id} (SIGKILL: Slurm's cancel, as plain scancel); with `pending_only`, only after a GET
        says it is still pending. A failure is not raised."""
        try:
            if pending_only:
                recs = self.job_records(job_id)
                if not recs or not any(r["JobState"] == "PENDING" for r in recs):
                    return
            self._call("DELETE", f"job/{quote(job_id, safe='')}")
        except SlurmError:
            pass

    def signal_batch(self, job_id: str, signal: str = "TERM") -> None:
        """The CLI's `scancel --batch`: v0.0.38 has no way to signal the batch shell alone."""
        self.cli.signal_batch(job_id, signal)

    # -- nodes ----------------------------------------------------------------------------------------------

    def _nodes(self) -> list[dict[str, str]]:
        return [_node_record(n) for n in self._call("GET", "nodes").get("nodes") or [] if isinstance(n, dict)]

    def node_records(self, names: Sequence[str]) -> list[dict[str, str]]:
        """GET /nodes, those of `names` (GET /node/{name} takes one name only); [] when slurmrestd cannot say."""
        try:
            return [r for r in self._nodes() if r["NodeName"] in set(names)]
        except SlurmError:
            return []

    def discover(self, partition: str | None = None) -> list[EngineNode]:
        """Nodes from GET /nodes, suanli's own active jobs from GET /jobs (as `slurm_cli.discover` reads squeue),
        the tree from `scontrol show topology` (no REST endpoint; none when the tools cannot say)."""
        nodes = self._nodes()
        active = set(ACTIVE_STATES.split(","))
        jobs = [j for j in self._call("GET", "jobs").get("jobs") or [] if isinstance(j, dict)]
        own = slurm_nodes.own_jobs_gpus([job_of(j) for j in jobs if j.get("job_state") in active], self.user,
                                        JOB_PREFIX)  # fmt: skip
        topo = self.cli.run("scontrol", ["show", "topology"], check=False)
        return slurm_nodes.parse_node_records(nodes, slurm_nodes.parse_topology(topo, self.cli.hostnames), own,
                                              partition)  # fmt: skip
