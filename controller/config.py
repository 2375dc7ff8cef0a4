"""Controller configuration: embedded defaults < TOML file < ``BURSTCTL_*`` environment < flags.

One ``ControllerConfig`` is all the service receives (uvicorn's habit). Every
field has a default, so ``burstctl controller`` runs with no configuration at
all: one replica on loopback, FairShare, 1 GiB/s.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from burstctl.common.files import default_state_dir
from burstctl.common.limits import (
    DEFAULT_FALLBACK_GRACE,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_NOTICES,
    DEFAULT_MAX_OPEN_OPS,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_CLIENT,
    DEFAULT_RETRY_AFTER,
    DEFAULT_SHED_LOOP_LAG,
    MAX_JOBS,
    MAX_NODES,
    MAX_PRIORITY,
    identifier_problem,
)
from burstctl.common.units import Rate, parse_rate, parse_size


def split_host_port(value: str) -> tuple[str, int]:
    """``"127.0.0.1:50051"`` or ``"[::1]:50051"`` → (host, port); ValueError otherwise."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range in {value!r}")
    return host, port


class ControllerConfig(BaseSettings):
    """Everything a controller replica needs; see ``docs/configuration.md``."""

    model_config = SettingsConfigDict(
        env_prefix="BURSTCTL_", extra="forbid", validate_default=True, frozen=True
    )
    config_file: ClassVar[Path | None] = None  # the TOML file this class reads, if any

    grpc_listen: str = Field("127.0.0.1:50051", description="gRPC address for clients and peers")
    http_listen: str = Field("127.0.0.1:8080", description="REST admin/metrics address")
    capacity: Rate = Field(
        parse_rate("1GiB/s"), description="B: bandwidth of this replica's storage"
    )
    node_bandwidth: Rate = Field(
        parse_rate("256MiB/s"), description="b: per-node bandwidth; b_i = min(p_i*b, B)"
    )
    policy: str = Field("fair-share", description="policy name from the registry")
    policy_params: dict[str, Any] = Field(default_factory=dict, description="policy parameters")
    state_dir: Path = Field(default_factory=default_state_dir, description="durable state")
    replica_id: str = Field(
        default_factory=socket.gethostname,
        description="name of this replica; 1..256 printable characters (common/limits.py)",
    )
    heartbeat_timeout: float = Field(
        3.0, gt=0, description="s without Usage before a session is dead"
    )
    job_retention: float = Field(
        300.0, ge=0, description="s an inactive job is kept before removal"
    )
    lease: float = Field(5.0, gt=0, description="s an allocation stays valid without renewal")
    tick: float = Field(0.0, ge=0, description="s between periodic decisions; 0 = events only")
    burst_window: float = Field(0.05, gt=0, description="bucket depth = rate * burst_window")
    min_burst: int = Field(64 * 1024, ge=0, description="smallest bucket depth in bytes")
    push_tolerance: float = Field(
        0.02,
        ge=0,
        lt=1,
        description="relative rate change below which no Allocation is pushed; "
        "pushed rates then sum to at most B * (1 + push_tolerance)",
    )
    fallback_grace: float = Field(
        DEFAULT_FALLBACK_GRACE,
        ge=0,
        le=86400,
        description="s a keep-last client keeps a vanished replica's last rate after its lease; "
        "the survivors count a dead peer's rates that long (>= the clients' fallback_grace)",
    )
    release_delay: float = Field(
        0.05, ge=0, description="s a session keeps its rate after its last operation completes"
    )
    demand_headroom: float = Field(
        1.1, ge=1.0, description="a satisfied job's ceiling = measured rate * headroom"
    )
    max_op_volume: int = Field(2**53, gt=0, description="largest accepted operation volume, bytes")
    ledger_interval: float = Field(
        1.0,
        gt=0,
        le=3600,
        description="s between two saves of the jobs' counters to <state_dir>/ledger.json",
    )
    placement_compute_nodes: int | None = Field(
        None,
        ge=1,
        le=MAX_NODES * MAX_JOBS,
        description="Q^cpu for placement advice: compute nodes of the machine "
        "(default: the sum of the nodes of the jobs advised)",
    )
    profile_max_keys: int = Field(
        10_000,
        ge=1,
        le=1_000_000,
        description="application profiles kept (<state_dir>/profiles.json)",
    )
    log_level: str = Field("INFO", description="logging level")
    peers: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="other replicas' grpc_listen addresses (HOST:PORT) to exchange digests with",
    )
    sync_interval: float = Field(
        0.5, gt=0, le=3600, description="λ: s between digest exchanges with the peers"
    )
    missed_exchanges: int = Field(
        3, ge=1, le=1000, description="k: a peer silent for k·λ leaves the global view"
    )
    admin_token_file: Path | None = Field(
        None,
        description="file holding the REST bearer token; default <state_dir>/admin-token",
    )
    protect_reads: bool = Field(
        False, description="REST reads need the bearer token too (mutations always do)"
    )
    metrics_top_jobs: int = Field(
        50,
        ge=0,
        le=10_000,
        description="GET /metrics has per-job series for this many jobs, those with the "
        "highest rate; every job counts in the aggregate series",
    )
    # -- the burst buffer (docs/capacity.md) ----------------------------------------------
    bb_capacity: int | None = Field(
        None,
        description="S: the burst buffer's capacity per replica (a size such as 200MiB); "
        "writers of mounts wait for space rather than fill it; unset = no limit",
    )
    pfs_bandwidth: Rate | None = Field(
        None,
        description="B of [DPSAC]: bandwidth of the drain to the parallel file system, shared "
        "by the jobs' drain streams; unset = drains share the capacity B instead",
    )
    bb_grant_horizon: float = Field(
        1.0,
        gt=0,
        le=3600,
        description="s of a writer's rate one space grant covers (chunk = rate * horizon)",
    )
    bb_min_grant: int = Field(
        1 << 20, ge=1, description="smallest space grant topped up at once, bytes"
    )
    bb_parked_retention: float = Field(
        0.0,
        ge=0,
        description="s a parked resident (a mount's bytes after its stream ended) stays on the"
        " books unclaimed; 0 = until its mount comes back or DELETE /v1/capacity/parked",
    )
    # -- limits (docs/configuration.md, "Limits"): beyond one, RESOURCE_EXHAUSTED naming it ----
    max_sessions: int = Field(
        DEFAULT_MAX_SESSIONS,
        ge=1,
        description="open sessions on this replica; a Hello beyond is refused with a retry hint",
    )
    max_sessions_per_client: int = Field(
        DEFAULT_MAX_SESSIONS_PER_CLIENT,
        ge=1,
        description="open sessions from one client host (gRPC peer address)",
    )
    max_jobs: int = Field(
        MAX_JOBS,
        ge=1,
        le=MAX_JOBS,
        description="jobs in the table; a new job takes the place of the longest inactive one, "
        "and is refused with a retry hint when all are active",
    )
    max_open_ops: int = Field(
        DEFAULT_MAX_OPEN_OPS, ge=1, description="operations open at once on one session"
    )
    max_notices: int = Field(
        DEFAULT_MAX_NOTICES,
        ge=1,
        description="error notices queued on one session; beyond, counted in one summary notice",
    )
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES,
        ge=64 * 1024,
        le=2**31 - 1,
        description="largest gRPC message received (a Session message, a peer's digest)",
    )
    max_digest_jobs: int = Field(
        MAX_JOBS, ge=1, le=MAX_JOBS, description="jobs in one peer digest; a larger one is rejected"
    )
    shed_loop_lag: float = Field(
        DEFAULT_SHED_LOOP_LAG,
        ge=0,
        description="s of event-loop lag beyond which new sessions are refused with a retry "
        "hint (0 = never); a heartbeat closure also forgives the lag of the moment",
    )
    retry_after: float = Field(
        DEFAULT_RETRY_AFTER,
        gt=0,
        le=3600,
        description="s a client refused by a session limit is told to wait (retry-after-ms)",
    )
    # -- trust (docs/security.md): gRPC credentials and who may open which session --------
    grpc_tls_cert: Path | None = Field(
        None,
        description="PEM certificate chain of this replica's gRPC server (TLS on); under "
        "mutual TLS also the client certificate it shows its peers",
    )
    grpc_tls_key: Path | None = Field(None, description="PEM private key of grpc_tls_cert")
    grpc_tls_client_ca: Path | None = Field(
        None,
        description="PEM CA bundle: callers must show a certificate it signed (mutual TLS); "
        "such callers are trusted (vouched)",
    )
    grpc_tls_ca: Path | None = Field(
        None,
        description="PEM CA bundle that signed the peers' server certificates; "
        "default grpc_tls_client_ca",
    )
    grpc_secret_file: Path | None = Field(
        None,
        description="file holding the shared secret; callers presenting it are trusted "
        "(vouched), a wrong one is refused on every RPC",
    )
    client_trust: Literal["auto", "open", "confined", "vouched"] = Field(
        "auto",
        description="Session callers without credentials: open (taken at their word), "
        "confined (to the default job user:<user>), vouched (refused); "
        "auto = open without credentials configured, else vouched",
    )
    max_unregistered_nodes: int = Field(
        64, ge=1, le=MAX_NODES, description="most nodes a session of an unregistered job may claim"
    )
    max_unregistered_priority: float = Field(
        1.0,
        gt=0,
        le=MAX_PRIORITY,
        allow_inf_nan=False,
        description="highest priority a session of an unregistered job may claim",
    )

    @field_validator("grpc_listen", "http_listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        split_host_port(value)
        return value

    @field_validator("peers", mode="before")
    @classmethod
    def _split_peers(cls, value: object) -> object:
        # "a:1,b:2" from a flag or BURSTCTL_PEERS; a list from TOML.
        if isinstance(value, str):
            return [p.strip() for p in value.split(",") if p.strip()]
        return value

    @field_validator("peers")
    @classmethod
    def _check_peers(cls, value: list[str]) -> list[str]:
        for peer in value:
            _, port = split_host_port(peer)
            if port == 0:
                raise ValueError(f"a peer needs a fixed port, got {peer!r}")
        if len(set(value)) != len(value):
            raise ValueError("a peer is listed twice")
        return value

    @field_validator("replica_id")
    @classmethod
    def _check_replica_id(cls, value: str) -> str:
        problem = identifier_problem(value)  # what a peer checks in this replica's digests
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("bb_capacity", mode="before")
    @classmethod
    def _parse_bb_capacity(cls, value: object) -> object:
        if value is None:
            return None
        if isinstance(value, str | int) and not isinstance(value, bool):
            try:
                size = parse_size(value)  # "200MiB"
            except ValueError as exc:
                raise ValueError(f"--bb-capacity: {exc}") from None
            if size <= 0:
                raise ValueError(f"--bb-capacity must be > 0 (unset = no limit), got {value!r}")
            return size
        raise ValueError(f"--bb-capacity: not a size: {value!r}")

    @field_validator("pfs_bandwidth")
    @classmethod
    def _check_pfs_bandwidth(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError(f"--pfs-bandwidth must be > 0 (unset = not paced), got {value!r}")
        return value

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError(f"unknown log level {value!r}")
        return level

    @model_validator(mode="after")
    def _check_trust(self) -> ControllerConfig:
        if (self.grpc_tls_cert is None) != (self.grpc_tls_key is None):
            raise ValueError("grpc_tls_cert and grpc_tls_key go together")
        if self.grpc_tls_cert is None and (
            self.grpc_tls_client_ca is not None or self.grpc_tls_ca is not None
        ):
            raise ValueError("grpc_tls_client_ca and grpc_tls_ca need grpc_tls_cert (TLS on)")
        if self.client_trust == "vouched" and not self.credentials_configured:
            raise ValueError(
                "client_trust = 'vouched' needs grpc_secret_file or grpc_tls_client_ca"
            )
        return self

    @property
    def credentials_configured(self) -> bool:
        """A shared secret or mutual TLS marks trusted callers."""
        return self.grpc_secret_file is not None or self.grpc_tls_client_ca is not None

    @property
    def effective_client_trust(self) -> str:
        if self.client_trust != "auto":
            return self.client_trust
        return "vouched" if self.credentials_configured else "open"

    @model_validator(mode="after")
    def _check_rates(self) -> ControllerConfig:
        if self.capacity <= 0:
            raise ValueError("capacity must be > 0")
        if self.node_bandwidth <= 0:
            raise ValueError("node_bandwidth must be > 0")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml_file = getattr(settings_cls, "config_file", None)
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


class ConfigError(ValueError):
    """A configuration problem, with every bad field named."""


def load_config(config_file: Path | str | None = None, **overrides: Any) -> ControllerConfig:
    """Builds the configuration; ``overrides`` (from flags) win over env and file.

    Raises ``ConfigError`` naming each bad field and where it came from.
    """
    path = Path(config_file) if config_file is not None else None
    if path is not None and not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    given = {k: v for k, v in overrides.items() if v is not None}
    # pydantic-settings asks the class for its sources: a subclass carries the file.
    settings_cls = type("ControllerConfig", (ControllerConfig,), {"config_file": path})
    try:
        return settings_cls(**given)
    except ValidationError as exc:
        lines = [
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        ]
        where = f" (file {path}, BURSTCTL_* env, flags)" if path else " (BURSTCTL_* env, flags)"
        raise ConfigError("invalid configuration" + where + ":\n  " + "\n  ".join(lines)) from None
    except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
