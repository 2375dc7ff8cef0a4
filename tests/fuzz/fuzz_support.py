"""Shared pieces of the fuzz tests (their fixtures are in tests/fuzz/conftest.py): raw blocking
streams, an honest session that runs alongside the fuzzing and says whether it was ever harmed,
and a model of what the controller does with each client message.

Everything here talks to a real ``burstctl controller`` process on loopback ports
(``support.ControllerProcess``), stopped by pid when the test ends, so "the daemon never
crashed" and "its memory stayed bounded" are measured on the daemon itself.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import psutil
from hypothesis import settings
from support.grpc import hello

from burstctl.common.limits import MAX_BATCH, MAX_NODES, MAX_PRIORITY, MAX_TEXT, identifier_problem
from burstctl.proto.burstctl.v1 import controller_pb2 as pb
from burstctl.proto.burstctl.v1 import controller_pb2_grpc as pb_grpc

MiB = 1 << 20
MAX_OP_VOLUME = 2**53  # the controller's default max_op_volume (docs/configuration.md)

# `BURSTCTL_FUZZ_PROFILE=long` (bench/fuzz_long.py) runs many more examples; the default
# keeps each fuzz test well under 30 s on the project's 2-core machine.
settings.register_profile("fuzz-ci", max_examples=25, deadline=None, print_blob=True)
settings.register_profile("fuzz-long", max_examples=2000, deadline=None, print_blob=True)
FUZZ_PROFILE = "fuzz-long" if os.environ.get("BURSTCTL_FUZZ_PROFILE") == "long" else "fuzz-ci"

# A rejection, as a stream's final status or as an Error notice, is one of these
# (issue 15); an Error notice may also be NOT_FOUND for the completion of an operation
# that is not open (docs/protocol.md: a harmless client bug, the session goes on).
REJECTION_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
NOTICE_CODES = {c.name for c in REJECTION_CODES} | {"NOT_FOUND"}

# The fuzzed controller keeps the default lease (5 s, renewed at half of it): the honest
# session's allocation must be renewed within it, as a deployed client's must. Fuzz sessions
# may sit idle between steps, so the heartbeat timeout is longer than the default 3 s.
HEARTBEAT_TIMEOUT = 10.0
FUZZ_ENV = {"BURSTCTL_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT)}


class RawStream:
    """One ``Controller/Session`` stream on a blocking channel, driven message by message.

    The requests come from a queue (gRPC's own thread consumes it); a reader thread collects
    every ``ServerMessage`` and, at the end, the stream's status code and details.
    """

    _END = object()

    def __init__(self, channel: grpc.Channel) -> None:
        self._requests: queue.Queue[object] = queue.Queue()
        self._closed = False
        self.messages: list[pb.ServerMessage] = []
        self.arrived: list[float] = []  # time.monotonic() of each message, as read
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.ended = threading.Event()
        self._call = pb_grpc.ControllerStub(channel).Session(self._iterate())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _iterate(self) -> Iterator[pb.ClientMessage]:
        while (msg := self._requests.get()) is not self._END:
            yield msg  # type: ignore[misc]

    def _read(self) -> None:
        try:
            for msg in self._call:
                self.arrived.append(time.monotonic())
                self.messages.append(msg)
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            self.code = exc.code()
            self.details = exc.details() or ""
        finally:
            self.ended.set()

    def send(self, msg: pb.ClientMessage) -> None:
        if not self._closed:
            self._requests.put(msg)

    def done_writing(self) -> None:
        if not self._closed:
            self._closed = True
            self._requests.put(self._END)

    def wait_end(self, timeout: float = 10.0) -> tuple[grpc.StatusCode, str]:
        if not self.ended.wait(timeout):
            self._call.cancel()
            raise AssertionError(f"stream did not end within {timeout}s")
        assert self.code is not None
        return self.code, self.details

    def notices(self) -> list[pb.Error]:
        return [m.error for m in list(self.messages) if m.WhichOneof("body") == "error"]

    def allocations(self) -> list[pb.Allocation]:
        return [a for _, a in self.timed_allocations()]

    def timed_allocations(self) -> list[tuple[float, pb.Allocation]]:
        """Each allocation with the time the reader thread received it."""
        got = list(zip(self.arrived, self.messages, strict=False))
        return [(t, m.allocation) for t, m in got if m.WhichOneof("body") == "allocation"]

    def cancel(self) -> None:
        self.done_writing()
        self._call.cancel()


@dataclass
class HonestSession:
    """A well-behaved job that runs alongside the fuzzing: Hello, one open operation, and a
    heartbeat every ``beat`` seconds. Records when each allocation arrived.

    ``harm()`` says what went wrong, if anything: its stream ended, an allocation was not
    renewed within its lease (the client would have fallen back), or its rate is 0 although
    its operation is open.
    """

    channel: grpc.Channel
    job: str = "honest"
    beat: float = 0.1
    allocations: list[tuple[float, pb.Allocation]] = field(default_factory=list)

    def start(self) -> HonestSession:
        self._stop = threading.Event()
        self.stream = RawStream(self.channel)
        self.stream.send(hello(self.job, nodes=2, client_id="fuzz"))
        self.stream.send(pb.ClientMessage(op_posted=pb.OpPosted(op_id=1, kind=pb.OP_KIND_WRITE)))
        self._seen = 0
        self._max_gap = 0.0
        self._lock = threading.Lock()
        self._beater = threading.Thread(target=self._beat, daemon=True)
        self._beater.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.beat):  # the client's own report interval
            self._collect()
            # A job moving data flat out: it used all of its rate and waits on its bucket.
            rate = self.allocations[-1][1].rate if self.allocations else 0.0
            usage = pb.Usage(bytes=int(rate * self.beat), ops=1, interval_seconds=self.beat)
            usage.waiting = True
            self.stream.send(pb.ClientMessage(usage=usage))

    def _collect(self) -> None:
        with self._lock:
            fresh = self.stream.timed_allocations()[self._seen :]
            for at, alloc in fresh:
                if self.allocations:
                    self._max_gap = max(self._max_gap, at - self.allocations[-1][0])
                self.allocations.append((at, alloc))
            self._seen += len(fresh)

    def wait_rate(self, timeout: float = 10.0) -> None:
        from support import wait_until

        wait_until(
            lambda: self.allocations and self.allocations[-1][1].rate > 0,
            timeout,
            message="the honest session's first non-zero rate",
        )

    def harm(self) -> str | None:
        self._collect()
        if self.stream.ended.is_set():
            return f"its stream ended: {self.stream.code} {self.stream.details!r}"
        with self._lock:
            if not self.allocations:
                return "no allocation yet"
            last_at, last = self.allocations[-1]
            age = time.monotonic() - last_at
            lease = last.lease_seconds
            if self._max_gap > lease or age > lease:
                gap = max(age, self._max_gap)
                return f"allocation not renewed within its {lease}s lease (gap {gap:.2f}s)"
            if last.rate <= 0:
                return f"its rate is {last.rate} with an operation open"
        return None

    def stop(self) -> None:
        self._stop.set()
        self._beater.join(5)
        self.stream.send(pb.ClientMessage(goodbye=pb.Goodbye()))
        self.stream.done_writing()
        self.stream.wait_end(10)


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


# ---------------------------------------------------------------------------- the protocol model


@dataclass
class Fate:
    """What the controller must do with a session: go on, end it OK, or reject it."""

    ended_ok: bool = False
    broke: set[str] = field(default_factory=set)  # fields of the message that broke it

    @property
    def over(self) -> bool:
        return self.ended_ok or bool(self.broke)


@dataclass
class Model:
    stream: RawStream
    greeted: bool = False
    ops: set[int] = field(default_factory=set)
    fate: Fate = field(default_factory=Fate)
    sent: int = 0


def hello_problems(msg: pb.ClientMessage) -> set[str]:
    if msg.WhichOneof("body") != "hello":
        return {"hello"}
    h = msg.hello
    bad = {f"hello.{n}" for n in ("job_id", "user", "group") if identifier_problem(getattr(h, n))}
    bad |= {f"hello.{n}" for n in ("client_id", "host") if len(getattr(h, n)) > MAX_TEXT}
    if not 1 <= h.nodes <= MAX_NODES:
        bad.add("hello.nodes")
    priority = h.priority or 1.0
    if not (math.isfinite(priority) and 0 < priority <= MAX_PRIORITY):
        bad.add("hello.priority")
    return bad


def _finite_nonneg(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def apply(model: Model, msg: pb.ClientMessage, where: str = "") -> None:
    """What the controller does with ``msg`` on a greeted session, in the model."""
    kind = msg.WhichOneof("body")
    bad: set[str] = set()
    if kind == "usage":
        u = msg.usage
        bad |= {f"{where}usage.{n}" for n in ("bytes", "ops") if getattr(u, n) < 0}
        bad |= {
            f"{where}usage.{n}"
            for n in ("wait_seconds", "interval_seconds")
            if not _finite_nonneg(getattr(u, n))
        }
    elif kind == "op_posted":
        p = msg.op_posted
        if p.kind not in (pb.OP_KIND_READ, pb.OP_KIND_WRITE, pb.OP_KIND_METADATA):
            bad.add(f"{where}op_posted.kind")
        if not 0 <= p.volume <= MAX_OP_VOLUME:
            bad.add(f"{where}op_posted.volume")
        if p.op_id == 0 or p.op_id in model.ops:
            bad.add(f"{where}op_posted.op_id")
        if not bad:
            model.ops.add(p.op_id)
    elif kind == "op_completed":
        if msg.op_completed.op_id == 0:
            bad.add(f"{where}op_completed.op_id")
        model.ops.discard(msg.op_completed.op_id)
    elif kind == "goodbye":
        model.fate.ended_ok = True
    elif kind == "hello":
        bad.add(f"{where}hello")
    elif kind == "batch":
        if where:
            bad.add(f"{where}batch")
        elif len(msg.batch.messages) > MAX_BATCH:
            bad.add("batch.messages")
        else:
            for i, m in enumerate(msg.batch.messages):
                apply(model, m, f"batch.messages[{i}].")
                if model.fate.over:
                    break
    else:
        bad.add(f"{where}body")
    if bad:
        model.fate.broke = bad
