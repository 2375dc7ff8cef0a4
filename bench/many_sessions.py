"""Many light sessions on one controller: attached, within capacity, or refused — never loose.

Starts a controller (``burstctl controller`` on loopback ports, a temporary state directory,
its limits from ``--max-sessions`` and friends) and ``--workers`` client processes. Each worker
runs its share of ``--sessions`` sessions on one event loop over one gRPC channel (as a
`ClientRuntime` does), every session its own job, each acquiring ``--chunk`` bytes every
``--period`` seconds (by default 64 KiB every 100 ms: 640 KiB/s each, so 5,000 sessions want
~3 GiB/s of a 1 GiB/s controller). Sessions start spread over ``--ramp`` seconds; then the run
is measured for ``--seconds``.

Every 0.5 s each worker samples its sessions: attached, unthrottled (rate = inf: a fallback
running loose), bytes granted. A log handler counts lease expiries, attach timeouts and
refusals (RESOURCE_EXHAUSTED). The controller's log gives heartbeat closures and its final
stats (``refused_sessions``). Prints one JSON object:

- ``attached_end`` / ``sessions``: attached at the end; ``never_attached``;
- ``aggregate_max_mib_s`` over 1 s windows after the ramp, against ``capacity_mib_s`` and
  ``capacity_mib_s · (1 + push_tolerance)``: ``over_capacity_windows``;
- ``unthrottled_max``: most sessions unthrottled at one sample (must be 0);
- ``lease_expiries``, ``attach_timeouts``, ``refusals`` (client side), ``heartbeat_closures``
  and ``refused_sessions`` (controller side);
- ``controller_cpu_s``, ``controller_rss_mib``.

Everything started is stopped by pid.

    python bench/many_sessions.py [--sessions 5000] [--workers 2] [--seconds 20] [--ramp 10]
        [--max-sessions N] [--max-sessions-per-client N] [--fallback keep-last]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import ControllerProcess

MiB = 1 << 20
SAMPLE = 0.5  # s between a worker's samples
_STATS = re.compile(r"stopped; stats: (\{.*\})")


# ---------------------------------------------------------------------------- a worker


class _Count(logging.Handler):
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


async def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    from burstctl.client.channel import open_channel
    from burstctl.client.core import SessionCore
    from burstctl.client.job import JobInfo
    from burstctl.client.options import SessionOptions

    counter = _Count()
    stream_log = logging.getLogger("burstctl.client.stream")
    stream_log.addHandler(counter)
    stream_log.setLevel(logging.DEBUG)
    stream_log.propagate = False

    loop = asyncio.get_running_loop()
    channel = open_channel(spec["target"])
    n, first = spec["count"], spec["first"]
    moved = [0] * n
    cores: list[SessionCore | None] = [None] * n
    attached_at: list[float | None] = [None] * n  # s after t0
    started_at = [spec["ramp"] * i / max(1, n) for i in range(n)]  # s after t0
    stop = asyncio.Event()
    t0 = spec["t0"]  # wall-clock start shared by every worker (time.time())

    def at(wall: float) -> float:
        return loop.time() + (wall - time.time())

    async def one(i: int) -> None:
        await asyncio.sleep(max(0.0, at(t0 + started_at[i]) - loop.time()))
        options = SessionOptions.build(
            spec["target"],
            JobInfo(f"job-{first + i}", f"user{(first + i) % 100}", "g"),
            spec["fallback"],
            report_interval=0.25,
            quiet_gap=5 * spec["period"],  # one operation open for the whole run
            attach_timeout=spec["attach_timeout"],
            client_id=f"bench-{first + i}",
        )
        core = cores[i] = SessionCore(options)
        await core.start(channel)
        next_at = loop.time()
        while not stop.is_set():
            await core.acquire_async(spec["chunk"])
            moved[i] += spec["chunk"]
            if attached_at[i] is None and core.attached:
                attached_at[i] = time.time() - t0
            next_at = max(next_at + spec["period"], loop.time() - spec["period"])
            delay = next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the application's own pace

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    samples: list[dict[str, Any]] = []
    end = t0 + spec["ramp"] + spec["seconds"]
    k = 0
    lag = 0.0  # the worker's own loop lag: how late its samples ran
    while True:
        wall = t0 + k * SAMPLE
        if wall > end:
            break
        await asyncio.sleep(max(0.0, at(wall) - loop.time()))
        lag = max(lag, loop.time() - at(wall))
        live = [e for e in cores if e is not None]
        for i, e in enumerate(cores):
            if e is not None and attached_at[i] is None and e.attached:
                attached_at[i] = time.time() - t0
        samples.append(
            {
                "k": k,
                "started": len(live),
                "attached": sum(e.attached for e in live),
                "unthrottled": sum(e.rate == float("inf") for e in live),
                "moved": sum(moved),
            }
        )
        k += 1
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(e.close() for e in cores if e is not None), return_exceptions=True)
    await channel.close()
    return {
        "samples": samples,
        "attach_latency": [
            None if a is None else max(0.0, a - s)
            for a, s in zip(attached_at, started_at, strict=True)
        ],
        "counts": dict(counter.counts),
        "loop_lag_max": lag,
    }


async def _raw_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """``--raw``: each session speaks the protocol itself, without the client runtime.

    Hello, one OpPosted, then a Usage every 0.25 s with the bytes its application moved: what
    it wants (chunk/period) capped by the rate of the allocation in force, 0 while it has none
    (the lease ran out or it was never attached: a strict fallback). A refusal with
    ``retry-after-ms`` waits that long (jittered like the client) and says Hello again. Costs
    the load generator a fraction of the real client, so that the controller is what is
    measured.
    """
    import random

    import grpc

    from burstctl.common.limits import RETRY_AFTER_KEY
    from burstctl.proto.burstctl.v1 import controller_pb2 as pb
    from burstctl.proto.burstctl.v1 import controller_pb2_grpc as pb_grpc

    loop = asyncio.get_running_loop()
    channel = grpc.aio.insecure_channel(spec["target"])
    stub = pb_grpc.ControllerStub(channel)
    n, first, t0 = spec["count"], spec["first"], spec["t0"]
    want = spec["chunk"] / spec["period"]
    started_at = [spec["ramp"] * i / max(1, n) for i in range(n)]
    rate = [0.0] * n
    lease_end = [0.0] * n  # loop time
    moved = [0.0] * n
    attached_at: list[float | None] = [None] * n
    counts: Counter[str] = Counter()
    stop = asyncio.Event()

    def at(wall: float) -> float:
        return loop.time() + (wall - time.time())

    def in_force(i: int, now: float) -> float:
        return rate[i] if now < lease_end[i] else 0.0

    async def one(i: int) -> None:
        await asyncio.sleep(max(0.0, at(t0 + started_at[i]) - loop.time()))
        hello = pb.ClientMessage(
            hello=pb.Hello(
                job_id=f"job-{first + i}", user=f"user{(first + i) % 100}", group="g", nodes=1
            )
        )
        backoff = 0.05  # the client's: doubling up to 2 s, reset by an allocation
        while not stop.is_set():
            call = stub.Session()
            try:
                await call.write(hello)
                await call.write(
                    pb.ClientMessage(op_posted=pb.OpPosted(op_id=1, kind=pb.OP_KIND_WRITE))
                )

                async def beat(call: grpc.aio.StreamStreamCall = call) -> None:
                    last = loop.time()
                    while True:
                        await asyncio.sleep(0.25)
                        now = loop.time()
                        dt, r = now - last, in_force(i, now)
                        got = min(want, r) * dt
                        moved[i] += got
                        short = r < want  # the application waited on its bucket
                        usage = pb.Usage(
                            bytes=int(got),
                            interval_seconds=dt,
                            wait_seconds=dt * (1 - r / want) if short else 0.0,
                            waiting=short,
                        )
                        await call.write(pb.ClientMessage(usage=usage))
                        last = now

                beater = asyncio.create_task(beat())
                try:
                    while (msg := await call.read()) is not grpc.aio.EOF:
                        if msg.WhichOneof("body") == "allocation":
                            now = loop.time()
                            if now >= lease_end[i] and lease_end[i] > 0:
                                counts["lease_expiries"] += 1
                            rate[i] = msg.allocation.rate
                            lease_end[i] = now + msg.allocation.lease_seconds
                            backoff = 0.05
                            if attached_at[i] is None:
                                attached_at[i] = time.time() - t0
                finally:
                    beater.cancel()
                await call.code()
            except grpc.aio.AioRpcError as err:
                lease_end[i] = 0.0
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    counts["refusals"] += 1
                    hint = dict(err.trailing_metadata() or ()).get(RETRY_AFTER_KEY)
                    delay = float(hint) / 1000 if hint else 1.0
                    await asyncio.sleep(delay * random.uniform(1.0, 1.5))
                else:
                    counts[f"ended_{err.code().name}"] += 1
                    await asyncio.sleep(random.uniform(backoff / 2, backoff))
                    backoff = min(2.0, 2 * backoff)
            except asyncio.CancelledError:
                call.cancel()
                raise

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    samples: list[dict[str, Any]] = []
    end = t0 + spec["ramp"] + spec["seconds"]
    k, lag = 0, 0.0
    while (wall := t0 + k * SAMPLE) <= end:
        await asyncio.sleep(max(0.0, at(wall) - loop.time()))
        now = loop.time()
        lag = max(lag, now - at(wall))
        live = [i for i in range(n) if t0 + started_at[i] <= time.time()]
        samples.append(
            {
                "k": k,
                "started": len(live),
                "attached": sum(now < lease_end[i] for i in live),
                "unthrottled": 0,  # nothing here ever runs without an allocation
                "moved": int(sum(moved)),
                "in_force": sum(min(want, in_force(i, now)) for i in live),
            }
        )
        k += 1
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await channel.close()
    return {
        "samples": samples,
        "attach_latency": [
            None if a is None else max(0.0, a - s)
            for a, s in zip(attached_at, started_at, strict=True)
        ],
        "counts": dict(counts),
        "loop_lag_max": lag,
    }


def worker_main() -> None:
    spec = json.loads(sys.stdin.read())
    result = asyncio.run(_raw_worker(spec) if spec["raw"] else _worker(spec))
    print(json.dumps(result))


# ---------------------------------------------------------------------------- the driver


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    env = {
        "BURSTCTL_CAPACITY": args.capacity,
        "BURSTCTL_LOG_LEVEL": "INFO",
        "BURSTCTL_HEARTBEAT_TIMEOUT": str(args.heartbeat_timeout),
    }
    if args.max_sessions is not None:
        env["BURSTCTL_MAX_SESSIONS"] = str(args.max_sessions)
    if args.shed_loop_lag is not None:
        env["BURSTCTL_SHED_LOOP_LAG"] = str(args.shed_loop_lag)
    if args.max_sessions_per_client is not None:
        env["BURSTCTL_MAX_SESSIONS_PER_CLIENT"] = str(args.max_sessions_per_client)
    controller = ControllerProcess(tmp / "state", env=env).start(timeout=30)
    assert controller.proc is not None
    controller_ps = psutil.Process(controller.proc.pid)
    workers: list[subprocess.Popen[str]] = []
    try:
        assert controller.address is not None
        t0 = time.time() + 2.0
        per = [
            args.sessions // args.workers + (w < args.sessions % args.workers)
            for w in range(args.workers)
        ]
        first = 0
        for count in per:
            spec = {
                "target": controller.address,
                "first": first,
                "count": count,
                "t0": t0,
                "ramp": args.ramp,
                "seconds": args.seconds,
                "chunk": args.chunk,
                "period": args.period,
                "fallback": args.fallback,
                "attach_timeout": args.attach_timeout,
                "raw": args.raw,
            }
            first += count
            proc = subprocess.Popen(
                [sys.executable, __file__, "--worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(spec))
            proc.stdin.close()
            workers.append(proc)
        cpu0 = controller_ps.cpu_times()
        rss_max = 0
        while any(w.poll() is None for w in workers):
            rss_max = max(rss_max, controller_ps.memory_info().rss)
            time.sleep(0.5)  # sampling the controller's RSS, not synchronisation
        cpu1 = controller_ps.cpu_times()
        results = []
        for w in workers:
            assert w.stdout is not None
            results.append(json.loads(w.stdout.read()))
            w.wait()
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        controller.stop(timeout=30)
    return summarise(
        args, results, controller, rss_max, cpu1.user + cpu1.system - cpu0.user - cpu0.system
    )


def summarise(
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    controller: ControllerProcess,
    rss_max: int,
    cpu: float,
) -> dict[str, Any]:
    from burstctl.common.units import parse_rate

    by_k: dict[int, dict[str, int]] = {}
    for r in results:
        for s in r["samples"]:
            acc = by_k.setdefault(s["k"], Counter())
            acc.update(
                {
                    key: int(s.get(key, 0))
                    for key in ("started", "attached", "unthrottled", "moved", "in_force")
                }
            )
    ks = sorted(by_k)
    capacity = parse_rate(args.capacity) / MiB
    tolerance = 0.02
    steady = [k for k in ks if k * SAMPLE >= args.ramp + 2]  # after the ramp settled
    rates = []  # MiB/s over 1 s windows
    for k in ks:
        if k in steady and k - 2 in by_k:
            rates.append((by_k[k]["moved"] - by_k[k - 2]["moved"]) / (2 * SAMPLE) / MiB)
    attached_at = [t for r in results for t in r["attach_latency"]]
    firsts = sorted(t for t in attached_at if t is not None)
    counts: Counter[str] = Counter()
    for r in results:
        counts.update(r["counts"])
    log = "".join(controller.log)
    stats: dict[str, Any] = {}
    m = _STATS.search(log)
    if m:
        stats = json.loads(m.group(1))
    last = by_k[ks[-1]]

    def pct(q: float) -> float | None:
        return round(firsts[min(len(firsts) - 1, int(q * len(firsts)))], 2) if firsts else None

    return {
        "sessions": args.sessions,
        "workers": args.workers,
        "max_sessions": args.max_sessions,
        "max_sessions_per_client": args.max_sessions_per_client,
        "shed_loop_lag": args.shed_loop_lag,
        "chunk": args.chunk,
        "period": args.period,
        "fallback": None if args.raw else args.fallback,
        "raw": args.raw,
        "capacity_mib_s": capacity,
        "demand_mib_s": round(args.sessions * args.chunk / args.period / MiB, 1),
        "attached_end": last["attached"],
        "never_attached": sum(t is None for t in attached_at),
        "attach_s_p50": pct(0.5),
        "attach_s_p99": pct(0.99),
        "unthrottled_max": max(by_k[k]["unthrottled"] for k in ks),
        "attached_min_steady": min((by_k[k]["attached"] for k in steady), default=None),
        "in_force_max_mib_s": round(max(by_k[k]["in_force"] for k in steady) / MiB, 1)
        if args.raw and steady
        else None,
        "aggregate_mean_mib_s": round(sum(rates) / len(rates), 1) if rates else None,
        "aggregate_max_mib_s": round(max(rates), 1) if rates else None,
        "over_capacity_windows": sum(r > capacity * (1 + tolerance) for r in rates),
        "windows": len(rates),
        "lease_expiries": counts["lease_expiries"],
        "attach_timeouts": counts["attach_timeouts"],
        "refusals": counts["refusals"],
        "stream_errors": {k: v for k, v in counts.items() if k.startswith("ended_")},
        "heartbeat_closures": log.count("no heartbeat for"),
        "refused_sessions": stats.get("refused_sessions"),
        "decision_p99_s": stats.get("decision_p99_s"),
        "controller_loop_lag_peak_s": stats.get("loop_lag_peak_s"),
        "worker_loop_lag_max_s": round(max(r["loop_lag_max"] for r in results), 3),
        "controller_cpu_s": round(cpu, 1),
        "controller_rss_mib": round(rss_max / MiB, 1),
    }


def main() -> None:
    if "--worker" in sys.argv:
        worker_main()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2, help="client processes")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured after the ramp")
    parser.add_argument("--ramp", type=float, default=10.0, help="s over which sessions start")
    parser.add_argument("--chunk", type=int, default=64 * 1024)
    parser.add_argument("--period", type=float, default=0.1)
    parser.add_argument("--capacity", default="1GiB/s")
    parser.add_argument("--heartbeat-timeout", type=float, default=3.0)
    parser.add_argument("--attach-timeout", type=float, default=2.0)
    parser.add_argument("--fallback", default="keep-last")
    parser.add_argument("--max-sessions", type=int, default=None)
    parser.add_argument("--max-sessions-per-client", type=int, default=None)
    parser.add_argument("--shed-loop-lag", type=float, default=None)
    parser.add_argument(
        "--raw", action="store_true", help="sessions speak the protocol themselves (light load)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="burstctl-many-") as tmp:
        print(json.dumps(run(args, Path(tmp)), indent=2))


if __name__ == "__main__":
    main()
