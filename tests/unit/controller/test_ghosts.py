"""The rates of sessions whose clients gave their streams up (controller/ghosts.py), and the
rates a client declares as its stream opens (Hello.pacing_rate, Hello.allotted), checked like
any field; a restart's reserve and the file it comes from."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support.clock import FakeClock
from support.grpc import hello

from burstctl.controller.ghosts import IN_FORCE_FILE, Ghosts, InForce
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


@pytest.mark.parametrize("name", ["pacing_rate", "allotted"])
@pytest.mark.parametrize("rate", [-1.0, math.nan, math.inf])
def test_a_bad_declared_rate_is_a_protocol_error_naming_the_field(rate: float, name: str) -> None:
    msg = hello("j", 2, user="ann", group="phys")
    setattr(msg.hello, name, rate)
    with pytest.raises(ProtocolError) as caught:
        validate_hello(msg)
    assert caught.value.field == f"hello.{name}"


def test_a_restarts_reserve_shrinks_as_clients_come_back_and_ends_after_its_retention() -> None:
    clock = FakeClock()
    ghosts = Ghosts(retention=3.0, clock=clock)
    ghosts.reserve(10.0, 4.0, retention=35.0)
    assert ghosts.reserved() == (10.0, 4.0)
    assert not ghosts.claim(("c1", "job", False), 3.0)  # no ghost: its rate leaves the reserve
    assert not ghosts.claim(("c2", "job", True), 5.0)  # declared more than is left: 0, not less
    assert ghosts.reserved() == (7.0, 0.0)
    clock.advance(34.9)
    assert not ghosts.expire()
    clock.advance(0.2)
    assert ghosts.expire()  # the clients not back by now pace at their budget shares at most
    assert ghosts.reserved() == (0.0, 0.0)


def test_the_rates_in_force_are_saved_when_they_change_and_read_back(tmp_path: Path) -> None:
    rates = [(30.0, 2.0)]
    ghosts = Ghosts(retention=3.0, clock=FakeClock())
    ghosts.add(("c1", "job", False), 5.0)
    store = InForce(tmp_path, lambda: rates[0], ghosts)
    assert store.version != store.saved_version
    store.write(store.snapshot())
    store.saved_version = store.version
    assert store.version == store.saved_version  # unchanged: nothing to save
    assert InForce(tmp_path, lambda: (0.0, 0.0), ghosts).load() == (35.0, 2.0)
    rates[0] = (20.0, 2.0)
    assert store.version != store.saved_version
    store.final = True  # the replica stops: what it saved last stands
    assert store.version == store.saved_version


@pytest.mark.parametrize(
    "text", ["{", '{"format": 2, "app": 1, "drain": 0}', '{"format": 1, "app": -1, "drain": 0}']
)
def test_an_unreadable_file_of_rates_in_force_is_kept_aside(tmp_path: Path, text: str) -> None:
    (tmp_path / IN_FORCE_FILE).write_text(text)
    store = InForce(tmp_path, lambda: (0.0, 0.0), Ghosts(retention=3.0, clock=FakeClock()))
    assert store.load() == (0.0, 0.0)
    assert (tmp_path / f"{IN_FORCE_FILE}.unreadable-1").read_text() == text
