"""Many blocking sessions on one `ClientRuntime`: one loop thread, one channel, real servers."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import psutil
import pytest

from burstctl.client import ClientRuntime, JobInfo, Session

pytestmark = pytest.mark.integration

MiB = 1 << 20
KiB = 1 << 10


def job(name: str) -> JobInfo:
    return JobInfo(name, "dana", "astro")


@pytest.fixture
def runtime() -> Iterator[ClientRuntime]:
    shared = ClientRuntime()
    yield shared
    shared.close()


def hello_stream(controller: Any, job_id: str) -> int:
    controller.wait_for(lambda: any(h.job_id == job_id for h in controller.bodies("hello")))
    return next(r.stream for r in controller.received("hello") if r.message.hello.job_id == job_id)


def connections_to(port: int) -> int:
    """Established TCP connections from this process to ``port`` on loopback."""
    return sum(
        1
        for c in psutil.Process().net_connections("tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def test_sessions_on_one_runtime_share_its_thread_and_its_channel(
    controller: Any, runtime: ClientRuntime, wait_until: Callable[..., None]
) -> None:
    first = Session(controller.address, job("j0"), runtime=runtime)
    assert first.wait_attached(5)
    threads = threading.active_count()
    sessions = [first] + [
        Session(controller.address, job(f"j{i}"), runtime=runtime) for i in range(1, 25)
    ]
    for session in sessions:
        assert session.wait_attached(5)
        session.acquire(KiB)
    controller.wait_for(lambda: len(controller.bodies("hello")) == 25)
    assert threading.active_count() == threads  # no thread per session
    assert runtime.session_count == 25
    (channel,) = runtime.channels.values()
    assert all(s._core.channel is channel for s in sessions)
    wait_until(lambda: connections_to(controller.port) == 1)
    assert all(s.runtime is runtime for s in sessions)


def test_closing_one_session_leaves_the_runtime_to_the_others(
    controller: Any, runtime: ClientRuntime, wait_until: Callable[..., None]
) -> None:
    leaving = Session(controller.address, job("leaving"), runtime=runtime)
    staying = Session(controller.address, job("staying"), runtime=runtime)
    assert leaving.wait_attached(5) and staying.wait_attached(5)
    leaving_stream = hello_stream(controller, "leaving")
    (channel,) = runtime.channels.values()

    leaving.close()
    controller.wait_for(lambda: controller.received("goodbye", leaving_stream))
    assert leaving.closed and runtime.thread.is_alive()
    assert channel.get_state() != grpc.ChannelConnectivity.SHUTDOWN
    assert runtime.session_count == 1
    controller.push(2 * MiB, stream=hello_stream(controller, "staying"))
    wait_until(lambda: staying.rate == 2 * MiB)  # its stream on the shared channel still works
    start = time.monotonic()
    staying.acquire(MiB)  # paced on the shared channel's stream: ~0.5 s at 2 MiB/s
    assert time.monotonic() - start > 0.3
    late = Session(controller.address, job("late"), runtime=runtime)
    assert late.wait_attached(5)
    assert late._core.channel is channel
    assert controller.received("goodbye", hello_stream(controller, "staying")) == []


def test_closing_the_runtime_closes_every_session_then_the_channel(controller: Any) -> None:
    runtime = ClientRuntime()
    sessions = [Session(controller.address, job(f"c{i}"), runtime=runtime) for i in range(3)]
    for session in sessions:
        assert session.wait_attached(5)
    (channel,) = runtime.channels.values()
    runtime.close()
    assert not runtime.thread.is_alive()
    controller.wait_for(lambda: len(controller.received("goodbye")) == 3)
    assert all(s.closed and not s.attached for s in sessions)
    assert channel.get_state() == grpc.ChannelConnectivity.SHUTDOWN
    sessions[0].close()  # already closed with the runtime: a no-op
    with pytest.raises(RuntimeError, match="session is closed"):
        sessions[1].acquire(KiB)
    with pytest.raises(RuntimeError, match="client runtime is closed"):
        Session(controller.address, job("too-late"), runtime=runtime)
    runtime.close()  # idempotent


def test_close_soon_works_from_the_runtimes_own_thread(
    controller: Any, runtime: ClientRuntime
) -> None:
    session = Session(controller.address, job("looped"), runtime=runtime)
    assert session.wait_attached(5)
    handed: concurrent.futures.Future[concurrent.futures.Future[None]] = concurrent.futures.Future()

    def on_the_loop() -> None:
        with pytest.raises(RuntimeError, match="own thread"):
            session.close()  # would wait on the loop it runs on
        handed.set_result(session.close_soon())

    runtime.loop.call_soon_threadsafe(on_the_loop)
    handed.result(5).result(5)
    assert session.closed
    controller.wait_for(lambda: controller.received("goodbye"))


def test_sessions_of_a_runtime_fall_back_and_reattach_independently(
    make_controller: Callable[..., Any], runtime: ClientRuntime
) -> None:
    first = make_controller(initial_rate=4 * MiB, lease_seconds=0.3, renew_interval=0.1)
    sessions = [
        Session(first.address, job(f"r{i}"), "fixed:2MiB/s", runtime=runtime) for i in range(2)
    ]
    for session in sessions:
        assert session.wait_attached(5)
    first.stop()
    deadline = time.monotonic() + 3
    for session in sessions:
        while session.rate != 2 * MiB:  # the lease runs out, then the fallback applies
            session.acquire(16 * KiB)
            assert time.monotonic() < deadline, "the fallback was not applied"
        assert not session.attached
    second = make_controller(first.port, initial_rate=8 * MiB, lease_seconds=30)
    for session in sessions:
        assert session.wait_attached(5), "a session did not re-attach"
        assert session.rate == 8 * MiB
    second.wait_for(lambda: {h.job_id for h in second.bodies("hello")} == {"r0", "r1"})
    assert len(runtime.channels) == 1
