"""The channel to a controller replica, and how a session's stream comes back to it.

A session streams over a ``grpc.aio`` channel (`open_channel`), which reconnects by itself with
`CHANNEL_OPTIONS` while the controller is unreachable. A stream the controller ends is opened
again after a `Backoff` (a controller that rejects what it is sent is never retried in a hot
loop), or no sooner than the `retry_hint` of a controller that shed it for load. `REFUSALS` are
the endings that say the controller will not take the session as it is.
"""

from __future__ import annotations

import random

import grpc

from burstctl.common.channels import PLAIN, ChannelSecurity
from burstctl.common.limits import RETRY_AFTER_KEY

# gRPC reconnects the channel itself with these: start at 50 ms, cap at 2 s (with gRPC's own
# jitter); a connection attempt may take up to 1 s before it counts as failed.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.min_reconnect_backoff_ms", 1000),
)


# The longest retry hint obeyed: a controller cannot park a client for longer than this.
MAX_RETRY_AFTER = 300.0


def retry_hint(err: grpc.aio.AioRpcError) -> float | None:
    """Seconds a controller that refused the stream for load asks us to wait, or None.

    The hint is the trailing metadata ``retry-after-ms`` of a ``RESOURCE_EXHAUSTED``
    (docs/protocol.md); a missing or malformed one is no hint.
    """
    if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            try:
                ms = float(value)
            except (TypeError, ValueError):
                return None
            return min(ms / 1000, MAX_RETRY_AFTER) if ms >= 0 else None
    return None


# Stream endings that say the controller will not take this session as it is (docs/security.md).
REFUSALS = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


def open_channel(target: str, security: ChannelSecurity = PLAIN) -> grpc.aio.Channel:
    """A channel to ``target`` with the client's reconnect settings and ``security``'s
    credentials (on the running loop)."""
    return security.open(target, CHANNEL_OPTIONS)


class Backoff:
    """Exponential backoff with jitter between two stream attempts on a connected channel.

    The channel's own reconnect backoff covers an unreachable controller; this one covers a
    controller that is reachable but ends the stream (e.g. INVALID_ARGUMENT), so the client never
    retries in a hot loop. Delays are drawn in ``[d/2, d]`` with ``d`` doubling up to ``maximum``.
    """

    def __init__(
        self, initial: float = 0.05, maximum: float = 2.0, rng: random.Random | None = None
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError("backoff needs 0 < initial <= maximum")
        self._initial = initial
        self._maximum = maximum
        self._rng = rng or random.Random()
        self._attempt = 0

    def next_delay(self) -> float:
        ceiling = min(self._maximum, self._initial * 2.0 ** min(self._attempt, 60))
        self._attempt += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._attempt = 0
