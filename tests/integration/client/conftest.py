"""Fixtures for the client runtime's integration tests: a scripted controller stand-in.

`FakeController` (tests/fake_controller.py) is a real ``grpc.aio`` server on a loopback port; see
its docstring.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from fake_controller import FakeController, fake_controllers
from support import async_wait_until, wait_until

MiB = 1 << 20


@pytest.fixture
def make_controller() -> Iterator[Callable[..., FakeController]]:
    """Starts fake controllers (arguments as `FakeController`); all are stopped at teardown."""
    yield from fake_controllers("the client")


@pytest.fixture
def controller(make_controller: Callable[..., FakeController]) -> FakeController:
    """A started fake controller that answers each Hello with 8 MiB/s."""
    return make_controller(initial_rate=8 * MiB)


@pytest.fixture
def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(name="wait_until")
def wait_until_fixture() -> Callable[..., None]:
    return wait_until


@pytest.fixture(name="async_wait_until")
def async_wait_until_fixture() -> Callable[..., object]:
    return async_wait_until


@pytest.fixture(autouse=True)
def _no_leaked_session_threads() -> Iterator[None]:
    yield
    leaked = [
        t.name
        for t in threading.enumerate()
        if t.name.startswith(("burstctl-session", "burstctl-client"))
    ]
    assert not leaked, f"session threads still running after the test: {leaked}"
