"""How loaded the controller's event loop is, and who a gRPC peer is.

``LoopLag`` is the probe the servicer sheds new sessions by (docs/configuration.md,
"Limits"); ``client_host`` names the host a session limit per client counts.
"""

from __future__ import annotations

import asyncio


class LoopLag:
    """How late the event loop runs a timer, probed every ``interval`` seconds.

    ``value`` follows a rise at once and decays by ``DECAY`` per probe (a half-life of about
    0.7 s), so one stall counts for a moment, not for ever; ``peak`` is the largest seen.
    """

    DECAY = 0.9

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.value = 0.0
        self.peak = 0.0

    def sample(self, late: float) -> None:
        late = max(0.0, late)
        self.value = (
            late if late > self.value else self.DECAY * self.value + (1 - self.DECAY) * late
        )
        self.peak = max(self.peak, late)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval)
            self.sample(loop.time() - start - self.interval)


def client_host(peer: str) -> str:
    """The host of a gRPC peer string: ``ipv4:10.0.0.7:5432`` → ``10.0.0.7``,
    ``ipv6:[::1]:5432`` → ``::1``; anything else (``unix:…``) as it is."""
    scheme, sep, rest = peer.partition(":")
    if not sep or scheme not in ("ipv4", "ipv6"):
        return peer
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return rest
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
