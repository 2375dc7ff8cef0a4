"""A digest on the wire: ``Digest`` to ``peer.proto``'s message and back.

``to_proto`` writes a :class:`~burstctl.controller.digest.Digest` as it is;
``from_proto`` reads one and checks it with the one check,
``controller/digest.py: validate``, so a malformed digest never leaves here. A replica
of the previous version sends no period or buffer columns, and a column that says "none" for
every job is not sent: such a column is read as "none".
docs/replicas.md, "Digests on the wire".
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from burstctl.controller.catalog import from_wire, to_wire
from burstctl.controller.digest import (
    JOB_ARRAY_FIELDS,
    JOB_TEXT_FIELDS,
    NO_BUFFER,
    NO_PATTERN,
    BufferHeader,
    Digest,
    DigestError,
    DigestJobs,
    PatternOrigin,
    validate,
)
from burstctl.proto.burstctl.v1 import peer_pb2 as pb


def to_proto(digest: Digest) -> pb.Digest:
    msg = pb.Digest(
        replica_id=digest.replica_id,
        incarnation=digest.incarnation,
        sequence=digest.sequence,
        capacity=digest.capacity,
        node_bandwidth=digest.node_bandwidth,
        policy=digest.policy,
        policy_params_json=json.dumps(dict(digest.policy_params), sort_keys=True),
        policy_version=digest.policy_version,
        policy_origin=digest.policy_origin,
        sent_at=digest.sent_at,
        base_sequence=digest.base_sequence,
        left=digest.left,
        catalog=to_wire(digest.catalog),
    )
    if digest.buffer != NO_BUFFER:
        books = digest.buffer
        msg.buffer.size, msg.buffer.used = books.size, books.used
        msg.buffer.drain_bandwidth = books.drain_bandwidth
    if digest.pattern.key:
        msg.pattern.key, msg.pattern.origin = digest.pattern.key, digest.pattern.origin
    jobs, out = digest.jobs, msg.jobs
    for name in JOB_TEXT_FIELDS:
        getattr(out, name).extend(getattr(jobs, name))
    for name in JOB_ARRAY_FIELDS:
        column = getattr(jobs, name)
        if name in _OMITTED_WHEN_NONE and _all_absent(column, _OMITTED_WHEN_NONE[name]):
            continue  # an empty column reads as "none" for every job (from_proto)
        getattr(out, name).extend(column.tolist())
    return msg


def _all_absent(column: np.ndarray, absent: Any) -> bool:
    """Every entry of ``column`` says "none": NaN, False or 0 as ``absent`` is."""
    if isinstance(absent, float) and math.isnan(absent):
        return bool(np.isnan(column).all())
    return not column.any()


# Columns not sent when they say "none" for every job (a replica of the previous version
# sends none of them), and that value.
_OMITTED_WHEN_NONE: dict[str, Any] = {
    "period_w": math.nan,
    "period_vol": math.nan,
    "period_learned": False,
    "resident": 0.0,
    "pending": 0.0,
    "mean_volume": 0.0,
}


def from_proto(msg: pb.Digest) -> Digest:
    """The digest in ``msg``, validated; raises :class:`DigestError` naming the bad field."""
    params: Any = {}
    if msg.policy_params_json:
        try:
            params = json.loads(msg.policy_params_json)
        except ValueError as exc:
            raise DigestError("policy_params_json", f"not JSON: {exc}") from None
        if not isinstance(params, dict):
            raise DigestError("policy_params_json", "must be a JSON object")
    wire = msg.jobs
    columns = {name: getattr(wire, name) for name in DigestJobs.__slots__}
    n = len(wire.job_id)
    for name, absent in _OMITTED_WHEN_NONE.items():
        if n and not columns[name]:  # none for every job, or a replica of the previous version
            columns[name] = [absent] * n
    digest = Digest(
        replica_id=msg.replica_id,
        incarnation=msg.incarnation,
        sequence=msg.sequence,
        capacity=msg.capacity,
        node_bandwidth=msg.node_bandwidth,
        policy=msg.policy,
        policy_params=params,
        policy_version=msg.policy_version,
        policy_origin=msg.policy_origin,
        jobs=DigestJobs(**columns),
        sent_at=msg.sent_at,
        base_sequence=msg.base_sequence,
        left=tuple(msg.left),
        buffer=BufferHeader(msg.buffer.size, msg.buffer.used, msg.buffer.drain_bandwidth)
        if msg.HasField("buffer")
        else NO_BUFFER,
        pattern=PatternOrigin(msg.pattern.key, msg.pattern.origin)
        if msg.pattern.key
        else NO_PATTERN,
        catalog=from_wire(msg.catalog),
    )
    validate(digest)
    return digest
