"""Controller event throughput and allocation push latency.

Starts ``burstctl controller`` as a child process on a loopback port, then N
concurrent sessions (each its own job) in a load-generator process. Each load
session posts and completes operations as fast as its stream accepts them
(open loop; HTTP/2 flow control throttles it to what the controller handles).
A few extra probe sessions run closed loop: post, wait for the allocation that
answers it, complete, wait again; their client-observed event→allocation times
are the push latency. The controller's own counters (messages handled,
decisions, pushes, decision time) come from the stats line it logs on SIGTERM.
Prints one JSON document on stdout.

    python bench/controller_events.py [--sessions 10 100 1000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import psutil

_SERVING = re.compile(r"serving gRPC on (\S+)")
_STATS = re.compile(r"stats: (\{.*\})")


def start_controller(
    state_dir: str, extra: list[str]
) -> tuple[subprocess.Popen[str], str, list[str]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "burstctl",
            "controller",
            "--grpc-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--state-dir",
            state_dir,
            "--log-level",
            "INFO",
            *extra,
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "BURSTCTL_LOG_LEVEL": "INFO"},
    )
    lines: list[str] = []
    ready = threading.Event()
    address: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if (m := _SERVING.search(line)) and not address:
                address.append(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(30) or not address:
        proc.kill()
        raise SystemExit("controller did not start:\n" + "".join(lines))
    return proc, address[0], lines


@dataclass(frozen=True)
class Load:
    """What one load-generator process runs."""

    address: str
    first: int  # index of its first session (job ids are unique across processes)
    count: int  # open-loop load sessions
    probes: int  # closed-loop latency probes
    seconds: float
    warmup: float
    batch: int  # events per gRPC message of the load sessions


async def _generate(load: Load, out: mp.Queue) -> None:
    address, first, count, probes = load.address, load.first, load.count, load.probes
    seconds, warmup, batch = load.seconds, load.warmup, load.batch
    import grpc

    from burstctl.proto.burstctl.v1 import controller_pb2 as pb
    from burstctl.proto.burstctl.v1 import controller_pb2_grpc as pb_grpc

    channels = [grpc.aio.insecure_channel(address) for _ in range(max(1, (count + probes) // 100))]
    latencies: list[float] = []
    sent = 0
    loop = asyncio.get_running_loop()
    t_start = loop.time() + warmup
    t_end = t_start + seconds

    async def open_session(i: int) -> grpc.aio.StreamStreamCall:
        call = pb_grpc.ControllerStub(channels[i % len(channels)]).Session()
        await call.write(
            pb.ClientMessage(
                hello=pb.Hello(
                    job_id=f"bench-{first + i}",
                    user="bench",
                    group="bench",
                    nodes=1,
                    client_id=f"bench-{first + i}",
                )
            )
        )
        return call

    async def close_session(call: grpc.aio.StreamStreamCall) -> None:
        await call.write(pb.ClientMessage(goodbye=pb.Goodbye()))
        await call.done_writing()

    async def drain(call: grpc.aio.StreamStreamCall) -> None:
        while await call.read() is not grpc.aio.EOF:
            pass

    async def load(i: int) -> None:
        """Open loop: post and complete as fast as the stream accepts them.

        With ``batch`` > 1 each gRPC message is a Batch of that many events, as
        the client runtime sends what queued up while its previous write was in
        flight.
        """
        nonlocal sent
        call = await open_session(i)
        reader = asyncio.create_task(drain(call))
        op_id = 0
        pending: list[pb.ClientMessage] = []
        while loop.time() < t_end:
            op_id += 1
            posted = pb.OpPosted(op_id=op_id, kind=pb.OP_KIND_WRITE, volume=1 << 20)
            pending.append(pb.ClientMessage(op_posted=posted))
            pending.append(pb.ClientMessage(op_completed=pb.OpCompleted(op_id=op_id)))
            if len(pending) < batch:
                continue
            if batch == 1:
                for msg in pending:
                    await call.write(msg)
            else:
                await call.write(pb.ClientMessage(batch=pb.Batch(messages=pending)))
            if t_start <= loop.time():
                sent += len(pending)
            pending = []
        await close_session(call)
        await reader

    async def probe(i: int) -> None:
        """Closed loop: time from a post to the allocation that lets the job move.

        The drop to 0 after a completion is deferred by the controller's release
        delay on purpose, so only post→allocation is timed; the probe then waits
        for the drop before posting again.
        """
        call = await open_session(i)
        assert (await call.read()).WhichOneof("body") == "allocation"
        op_id = 0

        async def until(active: bool) -> bool:
            while True:  # others' events move our rate too: wait for *our* answer
                reply = await call.read()
                if reply is grpc.aio.EOF:
                    return False
                if (reply.allocation.rate > 0) == active:
                    return True

        while loop.time() < t_end:
            op_id += 1
            t0 = loop.time()
            await call.write(
                pb.ClientMessage(
                    op_posted=pb.OpPosted(op_id=op_id, kind=pb.OP_KIND_WRITE, volume=1 << 20)
                )
            )
            if not await until(True):
                return
            if t0 >= t_start:
                latencies.append(loop.time() - t0)
            await call.write(pb.ClientMessage(op_completed=pb.OpCompleted(op_id=op_id)))
            if not await until(False):
                return
        await close_session(call)
        await drain(call)

    tasks = [load(i) for i in range(count)] + [probe(count + i) for i in range(probes)]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    for ch in channels:
        await ch.close()
    out.put(
        {
            "sent": sent,
            "latencies": latencies,
            "errors": errors[:3],
            "n_errors": len(errors),
            "done_at": time.time(),
        }
    )


def _generator_main(load: Load, out: mp.Queue) -> None:
    asyncio.run(_generate(load, out))


def run(
    sessions: int,
    probes: int,
    seconds: float,
    warmup: float,
    generators: int,
    batch: int,
    extra: list[str],
) -> dict:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as state_dir:
        proc, address, log = start_controller(state_dir, extra)
        ps = psutil.Process(proc.pid)
        cpu0 = ps.cpu_times()
        out: mp.Queue = ctx.Queue()
        # load generators, then one process for the probes so that their
        # latency is not the load generator's own scheduling delay
        per = [
            (sessions // generators + (1 if g < sessions % generators else 0), 0)
            for g in range(generators)
        ] + [(0, probes)]
        procs, first = [], 0
        t_begin = time.time()
        for count, n_probes in per:
            p = ctx.Process(
                target=_generator_main,
                args=(Load(address, first, count, n_probes, seconds, warmup, batch), out),
            )
            p.start()
            procs.append(p)
            first += count + n_probes
        rss_peak = 0
        deadline = time.monotonic() + warmup + seconds + 120
        results: list[dict] = []
        while len(results) < len(procs) and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                results.append(out.get(timeout=0.2))
            rss_peak = max(rss_peak, ps.memory_info().rss)
        for p in procs:
            p.join(10)
        cpu1 = ps.cpu_times()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        time.sleep(0.2)  # let the drain thread read the final stats line
    stats: dict = {}
    for line in log:
        if m := _STATS.search(line):
            stats = json.loads(m.group(1))
    lat = sorted(x for r in results for x in r["latencies"])
    done = max((r["done_at"] for r in results), default=time.time())

    def pct(q: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3, 3) if lat else None

    return {
        "sessions": sessions,
        "events_per_message": batch,
        "probe_sessions": probes,
        "seconds": seconds,
        # every message the controller handled, over the whole run (setup included)
        "events_per_s": round(stats.get("messages", 0) / (done - t_begin)),
        "client_events_sent_per_s": round(sum(r["sent"] for r in results) / seconds),
        "push_latency_ms": {"p50": pct(0.5), "p99": pct(0.99), "samples": len(lat)},
        "controller": {
            "rss_peak_mib": round(rss_peak / (1 << 20), 1),
            "cpu_s": round((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system), 2),
            "wall_s": round(done - t_begin, 2),
            "messages": stats.get("messages"),
            "decisions": stats.get("decisions"),
            "pushes": stats.get("pushes"),
            "pushes_start": stats.get("pushes_start"),
            "pushes_stop": stats.get("pushes_stop"),
            "decision_p50_ms": round(stats.get("decision_p50_s", 0) * 1e3, 3),
            "decision_p99_ms": round(stats.get("decision_p99_s", 0) * 1e3, 3),
        },
        "errors": sum(r["n_errors"] for r in results) + (len(procs) - len(results)),
        "error_samples": [e for r in results for e in r["errors"]][:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument(
        "--probes", type=int, default=10, help="closed-loop sessions that measure push latency"
    )
    parser.add_argument(
        "--generators",
        type=int,
        default=1,
        help="load-generator processes (the machine has 2 cores)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        nargs="+",
        default=[1, 8],
        help="events per gRPC message sent by load sessions (even; 1 = no Batch)",
    )
    parser.add_argument("--policy", default="fair-share")
    parser.add_argument(
        "--controller-arg",
        action="append",
        default=[],
        help="extra flag for the controller, e.g. --controller-arg=--capacity=1GiB/s",
    )
    args = parser.parse_args()
    extra = ["--policy", args.policy, *args.controller_arg]
    report = {
        "benchmark": "controller_events",
        "cpus": os.cpu_count(),
        "policy": args.policy,
        "runs": [
            run(n, args.probes, args.seconds, args.warmup, args.generators, k, extra)
            for k in args.batch
            for n in args.sessions
        ],
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
