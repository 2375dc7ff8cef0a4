"""Helpers shared by the test suites: condition waits and a controller in a subprocess."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path


def wait_until(
    predicate: Callable[[], object],
    timeout: float = 5.0,
    interval: float = 0.005,
    message: str = "condition",
) -> object:
    """Polls ``predicate`` until it is truthy; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


async def async_wait_until(
    predicate: Callable[[], object | Awaitable[object]],
    timeout: float = 5.0,
    interval: float = 0.005,
    message: str = "condition",
) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(interval)


_SERVING = re.compile(r"serving gRPC on (\S+)")


class ControllerProcess:
    """``burstctl controller`` in a child process on a loopback port chosen by the OS.

    Stopped by pid (SIGTERM, then SIGKILL) in ``stop()``; the log is kept for failures.
    """

    def __init__(
        self,
        state_dir: Path,
        args: Sequence[str] = (),
        address: str = "127.0.0.1:0",
        env: dict[str, str] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.args = list(args)
        self.requested_address = address
        self.env = env
        self.address: str | None = None
        self.log: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()

    def start(self, timeout: float = 20.0) -> ControllerProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BURSTCTL_")}
        env.update(self.env or {})
        self._ready.clear()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "burstctl",
                "controller",
                "--grpc-listen",
                self.requested_address,
                "--state-dir",
                str(self.state_dir),
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._drainer = threading.Thread(target=self._drain, args=(self.proc,), daemon=True)
        self._drainer.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise AssertionError("controller did not start:\n" + "".join(self.log[-30:]))
        return self

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.log.append(line)
            m = _SERVING.search(line)
            if m:
                self.address = m.group(1)
                self._ready.set()
        self._ready.set()  # exited: unblock start()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self._drainer.join(timeout)  # reads the pipe to EOF: the whole log is in
        if proc.stderr is not None:
            proc.stderr.close()
        return proc.returncode

    def __enter__(self) -> ControllerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Pump:
    """A thread that acquires ``chunk`` bytes at a time, flat out or at its own ``pace``.

    ``moved`` counts granted bytes; ``errors`` collects anything acquire raised
    (the runtime promises nothing is raised into the application's I/O).
    """

    def __init__(
        self,
        session: object,
        chunk: int = 64 * 1024,
        pace: float | None = None,
        kind: str = "write",
    ) -> None:
        self.session = session
        self.chunk = chunk
        self.pace = pace  # bytes/s this "application" wants at most; None = as fast as it can
        self.kind = kind
        self.moved = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Pump:
        self._thread.start()
        return self

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.session.acquire(self.chunk, self.kind)  # type: ignore[attr-defined]
            except BaseException as exc:  # recorded and asserted on by the test
                self.errors.append(exc)
                return
            self.moved += self.chunk
            if self.pace is not None:
                # The application's own pacing (it only ever wants `pace`), not
                # synchronisation. A late chunk is not caught up with a burst: the
                # application never asks for more than `pace`.
                next_at = max(next_at, time.monotonic() - 0.02) + self.chunk / self.pace
                ahead = next_at - time.monotonic()
                if ahead > 0:
                    self._stop.wait(ahead)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def measure(pumps: Sequence[Pump], seconds: float) -> list[float]:
    """Bytes/s of each pump over the same window of ``seconds``."""
    starts = [p.moved for p in pumps]
    t0 = time.monotonic()
    deadline = t0 + seconds
    while (left := deadline - time.monotonic()) > 0:
        threading.Event().wait(min(left, 0.05))  # the measurement window itself
    elapsed = time.monotonic() - t0
    return [(p.moved - s) / elapsed for p, s in zip(pumps, starts, strict=True)]
