"""Helpers shared by the test suites: condition waits and a controller in a subprocess."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx


def clean_env(prefixes: tuple[str, ...] = ("BURSTCTL_",)) -> dict[str, str]:
    """This process's environment without the variables that start with ``prefixes``: the
    settings of whoever runs the tests (``BURSTCTL_CONTROLLER``, a Slurm job's ids) must not
    reach the commands under test."""
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


def run_burstctl(
    *args: str | Path,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    stdin: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m burstctl ARGS`` with this interpreter, its output captured as text.

    ``env``: the child's whole environment (default: this process's; `clean_env` leaves the
    runner's own settings out). ``stdin``: e.g. ``subprocess.DEVNULL`` for a command that must
    not read the runner's (a daemonized mount keeps what it inherits).
    """
    return subprocess.run(
        [sys.executable, "-m", "burstctl", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else dict(env),
        stdin=stdin,
        check=False,
    )


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


def free_port() -> int:
    """A loopback port nobody listened on a moment ago, for a server that must know its port
    before it starts (a replica's peers). Bind-and-close leaves a tiny window for another
    process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_SERVING = re.compile(r"serving gRPC on (\S+)")
_SERVING_REST = re.compile(r"serving REST on (\S+)")


class ControllerProcess:
    """``burstctl controller`` in a child process on a loopback port chosen by the OS.

    Stopped by pid (SIGTERM, then SIGKILL) in ``stop()``; the log is kept for failures.
    ``python_args`` go to the interpreter before ``-m burstctl`` (a benchmark runs the
    controller under ``-m cProfile -o FILE``).
    """

    def __init__(
        self,
        state_dir: Path,
        args: Sequence[str] = (),
        address: str = "127.0.0.1:0",
        env: dict[str, str] | None = None,
        python_args: Sequence[str] = (),
    ) -> None:
        self.state_dir = state_dir
        self.args = list(args)
        self.python_args = list(python_args)
        self.requested_address = address
        self.env = env
        self.address: str | None = None
        self.url: str | None = None  # REST base URL
        self.log: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()

    def start(self, timeout: float = 20.0) -> ControllerProcess:
        env = clean_env()
        env.update(self.env or {})
        self._ready.clear()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                *self.python_args,
                "-m",
                "burstctl",
                "controller",
                "--grpc-listen",
                self.requested_address,
                "--http-listen",
                "127.0.0.1:0",
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
            m = _SERVING_REST.search(line)
            if m:  # logged after the gRPC line: both are up
                self.url = m.group(1)
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


def jobs_of(ctl: ControllerProcess) -> dict[str, dict[str, Any]]:
    """The controller's ``/v1/jobs``, by job id."""
    return {j["job_id"]: j for j in httpx.get(f"{ctl.url}/v1/jobs", timeout=5).json()}


def booked(ctl: ControllerProcess) -> dict[str, tuple[int, int]]:
    """(bytes written, bytes read) of every job the controller knows."""
    return {j: (v["bytes_written"], v["bytes_read"]) for j, v in jobs_of(ctl).items()}


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


def measure_windows(
    pumps: Sequence[Pump], seconds: float, short: Callable[[list[float]], bool], windows: int = 2
) -> list[list[float]]:
    """``measure`` over windows of ``seconds``, one after another while ``short`` of the last
    one's rates, up to ``windows``: a loaded machine (CI's two cores) can stall a client's
    thread for part of one window, never move it faster than its allotment. So a bound from
    below holds on the last window returned, one from above on every window."""
    taken = [measure(pumps, seconds)]
    while short(taken[-1]) and len(taken) < windows:
        taken.append(measure(pumps, seconds))
    return taken


def mounted_paths() -> set[str]:
    """Mount points listed in ``/proc/self/mounts`` (octal escapes decoded).

    Unlike `os.path.ismount`, this also sees a FUSE mount whose daemon died (``ENOTCONN``).
    """
    paths = set()
    with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 2:
                paths.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]))
    return paths


def is_mounted(path: Path | str) -> bool:
    """True while anything (live or dead) is mounted on ``path``."""
    return os.path.realpath(path) in mounted_paths()


class MountProcess:
    """``burstctl mount BACKING MOUNTPOINT --foreground [extra args]`` in a child process.

    ``start()`` waits (with a deadline) until the mount answers (`os.path.ismount`); ``stop()``
    sends SIGTERM to the child *by pid*, waits for it to exit and checks that the mount point is
    unmounted. Whatever happens, ``stop()`` leaves nothing mounted: a child that does not exit
    is killed, and a mount left behind is removed with ``fusermount -u -z MOUNTPOINT`` (by path)
    — and then ``stop(check=True)`` raises, because a clean stop would not have needed that.

    Attributes: ``pid``, ``backing``, ``mountpoint``, ``args`` (the extra arguments), ``log``
    (the child's stderr lines, collected as they come; ``log_text`` joins them) and
    ``returncode`` (None while running).
    """

    def __init__(
        self,
        backing: Path,
        mountpoint: Path,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.backing = Path(backing)
        self.mountpoint = Path(mountpoint)
        self.args = list(args)
        self.env = env
        self.log: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self.returncode: int | None = None
        self._drainer: threading.Thread | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the mount was never started"
        return self.proc.pid

    @property
    def log_text(self) -> str:
        return "".join(self.log)

    def start(self, timeout: float = 20.0) -> MountProcess:
        if is_mounted(self.mountpoint):
            raise AssertionError(f"{self.mountpoint} is already a mount point")
        env = clean_env()
        env.update(self.env or {})
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "burstctl",
                "mount",
                str(self.backing),
                str(self.mountpoint),
                "--foreground",
                *self.args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._drainer = threading.Thread(target=self._drain, args=(self.proc,), daemon=True)
        self._drainer.start()
        proc = self.proc
        deadline = time.monotonic() + timeout
        while not (is_mounted(self.mountpoint) and os.path.ismount(self.mountpoint)):
            if proc.poll() is not None or time.monotonic() > deadline:
                exited = proc.poll() is not None
                self.stop(check=False)
                reason = f"exited with {proc.returncode}" if exited else f"not up in {timeout}s"
                raise AssertionError(f"burstctl mount {reason}:\n" + "".join(self.log[-40:]))
            time.sleep(0.01)  # polling the condition, with the deadline above
        return self

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.log.append(line)

    def stop(
        self, sig: int = signal.SIGTERM, timeout: float = 15.0, check: bool = True
    ) -> int | None:
        """Stops the child by pid with ``sig``; returns its exit code; idempotent.

        With ``check`` (the default) raises AssertionError if the child had to be killed, exited
        with a non-zero code, or left the mount point mounted — after cleaning up.
        """
        proc, self.proc = self.proc, None
        if proc is None:
            return self.returncode
        problems = []
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                problems.append(f"did not exit within {timeout}s of signal {sig}; killed")
                proc.kill()
                proc.wait(timeout)
        self.returncode = proc.returncode
        if self._drainer is not None:
            self._drainer.join(timeout)
        if proc.stderr is not None:
            proc.stderr.close()
        if proc.returncode != 0:
            problems.append(f"exited with code {proc.returncode}")
        if is_mounted(self.mountpoint):
            problems.append("left its mount point mounted; removed with fusermount -u -z")
            subprocess.run(
                ["fusermount", "-u", "-z", str(self.mountpoint)],
                check=False,
                capture_output=True,
                timeout=30,
            )
        if check and problems:
            raise AssertionError(
                f"burstctl mount on {self.mountpoint}: {'; '.join(problems)}\n"
                + "".join(self.log[-40:])
            )
        return self.returncode

    def __enter__(self) -> MountProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_RUN_AS = """
import __future__, errno, json, os, sys, typing, collections.abc
uid, gid, name, source, args = json.loads(sys.stdin.read())
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
namespace = {"errno": errno, "os": os, "Any": typing.Any, "Callable": collections.abc.Callable}
flags = __future__.annotations.compiler_flag
exec(compile(source, "<run_as>", "exec", flags=flags, dont_inherit=True), namespace)
print(json.dumps(namespace[name](*args)))
"""


def run_as(uid: int, gid: int, fn: Callable[..., object], *args: object) -> object:
    """Runs the module-level function ``fn(*args)`` in a new Python process that first drops
    to ``uid``/``gid`` (no supplementary groups) with ``os.setuid``; returns its JSON result.

    Needs root. ``fn`` is sent as source: it may use only ``os``, ``errno`` and what it
    imports itself (modules must be importable by ``uid``); its arguments and result must be
    JSON-serialisable. A new process, not a fork: forking a process that runs gRPC threads can
    crash the child.
    """
    import inspect
    import json

    request = json.dumps([uid, gid, fn.__name__, inspect.getsource(fn), list(args)])
    result = subprocess.run(
        [sys.executable, "-I", "-c", _RUN_AS],
        input=request,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"the child running as uid {uid} failed:\n{result.stderr}")
    return json.loads(result.stdout)
