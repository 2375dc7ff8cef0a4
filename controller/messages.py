"""What a client may send on a ``Session`` stream, checked against common/limits.py.

Each check raises ``ProtocolError`` naming the field (the servicer ends that stream with
``INVALID_ARGUMENT``); ``where`` prefixes the field of a message inside a batch
(``batch.messages[3].``). A request that does not decode reaches the servicer as
``Malformed``, so it is refused the same way, not with gRPC's ``INTERNAL``.
"""

from __future__ import annotations

import math

from google.protobuf.message import DecodeError

from burstctl.common.limits import (
    MAX_NODES,
    MAX_PRIORITY,
    MAX_QUIET_SECONDS,
    MAX_TEXT,
    buffer_problem,
    identifier_problem,
    period_problem,
)
from burstctl.controller.jobs import ProtocolError
from burstctl.controller.records import Counters, JobMeta, OpKind
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

_KINDS = {
    pb.OP_KIND_READ: OpKind.READ,
    pb.OP_KIND_WRITE: OpKind.WRITE,
    pb.OP_KIND_METADATA: OpKind.METADATA,
}


INF = math.inf


class Malformed:
    """Stands for a request that did not decode; the handler rejects it."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def decode_client_message(data: bytes) -> pb.ClientMessage | Malformed:
    try:
        return pb.ClientMessage.FromString(data)
    except DecodeError as exc:
        return Malformed(exc)


def validate_hello(msg: pb.ClientMessage) -> tuple[JobMeta, str, str]:
    kind = msg.WhichOneof("body")
    if kind != "hello":
        raise ProtocolError("hello", f"the first message of a session must be hello, got {kind}")
    h = msg.hello
    for name in ("job_id", "user", "group"):
        problem = identifier_problem(getattr(h, name))
        if problem:
            raise ProtocolError(f"hello.{name}", problem)
    for name in ("client_id", "host"):
        if len(getattr(h, name)) > MAX_TEXT:
            raise ProtocolError(f"hello.{name}", f"longer than {MAX_TEXT} characters")
    if not 1 <= h.nodes <= MAX_NODES:
        raise ProtocolError("hello.nodes", f"must be in [1, {MAX_NODES}], got {h.nodes}")
    priority = h.priority or 1.0
    if not (math.isfinite(priority) and 0 < priority <= MAX_PRIORITY):
        raise ProtocolError("hello.priority", f"must be in (0, {MAX_PRIORITY:g}], got {priority}")
    for name in ("pacing_rate", "allotted"):
        rate = getattr(h, name)
        if not (math.isfinite(rate) and rate >= 0):
            raise ProtocolError(f"hello.{name}", f"must be finite and >= 0, got {rate}")
    bad_period = period_problem(h.period_w, h.period_vol)
    if bad_period is not None:
        name = "period_w" if bad_period[0] == "w" else "period_vol"
        raise ProtocolError(f"hello.{name}", bad_period[1])
    meta = JobMeta(
        job_id=h.job_id,
        user=h.user,
        group=h.group,
        nodes=h.nodes,
        priority=priority,
        w=h.period_w,
        vol_io=h.period_vol,
    )
    return meta, h.client_id, h.host


def validate_purpose(h: pb.Hello) -> bool:
    """True for a drain stream (Hello.purpose = DRAIN), False for an APP one; a drain stream
    carries no Buffer (docs/capacity.md)."""
    if h.purpose not in (pb.PURPOSE_APP, pb.PURPOSE_DRAIN):
        raise ProtocolError("hello.purpose", f"unknown purpose {h.purpose}")
    drain = h.purpose == pb.PURPOSE_DRAIN
    if drain and h.HasField("buffer"):
        raise ProtocolError("hello.buffer", "a drain stream carries no buffer report")
    return drain


def check_buffer(buffer: pb.Buffer, name: str) -> None:
    """A Buffer report against common/limits.py; ``name`` is where it was (``usage.buffer``)."""
    problem = buffer_problem(buffer.resident, buffer.pending, buffer.added, buffer.drain_error)
    if problem is not None:
        raise ProtocolError(f"{name}.{problem[0]}", problem[1])


def decoded(raw: pb.ClientMessage | Malformed) -> pb.ClientMessage:
    """The message, or ``ProtocolError`` for one that did not decode."""
    if isinstance(raw, Malformed):
        raise ProtocolError("message", f"not a valid burstctl.v1.ClientMessage ({raw.error})")
    return raw


def check_usage(u: pb.Usage, where: str) -> Counters | None:
    """A Usage report's counters checked; its cumulative totals (None: it carries none)."""
    # One test on the usual path (every report of every session comes here); the field at
    # fault is looked for only when it fails.
    if not (
        u.bytes >= 0 and u.ops >= 0 and 0 <= u.wait_seconds < INF and 0 <= u.interval_seconds < INF
    ):
        if u.bytes < 0:
            raise ProtocolError(f"{where}usage.bytes", f"must be >= 0, got {u.bytes}")
        if u.ops < 0:
            raise ProtocolError(f"{where}usage.ops", f"must be >= 0, got {u.ops}")
        for name in ("wait_seconds", "interval_seconds"):
            value = getattr(u, name)
            if not (math.isfinite(value) and value >= 0):
                raise ProtocolError(f"{where}usage.{name}", f"must be finite and >= 0, got {value}")
    return _totals(u, where) if u.HasField("totals") else None


def check_op_posted(p: pb.OpPosted, where: str, max_op_volume: int) -> OpKind:
    """An OpPosted's kind and volume checked (its id is the job table's to check)."""
    op_kind = _KINDS.get(p.kind)
    if op_kind is None:
        raise ProtocolError(f"{where}op_posted.kind", f"unknown operation kind {p.kind}")
    if not 0 <= p.volume <= max_op_volume:
        raise ProtocolError(
            f"{where}op_posted.volume",
            f"must be in [0, {max_op_volume}] bytes (0 = unknown), got {p.volume}",
        )
    return op_kind


def check_op_completed(c: pb.OpCompleted, where: str) -> float:
    """An OpCompleted's id and quiet gap checked; the quiet gap (seconds)."""
    if c.op_id <= 0:
        raise ProtocolError(f"{where}op_completed.op_id", "must be > 0")
    quiet = c.quiet_seconds
    if not (math.isfinite(quiet) and 0.0 <= quiet <= MAX_QUIET_SECONDS):
        raise ProtocolError(
            f"{where}op_completed.quiet_seconds",
            f"must be finite and in [0, {MAX_QUIET_SECONDS:g}] s, got {quiet}",
        )
    return quiet


def _totals(u: pb.Usage, where: str) -> Counters:
    """The session's cumulative counters of a Usage, checked."""
    t = u.totals
    counters = Counters(
        bytes=t.bytes,
        bytes_read=t.bytes_read,
        bytes_written=t.bytes_written,
        ops=t.ops,
        metadata_ops=t.metadata_ops,
        wait_seconds=t.wait_seconds,
    )
    c = counters
    if (
        min(c.bytes, c.bytes_read, c.bytes_written, c.ops, c.metadata_ops) >= 0
        and 0 <= c.wait_seconds < INF
        and c.bytes_read + c.bytes_written <= c.bytes
        and c.metadata_ops <= c.ops
    ):
        return counters
    name = f"{where}usage.totals"
    for field_name in ("bytes", "bytes_read", "bytes_written", "ops", "metadata_ops"):
        value = getattr(t, field_name)
        if value < 0:
            raise ProtocolError(f"{name}.{field_name}", f"must be >= 0, got {value}")
    if not (math.isfinite(t.wait_seconds) and t.wait_seconds >= 0):
        raise ProtocolError(
            f"{name}.wait_seconds", f"must be finite and >= 0, got {t.wait_seconds}"
        )
    if t.bytes_read + t.bytes_written > t.bytes:
        raise ProtocolError(f"{name}.bytes", f"bytes_read + bytes_written exceed bytes ({t.bytes})")
    raise ProtocolError(f"{name}.metadata_ops", f"exceeds ops ({t.ops})")
