"""Server and CLI settings: flags, then `SUANLI_*` environment variables, then a YAML config file, then defaults."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import platformdirs
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from suanli.control.errors import Invalid
from suanli.sched.policies import config_name, configured
from suanli.sim.oracle import ORACLE_POLICIES
from suanli.storage.archive import DEFAULT_LIMITS

if TYPE_CHECKING:
    from suanli.storage.s3 import S3Config


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    home: Path = Field(description="data directory: database, logs, saved credentials")
    db: str = Field("", description="database URL; empty: a SQLite file in the data directory")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    currency: str = Field("CNY", pattern=r"^[A-Z]{3}$", description="currency of the shipped default price book")
    trial_credit: Decimal = Field(Decimal("10.00"), ge=0, le=1_000_000)
    admission_hold_minutes: int = Field(10, ge=0, le=60 * 24 * 31)
    max_queued_per_org: int = Field(
        1000, ge=1, le=1_000_000, description="workloads an org may have waiting (pending) at once; more: 409"
    )
    admin_email: str | None = None
    admin_password: str | None = None
    max_body_bytes: int = Field(1 << 20, ge=1024)
    max_upload_bytes: int = Field(64 << 20, ge=1024, description="largest workdir upload (.tar.gz, POST /workdirs)")
    workdir_max_bytes: int = Field(
        DEFAULT_LIMITS.bytes, ge=4096, description="most one upload unpacks to (files in whole 4 KiB blocks)"
    )
    workdir_max_files: int = Field(DEFAULT_LIMITS.entries, ge=1, description="most files and directories in an upload")
    storage_quota_bytes: int = Field(10 << 30, ge=0, description="workdirs an org may keep on the server's disk")
    workdir_retention_hours: float = Field(
        168.0, ge=0, le=24 * 3650, description="hours a finished job's workdir is kept before it is removed"
    )
    volumes_dir: Path | None = Field(
        None, description="where volumes live (the local backend): on a cluster, the nodes' shared filesystem; "
        "default: volumes/ in the data directory",
    )  # fmt: skip
    volume_max_bytes: int = Field(1 << 40, ge=1 << 20, le=1 << 50, description="the largest volume a tenant may make")
    volumes_per_org: int = Field(100, ge=0, le=100_000, description="most volumes one org may have")
    volume_bytes_per_org: int = Field(10 << 40, ge=1 << 20, le=1 << 60,
                                      description="most bytes one org's volumes may have allocated, all together")  # fmt: skip
    volume_snapshot_bytes_per_org: int = Field(10 << 40, ge=0, le=1 << 60,
                                               description="most bytes one org's versions may hold, all together")  # fmt: skip
    endpoints_per_org: int = Field(20, ge=0, le=10_000, description="most endpoints one org may have")
    teams_per_user: int = Field(20, ge=0, le=10_000, description="most team organisations one user may own")
    volume_max_files: int = Field(1_000_000, ge=1, description="most files and directories one `cp` of a tree unpacks")
    local_copy: bool = Field(
        True, description="same-host copies: a tenant's `volumes cp` on the server's own host passes open files over "
        "a Unix socket and the server copies them in the kernel (off: every copy goes through HTTP)",
    )  # fmt: skip
    volume_s3_bucket: str | None = Field(None, max_length=63, description="S3 volume backend: the bucket (unset: none)")
    volume_s3_prefix: str = Field("", max_length=200, description="S3 volume backend: keys start with this")
    volume_s3_endpoint: str | None = Field(None, max_length=500, description="S3 volume backend: endpoint URL")
    volume_s3_region: str | None = Field(None, max_length=64)
    volume_s3_key_id: str | None = Field(None, max_length=256, repr=False, description="S3 access key id")
    volume_s3_secret: str | None = Field(None, max_length=256, repr=False, description="S3 secret key (never shown)")
    login_token_days: int = Field(30, ge=1, le=3650)
    signup: Literal["open", "invite", "closed"] = Field(
        "open", description="who may sign up: anyone, only with an invitation or invite code, or nobody"
    )
    signup_per_address_per_hour: int = Field(30, ge=1, le=1_000_000, description="signups from one address an hour")
    smtp_url: str | None = Field(
        None, max_length=1000, repr=False,
        description="mail server for e-mail verification: smtp://[USER:PASS@]HOST[:PORT] (STARTTLS when offered) or "
        "smtps://… (TLS); set, a signup's trial credit waits until its e-mail is verified; unset: no mail, the "
        "credit at signup (never shown)",
    )  # fmt: skip
    mail_from: str | None = Field(
        None, max_length=320, description="From: address of the server's mail (default: suanli@ the SMTP host)"
    )
    public_url: str | None = Field(
        None, max_length=500,
        description="this server's address as users reach it (https://gpu.example.com), for links in mail; "
        "default: http://HOST:PORT",
    )  # fmt: skip
    payment_hmac_secret: str | None = Field(
        None, min_length=32, max_length=256, repr=False,
        description="payments: the generic HMAC provider's webhook secret (unset: no such provider; never shown)",
    )  # fmt: skip
    payment_tolerance_s: int = Field(
        300, ge=30, le=3600, description="payments: a webhook's timestamp may be off so much"
    )
    payment_max_amount: Decimal = Field(
        Decimal("1000000"), gt=0, le=1_000_000_000, description="payments: most per event"
    )
    password_threads: int = Field(2, ge=1, le=64, description="threads that hash and check passwords (argon2)")
    password_queue: int = Field(32, ge=0, le=100_000, description="password checks waiting at most; more get 503")
    meter_interval_s: float = Field(5.0, gt=0, le=3600)
    meter_window_s: int = Field(60, ge=1, le=3600)
    usage_span_s: int | None = Field(
        None, ge=1, le=3600,
        description="billing: usage: seconds one GPU reading speaks for, ending with it (default: "
        "telemetry_interval_s rounded up, plus 1); a second no reading speaks for is charged as fully active",
    )  # fmt: skip
    usage_delay_s: int = Field(
        30, ge=0, le=3600, description="billing: usage: seconds after a window ends before it is charged (> span)"
    )
    threads: int = Field(8, ge=1, le=256, description="threads serving route bodies (database calls) per process")
    background: bool = Field(True, description="run the background loops (metering) in this server")
    schedule_interval_s: float = Field(0.5, gt=0, le=60, description="seconds between scheduling passes")
    policy: str = Field(
        "default",
        description="scheduling policy, with optional switches: `default+gittins+elastic_shrink+grow_las` (the names "
        "`suanli sim --policy` takes)",
    )
    stop_grace_s: float = Field(10.0, ge=0, le=3600, description="SIGTERM to SIGKILL when a workload stops")
    balance_grace_minutes: float = Field(
        5.0, ge=0, le=24 * 60, description="minutes of its rate a workload may run below a zero balance"
    )
    virtual: tuple[str, ...] = Field((), description="topology presets registered as virtual nodes on start")
    ssh_port: int = Field(2222, ge=0, le=65535, description="port of the SSH gateway into instances; 0: none")
    ssh_max_connections_per_user: int = Field(32, ge=1, le=10_000, description="SSH connections one user may hold")
    telemetry_interval_s: float = Field(5.0, gt=0, le=3600, description="seconds between GPU samples")
    telemetry_stale_s: float = Field(90.0, gt=0, description="a GPU whose newest sample is older shows no reading")
    telemetry_raw_s: int = Field(7200, ge=60, description="seconds samples are kept at full resolution")
    telemetry_minute_s: int = Field(7 * 86400, ge=3600, description="seconds per-minute rollups are kept")
    telemetry_hour_s: int = Field(90 * 86400, ge=86400, description="seconds per-hour rollups are kept")
    sim_seed: int = Field(0, description="seed of the simulated GPUs of virtual nodes")
    sim_fault_rate: float = Field(0.0, ge=0, le=100, description="random XIDs per simulated GPU-hour (0: none)")
    sim_samples_per_s: float = Field(
        4000.0, gt=0, description="most simulated samples a second: a bigger virtual fleet is sampled less often"
    )
    health_overtemp_margin_c: float = Field(0.0, ge=0, le=50, description="fire this far below the slowdown °C")
    health_overtemp_samples: int = Field(2, ge=1, le=1000, description="consecutive hot samples before acting")
    health_heartbeat_s: float = Field(60.0, gt=0, description="a node silent this long is unhealthy")
    health_fatal_xids: tuple[int, ...] | None = Field(None, description="XIDs that drain a node (default: NVIDIA's)")

    sandbox: Literal["on", "off"] = Field(
        "on", description="off: the operator's own work runs unsandboxed (tenant work is always sandboxed)"
    )
    network: Literal["host", "private"] = Field(
        "host",
        description="what a spec that names no network gets when it runs on one node without ports: host (the "
        "node's network), or private (its own namespace, outbound only; needs pasta, Debian's passt, on every node)",
    )
    environments: dict[str, str] = Field(
        default_factory=dict, description="named environments tenants may use as `image:` (NAME: directory)"
    )
    default_environment: str = Field(
        "server", description="prefix bound into every sandbox: 'server' (this Python), 'none', or a directory"
    )
    hub_dir: Path | None = Field(
        None,
        description="the hub of public models and datasets (default: hub/ in the data directory); on a cluster, a "
        "filesystem every node mounts at the same path",
    )
    trusted_proxies: str = Field(
        "",
        max_length=1000,
        pattern=r"^[0-9A-Fa-f:.,/* ]*$",
        description="addresses of the reverse proxies in front of this server whose X-Forwarded-For and "
        "X-Forwarded-Proto are believed (comma-separated addresses or networks, as uvicorn's --forwarded-allow-ips); "
        "empty: none, every limit counts the connection's own address (a tenant's job on this host reaches "
        "127.0.0.1 and could write any X-Forwarded-For)",
    )
    proxy_url: str | None = Field(
        None,
        description="each instance's JupyterLab and ports on an origin of its own, "
        "e.g. https://{id}.i.example.com (wildcard DNS and certificate); unset: under /i/ "
        "of this server's origin",
    )
    ray_address: str | None = Field(
        None, description="a Ray cluster to run on (ray://… or HOST:PORT); its GPU nodes become cluster `ray_cluster`"
    )
    ray_cluster: str = Field("ray", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    ray_namespace: str = Field("suanli", min_length=1, max_length=64, description="Ray namespace of suanli's actors")
    slurm: bool = Field(False, description="run on the Slurm cluster this host is a client of (sbatch, squeue, …)")
    slurm_cluster: str = Field("slurm", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    slurm_partition: str | None = Field(None, max_length=64, description="the partition suanli submits to")
    slurm_conf: str | None = Field(None, description="SLURM_CONF for the Slurm tools (default: theirs)")
    slurm_rest: str | None = Field(
        None,
        pattern=r"^(unix:/.+|/.+|https?://[^/\s]+\S*)$",
        description="slurmrestd to use instead of the tools where it can (unix:/run/slurmrestd.sock, "
        "http://host:6820 with SLURM_JWT); unset: the tools only",
    )
    engine_fabric: str = Field("eth-100", description="scale-out fabric of Ray and Slurm clusters (a catalog fabric)")
    engine_nics: int = Field(1, ge=1, le=64, description="scale-out NICs per Ray or Slurm node")
    engine_sync_s: float = Field(2.0, gt=0, le=600, description="seconds between asking Ray or Slurm for its nodes")
    gpu_dev_root: str = Field("/dev", description="where this host's /dev/nvidia* device nodes are")
    cgroup_parent: str | None = Field(None, description="a cgroup2 directory delegated to the server for limits")

    @field_validator("environments")
    @classmethod
    def _environments(cls, v: dict[str, str]) -> dict[str, str]:
        for name, path in v.items():
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"environment name {name!r}: 1-63 of a-z, 0-9, '.', '_', '-'")
            if not path.startswith(("/", "oci:")):
                raise ValueError(f"environment {name}: {path!r} must be an absolute path or oci:IMAGE")
        return v

    @model_validator(mode="before")
    @classmethod
    def _slurm_block(cls, data: Any) -> Any:
        """`slurm: {partition: gpu, conf: /etc/slurm/slurm.conf, cluster: hpc, rest: unix:/run/slurmrestd.sock}` in a
        config file, as well as flat settings (`slurm: true`, `slurm_partition`, … and their SUANLI_* variables)."""
        if isinstance(data, dict) and isinstance(data.get("slurm"), dict):
            block = dict(data["slurm"])
            data = {**data, "slurm": True}
            for key in ("partition", "conf", "cluster", "rest"):
                if key in block:
                    data[f"slurm_{key}"] = block.pop(key)
            if block:
                raise ValueError(f"slurm: unknown keys {sorted(block)} (known: partition, conf, cluster, rest)")
        return data

    @field_validator("smtp_url")
    @classmethod
    def _smtp_url(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        from suanli.mail.smtp import SmtpMailer

        SmtpMailer(v)  # the mailer's own reading of the URL: what it refuses is refused at start
        return v

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        from urllib.parse import urlsplit

        u = urlsplit(v)
        if u.scheme not in ("http", "https") or not u.netloc or u.query or u.fragment:
            raise ValueError("must be http(s)://HOST[:PORT][/PATH]")
        return v.rstrip("/")

    @property
    def site_url(self) -> str:
        """Where users reach this server: `public_url`, else this host and port."""
        return self.public_url or f"http://{self.host}:{self.port}"

    @field_validator("proxy_url")
    @classmethod
    def _proxy_url(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        from urllib.parse import urlsplit

        u = urlsplit(v)
        if u.scheme not in ("http", "https") or not u.netloc.startswith("{id}.") or u.path not in ("", "/"):
            raise ValueError("must be http(s)://{id}.DOMAIN[:PORT] (each instance's own host under a wildcard domain)")
        return f"{u.scheme}://{u.netloc}"

    @field_validator("engine_fabric")
    @classmethod
    def _known_fabric(cls, v: str) -> str:
        from suanli import catalog

        try:
            return catalog.fabric(v).name
        except catalog.CatalogError as e:
            raise ValueError(str(e)) from None

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v.split("+", 1)[0].strip().lower() in ORACLE_POLICIES:
            raise ValueError(
                f"{v!r} is the simulator's clairvoyant reference (it reads true job durations), not a policy"
            )
        return config_name(configured(v))  # unknown policy or switch: a ValueError naming the known ones

    @property
    def volumes_root(self) -> Path:
        return self.volumes_dir or self.home / "volumes"

    def volume_s3(self) -> S3Config | None:
        """The S3 volume backend's configuration, or None when the operator set none."""
        if not self.volume_s3_bucket:
            return None
        from suanli.storage.s3 import S3Config

        return S3Config(self.volume_s3_bucket, self.volume_s3_prefix, self.volume_s3_endpoint, self.volume_s3_key_id,
                        self.volume_s3_secret, self.volume_s3_region)  # fmt: skip

    @property
    def db_url(self) -> str:
        return self.db or f"sqlite+pysqlite:///{self.home / 'suanli.db'}"


ENV_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
LISTS = ("virtual", "health_fatal_xids")  # comma-separated in environment variables
MAPS = ("environments",)


def default_home() -> Path:
    return Path(platformdirs.user_data_dir("suanli", appauthor=False))


def load(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
) -> Settings:
    """Merge the sources; a flag left as None falls through to the next source."""
    environ = os.environ if environ is None else environ
    config_file = config_file or environ.get("SUANLI_CONFIG")
    merged: dict[str, Any] = {}
    if config_file:
        path = Path(config_file)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as e:
            raise Invalid(f"config file {path}: {e}") from e
        if not isinstance(data, dict):
            raise Invalid(f"config file {path}: expected a mapping of setting names to values")
        merged.update({k.replace("-", "_"): v for k, v in data.items()})
    for name in Settings.model_fields:
        value = environ.get(f"SUANLI_{name.upper()}")
        if value is not None and value != "":
            if name in MAPS:  # NAME=PATH,NAME=PATH
                merged[name] = dict(item.partition("=")[::2] for item in value.split(",") if item)
            else:
                merged[name] = [v for v in value.split(",") if v] if name in LISTS else value
    merged.update({k: v for k, v in (flags or {}).items() if v is not None})
    merged.setdefault("home", default_home())
    try:
        return Settings.model_validate(merged)
    except ValidationError as e:
        fields = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise Invalid(f"settings: {fields}") from e
