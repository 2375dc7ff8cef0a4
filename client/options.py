"""A session's configuration: its defaults, their checks, and the client id.

The defaults of the public `Session` / `AsyncSession` arguments live here and only here; the
FUSE mount reads `DEFAULT_ATTACH_TIMEOUT` from here too. `SessionOptions.build` validates the
arguments once, so a bad one raises `ValueError` where the session is constructed.
"""

from __future__ import annotations

import math
import os
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from burstctl.client.bucket import Pattern
from burstctl.client.fallback import Fallback
from burstctl.client.job import JobInfo
from burstctl.common.channels import ChannelSecurity
from burstctl.common.limits import DEFAULT_FALLBACK_GRACE
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

DEFAULT_FALLBACK = "keep-last"
# Seconds between two Usage reports (the heartbeat).
DEFAULT_REPORT_INTERVAL = 0.25
# Seconds without an acquire after which an implicit operation completes.
DEFAULT_QUIET_GAP = 0.1
# Seconds a new session waits for its first allocation before the fallback applies.
DEFAULT_ATTACH_TIMEOUT = 2.0
# DEFAULT_FALLBACK_GRACE (common/limits.py): seconds a keep-last session keeps its last allotted
# rate after its lease ran out, with no controller answering, before it moves to its share of
# the controller's fallback budget (client/fallback.py). Re-exported here for the client's users.

# Called with the new rate (bytes/s, inf = unthrottled) whenever a session's rate in force changes.
RateObserver = Callable[[float], None]

# Called with (rate, burst, pattern) every time a session applies an allocation or its fallback,
# changed or not (the node agent publishes them to a job's shared page, docs/preload.md).
BucketObserver = Callable[[float, float, Pattern | None], None]

# What a session's stream carries (Hello.purpose, docs/capacity.md): the job's own I/O, or the
# copy of its closed files from the burst buffer to the parallel file system.
Purpose = Literal["app", "drain"]
PURPOSES: tuple[Purpose, ...] = ("app", "drain")


def default_client_id() -> str:
    """``host:pid:random`` — unique per session object, readable in controller logs."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class SessionOptions:
    """Everything a session is configured with, validated once."""

    target: str
    job: JobInfo
    fallback: Fallback
    report_interval: float
    quiet_gap: float
    attach_timeout: float
    client_id: str
    host: str
    security: ChannelSecurity  # TLS, client certificate, shared secret (docs/security.md)
    fallback_grace: float = DEFAULT_FALLBACK_GRACE
    rate_observer: RateObserver | None = None
    purpose: Purpose = "app"
    buffer: bool = False  # the session tracks a burst buffer (Buffer reports, space limits)
    bucket_observer: BucketObserver | None = None
    # called with each new metadata rate (ops/s, 0 = unpaced; client/metadata.py)
    metadata_observer: RateObserver | None = None

    def hello(
        self, buffer: pb.Buffer | None, pacing_rate: float, allotted: float
    ) -> pb.ClientMessage:
        """The Hello that opens a stream of the session: its job, who it is, what it holds on
        the buffer, what it paces at as the stream opens (unthrottled, an explicit choice
        outside the fail-safe rule, says nothing: 0) and the rate its last allocation gave."""
        job = self.job
        return pb.ClientMessage(
            hello=pb.Hello(
                job_id=job.job_id,
                user=job.user,
                group=job.group,
                nodes=job.nodes,
                priority=job.priority,
                period_w=job.w or 0.0,
                period_vol=job.vol_io or 0.0,
                client_id=self.client_id,
                host=self.host,
                purpose=pb.PURPOSE_DRAIN if self.purpose == "drain" else pb.PURPOSE_APP,
                buffer=buffer,
                pacing_rate=pacing_rate if math.isfinite(pacing_rate) else 0.0,
                allotted=allotted,
            )
        )

    @classmethod
    def build(
        cls,
        target: str,
        job: JobInfo | None,
        fallback: str | Fallback,
        *,
        report_interval: float,
        quiet_gap: float,
        attach_timeout: float,
        client_id: str | None,
        security: ChannelSecurity | None = None,
        fallback_grace: float = DEFAULT_FALLBACK_GRACE,
        rate_observer: RateObserver | None = None,
        purpose: Purpose = "app",
        buffer: bool = False,
        bucket_observer: BucketObserver | None = None,
        metadata_observer: RateObserver | None = None,
    ) -> SessionOptions:
        if not isinstance(target, str) or not target:
            raise ValueError(f"target must be a non-empty 'host:port' string, got {target!r}")
        if job is None:
            job = JobInfo.from_env()
        elif not isinstance(job, JobInfo):
            raise ValueError(f"job must be a JobInfo, got {type(job).__name__}")
        _check_seconds("report_interval", report_interval, allow_zero=False, allow_inf=False)
        _check_seconds("quiet_gap", quiet_gap, allow_zero=True, allow_inf=False)
        _check_seconds("attach_timeout", attach_timeout, allow_zero=True, allow_inf=True)
        _check_seconds("fallback_grace", fallback_grace, allow_zero=True, allow_inf=True)
        if rate_observer is not None and not callable(rate_observer):
            raise ValueError(f"rate_observer must be callable, got {rate_observer!r}")
        for name, observer in (
            ("bucket_observer", bucket_observer),
            ("metadata_observer", metadata_observer),
        ):
            if observer is not None and not callable(observer):
                raise ValueError(f"{name} must be callable, got {observer!r}")
        if purpose not in PURPOSES:
            raise ValueError(f"purpose must be 'app' or 'drain', got {purpose!r}")
        if not isinstance(buffer, bool):
            raise ValueError(f"buffer must be a bool, got {buffer!r}")
        if buffer and purpose == "drain":
            raise ValueError("buffer=True needs purpose='app': a drain stream carries no Buffer")
        if client_id is not None and (not isinstance(client_id, str) or not client_id):
            raise ValueError(f"client_id must be a non-empty string, got {client_id!r}")
        if security is None:
            security = ChannelSecurity()
        elif not isinstance(security, ChannelSecurity):
            raise ValueError(f"security must be a ChannelSecurity, got {type(security).__name__}")
        return cls(
            target=target,
            job=job,
            fallback=Fallback.parse(fallback),
            report_interval=float(report_interval),
            quiet_gap=float(quiet_gap),
            attach_timeout=float(attach_timeout),
            client_id=client_id or default_client_id(),
            host=socket.gethostname(),
            security=security,
            fallback_grace=float(fallback_grace),
            rate_observer=rate_observer,
            purpose=purpose,
            buffer=buffer,
            bucket_observer=bucket_observer,
            metadata_observer=metadata_observer,
        )


CONTROLLERS_VAR = "BURSTCTL_CONTROLLERS"
FOLLOW_ADVICE_VAR = "BURSTCTL_FOLLOW_ADVICE"
REPLICAS_VAR = "BURSTCTL_REPLICAS"


def _addresses(value: str | Sequence[str] | None, name: str) -> list[str]:
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"{name} must hold 'host:port' strings, got {item!r}")
        item = item.strip()
        if item and item not in out:
            out.append(item)
    return out


def follows_advice(replicas: Sequence[str] | None, follow_advice: bool | None) -> bool:
    """Whether a session follows placement advice: ``replicas`` given, or ``follow_advice``
    (None: ``BURSTCTL_FOLLOW_ADVICE=1``)."""
    if follow_advice is None:
        follow_advice = os.environ.get(FOLLOW_ADVICE_VAR, "").strip() in ("1", "true", "yes")
    return follow_advice or bool(replicas)


def resolve_targets(
    target: str | Sequence[str] | None,
    replicas: Sequence[str] | None,
    follow_advice: bool | None,
) -> list[str]:
    """The addresses a session opens its streams on (docs/client.md, "Placement advice").

    ``target``: one controller address or several (None or empty: ``BURSTCTL_CONTROLLERS``, a
    comma list). Without advice the session uses the first. ``follow_advice`` (None:
    ``BURSTCTL_FOLLOW_ADVICE=1``): the advised replicas, ``replicas`` or else
    ``BURSTCTL_REPLICAS`` (written by the Slurm task prolog), one stream on each; with no
    advice to follow, the first controller. ``replicas`` given is advice followed.
    """
    controllers = _addresses(target, "target") or _addresses(
        os.environ.get(CONTROLLERS_VAR), CONTROLLERS_VAR
    )
    advised = _addresses(replicas, "replicas")
    if not advised and follows_advice(None, follow_advice):
        advised = _addresses(os.environ.get(REPLICAS_VAR), REPLICAS_VAR)
    if advised:
        return advised
    if not controllers:
        raise ValueError(
            f"target must be a non-empty 'host:port' string or list (or set {CONTROLLERS_VAR})"
        )
    return controllers[:1]


def _check_seconds(name: str, value: float, *, allow_zero: bool, allow_inf: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero) or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{name} is out of range: {value!r}")
