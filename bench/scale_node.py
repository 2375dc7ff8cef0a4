"""The load generator of ``bench/scale.py``: one process acting as compute nodes.

A generator holds one gRPC channel per replica and runs its share of the sessions over them,
on one event loop, as a `ClientRuntime` does (and as a node's one multiplexed connection per
replica will). It reads its spec (JSON) on stdin, runs until ``t0 + ramp + seconds`` (wall
clock, shared by every generator) and writes its result (JSON) to ``spec["out"]``: a file,
so a large result never blocks on a pipe the parent is not reading yet.

Each session is ``[job_id, user, nodes, replica, start_s]`` and acquires ``chunk`` bytes
every ``period`` seconds from ``start_s`` on (its application's own pace: a late chunk is not
caught up with a burst). Two kinds of session:

- the client runtime (default): a `SessionCore` with its stream, throttle and fallback; the
  bytes counted are those ``acquire_async`` granted;
- ``raw``: the session speaks the protocol itself, at a fraction of the client's cost, so
  that the controller is what is measured. Hello, one OpPosted, then a Usage every 0.25 s
  with the bytes its application moved: what it wants (chunk/period) capped by the rate of
  the allocation in force, 0 while it has none (never attached, or its lease ran out: a
  strict fallback). A refusal with ``retry-after-ms`` waits that long (jittered like the
  client) and says Hello again.

Every ``SAMPLE`` seconds the generator adds up, per replica, the sessions started, attached,
unthrottled (rate = inf: a fallback running loose), the bytes granted and (raw) the rates in
force. Per session it keeps the attach latency (from its start to its first allocation) and
the bytes granted between the end of the ramp and the end of the run. A log handler counts
lease expiries, attach timeouts, refusals and stream ends by status code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

MiB = 1 << 20
SAMPLE = 0.5  # s between a generator's samples
REPORT = 0.25  # s between two Usage reports (the client's default heartbeat)
LINGER = 0.01  # s a raw node stream lets messages gather (the client runtime's)
CLOSE_TIMEOUT = 10.0  # s the sessions get to say Goodbye at the end
_ENDED = re.compile(r"ended: ([A-Z_]+)")


class _Count(logging.Handler):
    """Counts what the client runtime logs about its sessions' streams."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "lease expired" in text:
            self.counts["lease_expiries"] += 1
        elif "no allocation within" in text:
            self.counts["attach_timeouts"] += 1
        elif "RESOURCE_EXHAUSTED" in text or "refused the session" in text:
            self.counts["refusals"] += 1
        elif m := _ENDED.search(text):
            self.counts[f"ended_{m.group(1)}"] += 1


class Generator:
    """The sessions of one generator process, their pacing and the samples."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.loop = asyncio.get_running_loop()
        self.sessions: list[list[Any]] = spec["sessions"]
        self.replicas = len(spec["targets"])
        n = len(self.sessions)
        self.want = spec["chunk"] / spec["period"]  # bytes/s each session's application wants
        self.moved = [0.0] * n
        self.attached_at: list[float | None] = [None] * n  # s after the session's start
        self.started = [False] * n
        self.counts: Counter[str] = Counter()
        self.stop = asyncio.Event()
        self.end = spec["t0"] + spec["ramp"] + spec["seconds"]

    def at(self, wall: float) -> float:
        """Loop time of the wall-clock instant ``wall``."""
        return self.loop.time() + (wall - time.time())

    async def until(self, wall: float) -> None:
        await asyncio.sleep(max(0.0, self.at(wall) - self.loop.time()))

    async def paced(self, i: int, acquire: Callable[[], Awaitable[object]]) -> None:
        """The application of session ``i``: ``chunk`` bytes every ``period``, granted by
        ``acquire``, until the run ends."""
        chunk, period = self.spec["chunk"], self.spec["period"]
        next_at = self.loop.time()
        while not self.stop.is_set():
            await acquire()
            self.moved[i] += chunk
            next_at = max(next_at + period, self.loop.time() - period)
            delay = next_at - self.loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the application's own pace

    def granted(self, i: int, dt: float, rate: float) -> float:
        """What raw session ``i``'s application moved in ``dt`` seconds at ``rate`` in force."""
        got = min(self.want, rate) * dt
        self.moved[i] += got
        return got

    def usage(self, pb: Any, nbytes: float, span: float, rate: float) -> Any:
        """A raw session's Usage of ``nbytes`` over ``span`` seconds at ``rate`` in force: it
        waited on its bucket whenever the rate is below what its application wants."""
        short = rate < self.want
        return pb.Usage(
            bytes=int(nbytes),
            interval_seconds=span,
            wait_seconds=span * (1 - rate / self.want) if short else 0.0,
            waiting=short,
        )

    def attached(self, i: int, began: float) -> None:
        if self.attached_at[i] is None:
            self.attached_at[i] = self.loop.time() - began

    async def run(
        self,
        one: Callable[[int], Awaitable[None]],
        sample: Callable[[int], tuple[bool, bool, float]],
        close: Callable[[], Awaitable[object]],
    ) -> dict[str, Any]:
        """Runs ``one(i)`` for every session and samples until the end; ``sample(i)`` gives
        (attached, unthrottled, rate in force) of a started session."""
        tasks = [asyncio.create_task(one(i)) for i in range(len(self.sessions))]
        samples: list[list[list[float]]] = []
        k, lag = 0, 0.0
        from_k = round(self.spec["ramp"] / SAMPLE)
        moved_from = list(self.moved)
        cpu: list[tuple[float, float]] = []  # (wall, this process's CPU) at from_k and the end
        while (wall := self.spec["t0"] + k * SAMPLE) <= self.end:
            await self.until(wall)
            lag = max(lag, self.loop.time() - self.at(wall))  # how late this sample ran
            rows = [[0.0] * 5 for _ in range(self.replicas)]  # started, att, loose, moved, force
            for i, s in enumerate(self.sessions):
                row = rows[s[3]]
                row[3] += self.moved[i]
                if self.started[i]:
                    attached, loose, in_force = sample(i)
                    row[0] += 1
                    row[1] += attached
                    row[2] += loose
                    row[4] += in_force
            samples.append(rows)
            if k == from_k:
                moved_from = list(self.moved)
                cpu.append((time.time(), time.process_time()))
            k += 1
        cpu.append((time.time(), time.process_time()))
        self.stop.set()
        window = [b - a for a, b in zip(moved_from, self.moved, strict=True)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await asyncio.wait_for(close(), CLOSE_TIMEOUT)
        except TimeoutError:
            self.counts["close_timeouts"] += 1
        return {
            "samples": samples,
            "attach_s": self.attached_at,
            "window_bytes": window,
            "counts": dict(self.counts),
            "loop_lag_max": lag,
            # every thread of the process (loop and gRPC core), over the measured part
            "cpu_cores": (cpu[-1][1] - cpu[0][1]) / max(1e-9, cpu[-1][0] - cpu[0][0]),
        }


async def runtime_node(spec: dict[str, Any]) -> dict[str, Any]:
    """Sessions of the client runtime, one `SessionCore` each, on one channel and node stream
    per replica (or one Session stream per session, ``node_streams`` false)."""
    from burstctl.client.channel import open_channel
    from burstctl.client.core import SessionCore
    from burstctl.client.job import JobInfo
    from burstctl.client.link import NodeLink
    from burstctl.client.options import SessionOptions

    counter = _Count()
    stream_log = logging.getLogger("burstctl.client.stream")
    stream_log.addHandler(counter)
    stream_log.setLevel(logging.DEBUG)
    stream_log.propagate = False

    gen = Generator(spec)
    links = [
        NodeLink(open_channel(t), node_streams=spec.get("node_streams", True))
        for t in spec["targets"]
    ]
    cores: list[SessionCore | None] = [None] * len(gen.sessions)

    async def one(i: int) -> None:
        job_id, user, nodes, replica, start_s = gen.sessions[i]
        await gen.until(spec["t0"] + start_s)
        options = SessionOptions.build(
            spec["targets"][replica],
            JobInfo(job_id, user, "g", nodes),
            spec["fallback"],
            report_interval=REPORT,
            quiet_gap=5 * spec["period"],  # one operation open for the whole run
            attach_timeout=spec["attach_timeout"],
            client_id=f"{job_id}-r{replica}",
        )
        core = cores[i] = SessionCore(options)
        began = gen.loop.time()
        await core.start(links[replica])
        gen.started[i] = True

        async def watch() -> None:
            if await core.wait_attached_async(None):
                gen.attached(i, began)

        watcher = asyncio.create_task(watch())
        try:
            await gen.paced(i, lambda: core.acquire_async(spec["chunk"]))
        finally:
            watcher.cancel()

    def sample(i: int) -> tuple[bool, bool, float]:
        core = cores[i]
        assert core is not None
        return core.attached, core.rate == float("inf"), min(gen.want, core.rate)

    async def close() -> None:
        await asyncio.gather(*(c.close() for c in cores if c is not None), return_exceptions=True)
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)
        await asyncio.gather(*(link.channel.close() for link in links), return_exceptions=True)

    result = await gen.run(one, sample, close)
    result["counts"].update(counter.counts)
    return result


async def raw_node(spec: dict[str, Any]) -> dict[str, Any]:
    """Sessions that speak the protocol themselves (module docstring), one channel per
    replica."""
    from burstctl.common.limits import RETRY_AFTER_KEY
    from burstctl.proto.burstctl.v1 import controller_pb2 as pb
    from burstctl.proto.burstctl.v1 import controller_pb2_grpc as pb_grpc

    gen = Generator(spec)
    channels = [grpc.aio.insecure_channel(t) for t in spec["targets"]]
    stubs = [pb_grpc.ControllerStub(ch) for ch in channels]
    n = len(gen.sessions)
    rate = [0.0] * n
    lease_end = [0.0] * n  # loop time

    def in_force(i: int, now: float) -> float:
        return rate[i] if now < lease_end[i] else 0.0

    async def one(i: int) -> None:
        job_id, user, nodes, replica, start_s = gen.sessions[i]
        await gen.until(spec["t0"] + start_s)
        began = gen.loop.time()
        gen.started[i] = True
        hello = pb.ClientMessage(hello=pb.Hello(job_id=job_id, user=user, group="g", nodes=nodes))
        backoff = 0.05  # the client's: doubling up to 2 s, reset by an allocation
        while not gen.stop.is_set():
            call = stubs[replica].Session()
            try:
                await call.write(hello)
                await call.write(
                    pb.ClientMessage(op_posted=pb.OpPosted(op_id=1, kind=pb.OP_KIND_WRITE))
                )

                async def beat(call: grpc.aio.StreamStreamCall = call) -> None:
                    last = gen.loop.time()
                    while True:
                        await asyncio.sleep(REPORT)
                        now = gen.loop.time()
                        dt, r = now - last, in_force(i, now)
                        usage = gen.usage(pb, gen.granted(i, dt, r), dt, r)
                        await call.write(pb.ClientMessage(usage=usage))
                        last = now

                beater = asyncio.create_task(beat())
                try:
                    while (msg := await call.read()) is not grpc.aio.EOF:
                        if msg.WhichOneof("body") == "allocation":
                            now = gen.loop.time()
                            if now >= lease_end[i] > 0:
                                gen.counts["lease_expiries"] += 1
                            rate[i] = msg.allocation.rate
                            lease_end[i] = now + msg.allocation.lease_seconds
                            backoff = 0.05
                            gen.attached(i, began)
                finally:
                    beater.cancel()
                await call.code()
            except grpc.aio.AioRpcError as err:
                lease_end[i] = 0.0
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    gen.counts["refusals"] += 1
                    hint = dict(err.trailing_metadata() or ()).get(RETRY_AFTER_KEY)
                    delay = float(hint) / 1000 if hint else 1.0
                    await asyncio.sleep(delay * random.uniform(1.0, 1.5))
                else:
                    gen.counts[f"ended_{err.code().name}"] += 1
                    await asyncio.sleep(random.uniform(backoff / 2, backoff))
                    backoff = min(2.0, 2 * backoff)
            except asyncio.CancelledError:
                call.cancel()
                raise

    def sample(i: int) -> tuple[bool, bool, float]:
        now = gen.loop.time()
        return now < lease_end[i], False, min(gen.want, in_force(i, now))

    async def close() -> None:
        await asyncio.gather(*(ch.close() for ch in channels), return_exceptions=True)

    return await gen.run(one, sample, close)


async def raw_node_stream(spec: dict[str, Any]) -> dict[str, Any]:
    """Sessions that speak the protocol themselves on one Node stream per replica (module
    docstring): what comes in queued and written every ``LINGER`` as one Batch."""
    from burstctl.proto.burstctl.v1 import controller_pb2 as pb
    from burstctl.proto.burstctl.v1 import controller_pb2_grpc as pb_grpc

    gen = Generator(spec)
    channels = [grpc.aio.insecure_channel(t) for t in spec["targets"]]
    n = len(gen.sessions)
    rate = [0.0] * n
    lease_end = [0.0] * n  # loop time
    heartbeat = [REPORT] * n
    began = [0.0] * n  # loop time of the session's start
    tag_of = [0] * n  # the session's tag on its replica's stream (0: none open)
    by_tag: list[dict[int, int]] = [{} for _ in channels]  # tag -> session
    tags = [1] * len(channels)
    queues: list[list[pb.ClientMessage]] = [[] for _ in channels]
    calls = [pb_grpc.ControllerStub(ch).Node() for ch in channels]

    def in_force(i: int, now: float) -> float:
        return rate[i] if now < lease_end[i] else 0.0

    def hello(i: int) -> None:
        job_id, user, nodes, replica, _ = gen.sessions[i]
        tag = tags[replica]
        tags[replica] += 1
        tag_of[i], by_tag[replica][tag] = tag, i
        queues[replica] += [
            pb.ClientMessage(
                session=tag, hello=pb.Hello(job_id=job_id, user=user, group="g", nodes=nodes)
            ),
            pb.ClientMessage(session=tag, op_posted=pb.OpPosted(op_id=1, kind=pb.OP_KIND_WRITE)),
        ]

    async def write(r: int) -> None:
        await calls[r].initial_metadata()
        while not gen.stop.is_set():
            await asyncio.sleep(LINGER)
            batch, queues[r] = queues[r][:1024], queues[r][1024:]
            if batch:
                await calls[r].write(pb.ClientMessage(batch=pb.Batch(messages=batch)))

    async def read(r: int) -> None:
        while (msg := await calls[r].read()) is not grpc.aio.EOF:
            now = gen.loop.time()
            inner = msg.batch.messages if msg.WhichOneof("body") == "batch" else [msg]
            for one in inner:
                body = one.WhichOneof("body")
                if body == "renew":
                    for j in by_tag[r].values():
                        if lease_end[j] > now:
                            lease_end[j] = now + one.renew.lease_seconds
                    continue
                if one.session not in by_tag[r]:
                    continue
                i = by_tag[r][one.session]
                if body == "allocation":
                    a = one.allocation
                    if now >= lease_end[i] > 0:
                        gen.counts["lease_expiries"] += 1
                    if a.rate < rate[i]:  # acknowledged at once: others' increases wait on it
                        queues[r].append(
                            pb.ClientMessage(
                                session=one.session, usage=pb.Usage(applied_epoch=a.epoch)
                            )
                        )
                    rate[i], lease_end[i] = a.rate, now + a.lease_seconds
                    heartbeat[i] = a.heartbeat_seconds or REPORT
                    gen.attached(i, began[i])
                elif body == "end":
                    del by_tag[r][one.session]
                    tag_of[i], lease_end[i] = 0, 0.0
                    gen.counts[
                        "refusals"
                        if one.end.code == "RESOURCE_EXHAUSTED"
                        else f"ended_{one.end.code}"
                    ] += 1
                    delay = one.end.retry_after_ms / 1000 or 1.0
                    gen.loop.call_later(delay * random.uniform(1.0, 1.5), hello, i)

    async def one(i: int) -> None:
        replica, start_s = gen.sessions[i][3:5]
        await gen.until(spec["t0"] + start_s)
        began[i] = gen.loop.time()
        gen.started[i] = True
        hello(i)
        last = said_at = gen.loop.time()
        said = (0.0, False)
        moved = 0.0
        while True:
            await asyncio.sleep(REPORT)
            now = gen.loop.time()
            dt, r = now - last, in_force(i, now)
            moved += gen.granted(i, dt, r)
            last = now
            short = r < gen.want  # the application waited on its bucket
            rate_now = moved / max(1e-9, now - said_at)
            new = short != said[1] or abs(rate_now - said[0]) > 0.1 * said[0]
            if tag_of[i] and (new or now - said_at >= heartbeat[i]):
                usage = gen.usage(pb, moved, now - said_at, r)
                queues[replica].append(pb.ClientMessage(session=tag_of[i], usage=usage))
                said, said_at, moved = (rate_now, short), now, 0.0

    def sample(i: int) -> tuple[bool, bool, float]:
        now = gen.loop.time()
        return now < lease_end[i], False, min(gen.want, in_force(i, now))

    streams = [asyncio.create_task(f(r)) for r in range(len(channels)) for f in (write, read)]

    async def close() -> None:
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
        for call in calls:
            call.cancel()
        await asyncio.gather(*(ch.close() for ch in channels), return_exceptions=True)

    return await gen.run(one, sample, close)


def main() -> None:
    spec = json.loads(sys.stdin.read())
    if not spec["raw"]:
        node = runtime_node(spec)
    elif spec.get("node_streams", True):
        node = raw_node_stream(spec)
    else:
        node = raw_node(spec)
    result = asyncio.run(node)
    with open(spec["out"], "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
