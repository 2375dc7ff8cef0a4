"""A session's metadata operations, paced: ops/s from its controller, apart from its bytes.

The controller may give a session a rate of metadata operations (``Allocation.metadata_rate``:
its share of its job's metadata limit, docs/client.md, "Metadata operations"). `MetadataPace`
holds it as a `Throttle` of operations, one token per operation, separate from the session's
bytes bucket, with a small burst (`metadata_burst`): a storm of creates is spread at the rate,
not let through in a block. A rate of 0 (none given, or one lifted) leaves operations unpaced
and costs them no lock.

The wait is the client runtime's one wait (`burstctl.client.waits`): a thread whose
cancellation fires (the FUSE mount's interrupted request, a killed process) stops waiting
with `Interrupted`, its token given back. The rate is kept while the controller is away (the
lease and fallback are about bytes): the last limit holds until a controller says otherwise.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from burstctl.client.bucket import Throttle

logger = logging.getLogger(__name__)

# The burst is this many seconds of operations at the rate (at least one operation).
BURST_SECONDS = 0.1


def metadata_burst(rate: float) -> float:
    """The depth of a metadata bucket of ``rate`` ops/s: ``max(1, rate · BURST_SECONDS)``."""
    return max(1.0, rate * BURST_SECONDS)


class MetadataPace:
    """The metadata bucket of one session; thread-safe. ``on_rate`` is called with each new
    rate (0: unpaced) after it is in force; it may not block."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        on_rate: Callable[[float], None] | None = None,
    ) -> None:
        self._throttle = Throttle(clock)
        self._throttle.set_rate(math.inf, 0.0)
        self._on_rate = on_rate
        # Read without the lock on the hot path: a stale 0 lets one operation through unpaced.
        self.rate = 0.0

    def set_rate(self, rate: float) -> None:
        """Paces at ``rate`` ops/s from now on (0: unpaced). A bad rate is logged and ignored."""
        if not 0.0 <= rate < math.inf:  # also NaN
            logger.error("ignoring an invalid metadata rate %r", rate)
            return
        if rate == self.rate:
            return
        if rate > 0.0:
            self._throttle.set_rate(rate, metadata_burst(rate))
        else:
            self._throttle.set_rate(math.inf, 0.0)
        self.rate = rate
        if self._on_rate is not None:
            try:
                self._on_rate(rate)
            except Exception:  # an observer's bug must not stop the session's pacing
                logger.exception("metadata rate observer failed")

    def acquire(self) -> None:
        """Blocks until one more operation is allowed (at once while unpaced). `Interrupted`
        when the thread's cancellation fires; RuntimeError once closed."""
        if self.rate > 0.0:
            self._throttle.acquire(1)

    async def acquire_async(self) -> None:
        """`acquire` for a coroutine: suspends instead of blocking."""
        if self.rate > 0.0:
            await self._throttle.acquire_async(1)

    @property
    def waiting(self) -> bool:
        """An operation waits for the bucket now."""
        return self._throttle.waiting

    @property
    def wait_seconds(self) -> float:
        """Seconds operations waited for the bucket so far."""
        return self._throttle.total_wait_seconds

    def close(self) -> None:
        """Lets every waiter go (with RuntimeError, as a closed session's bytes do)."""
        self._throttle.close()
