"""The rates of sessions whose clients gave their streams up (controller/ghosts.py), and the
rate a client declares as its stream opens (Hello.pacing_rate), checked like any field."""

from __future__ import annotations

import math

import pytest
from support.clock import FakeClock
from support.grpc import hello

from burstctl.controller.ghosts import Ghosts
from burstctl.controller.jobs import ProtocolError
from burstctl.controller.messages import validate_hello


def test_a_ghost_counts_until_its_client_comes_back_or_its_retention_ends() -> None:
    clock = FakeClock()
    ghosts = Ghosts(retention=3.0, clock=clock)
    ghosts.add(("c1", "job", False), 5.0)
    ghosts.add(("c2", "job", False), 2.0)
    ghosts.add(("c3", "job", True), 1.5)  # a drain stream: its own pool
    ghosts.add(("c4", "job", False), 0.0)  # nothing to count
    assert ghosts.reserved() == (7.0, 1.5) and len(ghosts) == 3
    assert ghosts.claim(("c1", "job", False))  # a new session of c1 declares its rate now
    assert not ghosts.claim(("c1", "job", False))
    assert ghosts.reserved() == (2.0, 1.5)
    clock.advance(2.9)
    assert not ghosts.expire()
    clock.advance(0.2)
    assert ghosts.expire()
    assert ghosts.reserved() == (0.0, 0.0) and len(ghosts) == 0


@pytest.mark.parametrize("rate", [-1.0, math.nan, math.inf])
def test_a_bad_pacing_rate_is_a_protocol_error_naming_the_field(rate: float) -> None:
    msg = hello("j", 2, user="ann", group="phys")
    msg.hello.pacing_rate = rate
    with pytest.raises(ProtocolError) as caught:
        validate_hello(msg)
    assert caught.value.field == "hello.pacing_rate"
