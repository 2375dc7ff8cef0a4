"""Soak: many client sessions opening, posting, acquiring and closing against one controller.

Starts ``burstctl controller`` as a child process (loopback ports chosen by the OS, a
temporary state directory) and, in this process, ``--sessions`` concurrent session slots on
one `ClientRuntime` loop. Each slot, until ``--duration`` is over: opens an `AsyncSession`
for its job (``--jobs`` job ids, reused, so the job table does not grow with time), acquires
``--chunk`` bytes 1–8 times with a short think time between acquires (the first acquire
after a quiet gap posts an operation), and closes (Goodbye). An acquire that has not
returned ``--stuck-after`` seconds after it was called is *stuck* (it still is waited for);
a session with a stuck acquire is a stuck session.

Every ``--sample`` seconds the controller's RSS (psutil, by pid) is read and its
``/metrics`` scraped; the decision-latency histogram (``burstctl_decision_latency_seconds``)
of each window gives that window's p99 (interpolated in its bucket, as Prometheus'
``histogram_quantile`` does).

Prints one JSON object: the settings, every sample, and the summary: RSS growth from the
end of the warm-up (the first ``--warmup`` fraction of the run) to the end, window p99s of
the first and the second half, stuck sessions (must be 0), sessions opened, acquires, and
acquire latency. The controller is stopped by pid at the end, whatever happens.

    python bench/soak.py [--duration 600] [--sessions 1000] [--jobs 1000] [--sample 5]
        [--stuck-after 10] [--chunk 64KiB] [--capacity 1GiB/s] [--node-bandwidth 64MiB/s]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import ControllerProcess

from burstctl.client import AsyncSession, ClientRuntime, JobInfo
from burstctl.common.units import parse_size

MiB = 1 << 20
_BUCKET = re.compile(r'^burstctl_decision_latency_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)$')


def histogram(url: str) -> dict[float, float]:
    """Cumulative counts of the decision-latency histogram by upper bound, from /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict[float, float] = {}
    for line in text.splitlines():
        if m := _BUCKET.match(line):
            out[float(m.group(1))] = out.get(float(m.group(1)), 0.0) + float(m.group(2))
    return out


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """The q-quantile of the observations between two scrapes (histogram_quantile's way)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cum in zip(bounds, counts, strict=True):
        if cum >= rank:
            if math.isinf(bound):
                return lower  # above the largest finite bucket: report that bound
            inside = cum - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cum
    return lower


@dataclass
class Load:
    """What the session slots did; touched only on the runtime's loop."""

    opened: int = 0
    closed: int = 0
    acquires: int = 0
    stuck_sessions: int = 0
    stuck_acquires: int = 0
    never_attached: int = 0  # sessions still not attached after their first acquire
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # seconds per acquire


async def slot(
    index: int,
    target: str,
    deadline: float,
    load: Load,
    args: argparse.Namespace,
    rng: random.Random,
) -> None:
    job = JobInfo(
        job_id=f"soak-{index % args.jobs}",
        user=f"user{index % 17}",
        group=f"group{index % 5}",
        nodes=1 + index % 4,
    )
    loop = asyncio.get_running_loop()
    await asyncio.sleep(index * args.ramp / args.sessions)  # the ramp: not all at once
    while loop.time() < deadline:
        session = AsyncSession(target, job)
        try:
            await session.start()
            load.opened += 1
            stuck = False
            for k in range(rng.randint(1, 8)):
                t0 = loop.time()
                acquire = asyncio.ensure_future(session.acquire(args.chunk))
                done, _ = await asyncio.wait({acquire}, timeout=args.stuck_after)
                if not done:
                    load.stuck_acquires += 1
                    if not stuck:  # counted when seen, so a session stuck for good counts too
                        stuck = True
                        load.stuck_sessions += 1
                    await acquire  # still waited for: a stuck acquire may come back late
                acquire.result()
                load.latencies.append(loop.time() - t0)
                load.acquires += 1
                if k == 0 and not session.attached:
                    load.never_attached += 1
                await asyncio.sleep(rng.uniform(0, args.think))  # the application's own work
        except Exception as exc:  # recorded: nothing may be raised into the application
            load.errors.append(f"{job.job_id}: {exc!r}")
        finally:
            await session.close()
            load.closed += 1


async def run_load(target: str, args: argparse.Namespace, load: Load, stop_at: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (stop_at - time.monotonic())
    rng = random.Random(args.seed)
    slots = [
        asyncio.create_task(slot(i, target, deadline, load, args, random.Random(rng.random())))
        for i in range(args.sessions)
    ]
    await asyncio.gather(*slots)


def soak(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="burstctl-soak-") as tmp:
        controller = ControllerProcess(
            Path(tmp) / "state",
            ["--capacity", args.capacity, "--node-bandwidth", args.node_bandwidth],
        ).start(timeout=30)
        try:
            return _soak(controller, args)
        finally:
            code = controller.stop()
            if code not in (0, None):
                print("".join(controller.log[-30:]), file=sys.stderr)


def _soak(controller: ControllerProcess, args: argparse.Namespace) -> dict[str, Any]:
    assert controller.address is not None and controller.url is not None
    assert controller.proc is not None
    proc = psutil.Process(controller.proc.pid)
    load = Load()
    start = time.monotonic()
    stop_at = start + args.duration
    samples: list[dict[str, Any]] = []
    with ClientRuntime(name="soak") as runtime:
        running = runtime.submit(run_load(controller.address, args, load, stop_at))
        before = histogram(controller.url)
        seen_latencies = 0
        # The slots end their sessions after the duration; a slot still in a stuck acquire
        # this long after it is given up on (and was counted as stuck).
        give_up = stop_at + 3 * args.stuck_after
        while not running.done():
            with contextlib.suppress(TimeoutError):
                running.result(timeout=args.sample)  # the sampling period (a benchmark's clock)
            if time.monotonic() > give_up:
                running.cancel()
                break
            if controller.proc is None or controller.proc.poll() is not None:
                raise RuntimeError("the controller died:\n" + "".join(controller.log[-30:]))
            after = histogram(controller.url)
            p99 = quantile(0.99, before, after)
            cpu = proc.cpu_times()
            cpu_s = cpu.user + cpu.system
            fresh = load.latencies[seen_latencies:]
            seen_latencies += len(fresh)
            samples.append(
                {
                    "t_s": round(time.monotonic() - start, 1),
                    "rss_mib": round(proc.memory_info().rss / MiB, 2),
                    "controller_cpu_s": round(cpu_s, 1),
                    "decision_p99_ms": None if p99 is None else round(p99 * 1e3, 3),
                    "decisions": int(after.get(math.inf, 0) - before.get(math.inf, 0)),
                    "acquires": len(fresh),
                    "acquire_p99_ms": round(pct(fresh, 0.99) * 1e3, 2) if fresh else None,
                    "sessions_opened": load.opened,
                    "stuck_sessions": load.stuck_sessions,
                }
            )
            before = after
    return summary(args, samples, load, time.monotonic() - start)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(
    args: argparse.Namespace, samples: list[dict[str, Any]], load: Load, elapsed: float
) -> dict[str, Any]:
    warm = [s for s in samples if s["t_s"] >= args.warmup * args.duration] or samples
    rss_start, rss_end = warm[0]["rss_mib"], samples[-1]["rss_mib"]
    rss_all = [s["rss_mib"] for s in warm]
    half = args.duration / 2
    p99_first = [s["decision_p99_ms"] for s in warm if s["t_s"] <= half and s["decision_p99_ms"]]
    p99_second = [s["decision_p99_ms"] for s in warm if s["t_s"] > half and s["decision_p99_ms"]]
    return {
        "benchmark": "soak",
        "settings": {k: v for k, v in vars(args).items()},
        "elapsed_s": round(elapsed, 1),
        "sessions_opened": load.opened,
        "sessions_closed": load.closed,
        "acquires": load.acquires,
        "stuck_sessions": load.stuck_sessions,
        "stuck_acquires": load.stuck_acquires,
        "never_attached_after_first_acquire": load.never_attached,
        "errors": load.errors[:20],
        "error_count": len(load.errors),
        "acquire_p50_ms": round(pct(load.latencies, 0.5) * 1e3, 2) if load.latencies else None,
        "acquire_p99_ms": round(pct(load.latencies, 0.99) * 1e3, 2) if load.latencies else None,
        "rss_mib": {
            "after_warmup": rss_start,
            "end": rss_end,
            "min": min(rss_all),
            "max": max(rss_all),
            "growth_pct": round((rss_end - rss_start) / rss_start * 100, 2),
        },
        "decision_p99_ms": {
            "first_half_median": statistics.median(p99_first) if p99_first else None,
            "second_half_median": statistics.median(p99_second) if p99_second else None,
        },
        "samples": samples,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--sessions", type=int, default=1000, help="concurrent session slots")
    parser.add_argument("--jobs", type=int, default=1000, help="distinct job ids, reused")
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    parser.add_argument(
        "--stuck-after", type=float, default=10.0, help="an acquire slower than this is stuck"
    )
    parser.add_argument("--chunk", type=parse_size, default=64 * 1024, help="bytes per acquire")
    parser.add_argument(
        "--think", type=float, default=0.05, help="at most this many s between acquires"
    )
    parser.add_argument("--capacity", default="1GiB/s", help="the controller's B")
    parser.add_argument("--node-bandwidth", default="64MiB/s", help="the controller's b")
    parser.add_argument(
        "--warmup", type=float, default=0.1, help="fraction of the run before RSS is compared"
    )
    parser.add_argument(
        "--ramp", type=float, default=5.0, help="seconds over which the slots start"
    )
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    print(json.dumps(soak(parse_args(argv)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
