"""``/metrics`` and the event loop under a large job table (issue 15, finding 4).

Starts ``burstctl controller`` as a child process on loopback ports, opens one honest
session (this process: a real client ``Session`` that paces itself to ``--honest-rate``),
then lets a child process create ``--junk`` job ids the way an unauthenticated client
can: one gRPC ``Session`` stream per made-up job id, a ``Hello`` without credentials,
the first ``Allocation`` read, the stream cancelled (each job is then retained for
``job_retention``, 300 s by default). Then ``--scrapers`` child processes scrape
``/metrics`` for ``--seconds``, all at once every ``--interval`` seconds (rounds of
concurrent scrapes; 0: each back to back, a hostile scraper) while this process
probes ``/healthz`` every 10 ms. Prints one JSON
document: time to create the junk, ``/metrics`` size and latency (client side) and
render time (``burstctl_metrics_render_seconds``, the controller's own), ``/healthz``
latency p50/p99/max idle and during the scrapes, and how often the honest session's
allocation lease expired (the client logs each expiry). The lease is ``--lease``
(default 1 s, renewed at 0.5 s: a loop stalled for half a second expires it).

    python bench/metrics_scrape.py [--junk 20000] [--seconds 20] [--scrapers 4] [--interval 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import re
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import ControllerProcess

_RENDER = re.compile(r"^burstctl_metrics_render_seconds\{[^}]*\} (\S+)$", re.M)
_JOBS = re.compile(r"^burstctl_jobs\{[^}]*\} (\S+)$", re.M)
MiB = 1 << 20
# httpx's sync client writes a request in more than one send: without TCP_NODELAY,
# Nagle and the server's delayed ACK add ~40 ms to every request on loopback.
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


def client(url: str, timeout: float) -> httpx.Client:
    return httpx.Client(
        base_url=url, timeout=timeout, transport=httpx.HTTPTransport(socket_options=NODELAY)
    )


# ---- the junk: one Hello per made-up job id (a child process) ---------------------


def junk_id(i: int, length: int) -> str:
    head = f"junk-{i:06d}-"
    return head + "x" * max(0, length - len(head))


async def _make_junk(address: str, n: int, length: int, parallel: int) -> int:
    import grpc

    from burstctl.proto.burstctl.v1 import controller_pb2 as pb
    from burstctl.proto.burstctl.v1 import controller_pb2_grpc as pb_grpc

    made = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.ControllerStub(channel)
        ids = iter(range(n))

        async def worker() -> None:
            nonlocal made
            for i in ids:
                call = stub.Session()
                hello = pb.Hello(
                    job_id=junk_id(i, length),
                    user="nobody",
                    group="nogroup",
                    nodes=1,
                    priority=1.0,
                    client_id=f"junk-{i}",
                    host="junk",
                )
                await call.write(pb.ClientMessage(hello=hello))
                await call.read()  # the first Allocation: the job is in the table
                call.cancel()
                made += 1

        await asyncio.gather(*(worker() for _ in range(parallel)))
    return made


def make_junk(address: str, n: int, length: int, out: Any) -> None:
    out.put(asyncio.run(_make_junk(address, n, length, 64)))


# ---- the scrapers (child processes) -----------------------------------------------


def scrape(url: str, start: float, seconds: float, interval: float, out: Any) -> None:
    """Scrapes at ``start + k * interval`` (wall clock, so that every scraper fires
    in the same rounds) until ``seconds`` have passed; back to back if ``interval`` is 0."""
    sizes: list[int] = []
    latencies: list[float] = []
    renders: list[float] = []
    with client(url, 120) as http:
        end, k = start + seconds, 0
        while (now := time.time()) < end:
            if interval > 0:
                at = start + k * interval
                k = max(k, int((now - start) / interval)) + 1  # a late round is skipped
                if at > now:
                    time.sleep(at - now)  # the scrape schedule itself
            t0 = time.perf_counter()
            r = http.get("/metrics")
            latencies.append(time.perf_counter() - t0)
            r.raise_for_status()
            sizes.append(len(r.content))
            if m := _RENDER.search(r.text):
                renders.append(float(m.group(1)))
    out.put({"sizes": sizes, "latencies": latencies, "renders": renders})


# ---- this process: the honest session and the /healthz probe ------------------------


class LeaseCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.expired: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "lease expired" in message or "no allocation within" in message:
            self.expired.append(message)


def honest_pump(session: Any, rate: float, stop: threading.Event, moved: list[int]) -> None:
    chunk = 64 * 1024
    next_at = time.monotonic()
    while not stop.is_set():
        session.acquire(chunk, "write")
        moved[0] += chunk
        # the application's own pace: it never wants more than `rate`
        next_at = max(next_at, time.monotonic() - 0.02) + chunk / rate
        ahead = next_at - time.monotonic()
        if ahead > 0:
            stop.wait(ahead)


def probe_healthz(url: str, stop: threading.Event, out: list[float]) -> None:
    with client(url, 60) as http:
        while not stop.is_set():
            t0 = time.perf_counter()
            http.get("/healthz").raise_for_status()
            out.append(time.perf_counter() - t0)
            stop.wait(0.01)  # the probe's period


def summary(values: list[float], scale: float = 1e3) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "n": len(values),
        "p50": round(statistics.median(values) * scale, 2),
        "p99": round(p99 * scale, 2),
        "max": round(ordered[-1] * scale, 2),
    }


def probe_for(url: str, seconds: float) -> list[float]:
    stop, out = threading.Event(), []
    t = threading.Thread(target=probe_healthz, args=(url, stop, out))
    t.start()
    stop.wait(seconds)  # the length of the idle measurement
    stop.set()
    t.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--junk", type=int, default=20_000, help="made-up job ids")
    parser.add_argument("--id-length", type=int, default=110, help="characters per junk id")
    parser.add_argument("--scrapers", type=int, default=4, help="concurrent /metrics scrapers")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the scrape phase")
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="s between rounds of concurrent scrapes; 0 = each scraper back to back",
    )
    parser.add_argument("--lease", type=float, default=1.0, help="the controller's lease, s")
    parser.add_argument(
        "--honest-rate", type=float, default=4 * MiB, help="bytes/s the honest job wants"
    )
    args = parser.parse_args()

    from burstctl.client import JobInfo, Session

    lease_log = LeaseCounter()
    logging.getLogger("burstctl.client").addHandler(lease_log)
    ctx = mp.get_context("spawn")
    result: dict[str, Any] = {
        "junk_jobs": args.junk,
        "id_length": args.id_length,
        "scrapers": args.scrapers,
        "seconds": args.seconds,
        "interval": args.interval,
        "lease_s": args.lease,
    }
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as state_dir:
        controller = ControllerProcess(
            Path(state_dir), env={"BURSTCTL_LEASE": str(args.lease)}
        ).start(timeout=30)
        assert controller.address is not None and controller.url is not None
        grpc_address, url = controller.address, controller.url
        try:
            session = Session(grpc_address, JobInfo("honest", "ann", "bio", nodes=1))
            stop, moved = threading.Event(), [0]
            pump = threading.Thread(
                target=honest_pump, args=(session, args.honest_rate, stop, moved), daemon=True
            )
            pump.start()
            started = time.monotonic()
            result["healthz_idle_ms"] = summary(probe_for(url, 2.0))

            out = ctx.Queue()
            t0 = time.perf_counter()
            maker = ctx.Process(
                target=make_junk, args=(grpc_address, args.junk, args.id_length, out)
            )
            maker.start()
            made = out.get(timeout=600)
            maker.join()
            result["junk_created"] = made
            result["junk_seconds"] = round(time.perf_counter() - t0, 2)
            text = httpx.get(url + "/metrics", timeout=120).text
            jobs = _JOBS.search(text)
            result["jobs_in_table"] = int(float(jobs.group(1))) if jobs else None
            result["healthz_after_junk_ms"] = summary(probe_for(url, 2.0))

            health: list[float] = []
            hstop = threading.Event()
            prober = threading.Thread(target=probe_healthz, args=(url, hstop, health))
            start = time.time() + 1.0  # every scraper process is up by then
            scrapers = [
                ctx.Process(target=scrape, args=(url, start, args.seconds, args.interval, out))
                for _ in range(args.scrapers)
            ]
            prober.start()
            for p in scrapers:
                p.start()
            scraped = [out.get(timeout=args.seconds + 600) for _ in scrapers]
            hstop.set()
            prober.join()
            for p in scrapers:
                p.join()
            sizes = [s for r in scraped for s in r["sizes"]]
            renders = [s for r in scraped for s in r["renders"]]
            result["metrics"] = {
                "scrapes": len(sizes),
                "bytes_max": max(sizes),
                "bytes_min": min(sizes),
                "latency_ms": summary([s for r in scraped for s in r["latencies"]]),
                "render_ms": summary(renders),
            }
            result["healthz_during_scrapes_ms"] = summary(health)
            stop.set()
            pump.join(10)
            session.close()
            result["honest"] = {
                "moved_MiB": round(moved[0] / MiB, 1),
                "rate_MiB_s": round(moved[0] / MiB / (time.monotonic() - started), 2),
                "wanted_MiB_s": round(args.honest_rate / MiB, 2),
                "lease_expiries": len(lease_log.expired),
            }
        finally:
            controller.stop(timeout=15)
    during = result["healthz_during_scrapes_ms"]
    result["acceptance"] = {
        "healthz_p99_under_50ms": during["p99"] is not None and during["p99"] < 50,
        "healthz_max_under_50ms": during["max"] is not None and during["max"] < 50,
        "no_lease_expired": result["honest"]["lease_expiries"] == 0,
    }
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
