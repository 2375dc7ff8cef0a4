"""Millions of completions of unknown operations against one controller: memory stays flat.

Issue 15, finding 1 and its acceptance: 3 M ``OpCompleted`` naming operations that are not
open, sent on one ``Session`` stream as 1,024-message batches by a client that reads its
responses, against ``burstctl controller`` in a child process (loopback, ports chosen by the
OS). Meanwhile an honest session (the real client runtime) holds a paced job. Reported as
JSON: the controller's RSS when idle, at its peak (sampled every 50 ms) and after the flood
ended, the flood's rate, the notices the flooder read, and the honest session's lease
expiries (the client counts every fallback).

    python bench/notice_flood.py [--completions 3000000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import ControllerProcess

from burstctl.client import JobInfo, Session
from burstctl.proto.burstctl.v1 import controller_pb2 as pb
from burstctl.proto.burstctl.v1 import controller_pb2_grpc as pb_grpc

MiB = 1 << 20
BATCH = 1024


async def flood(address: str, completions: int) -> dict[str, float]:
    """Sends the flood on one stream and reads every response; returns its figures."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = pb_grpc.ControllerStub(channel).Session()
        await call.write(
            pb.ClientMessage(hello=pb.Hello(job_id="hostile", user="eve", group="g", nodes=1))
        )
        read = {"notices": 0, "summaries": 0, "told": 0}

        async def reader() -> None:
            async for msg in call:
                if msg.WhichOneof("body") != "error":
                    continue
                if msg.error.code == "RESOURCE_EXHAUSTED":  # "N more error notices dropped"
                    read["summaries"] += 1
                    read["told"] += int(msg.error.message.split()[0])
                else:
                    read["notices"] += 1
                    read["told"] += 1

        task = asyncio.create_task(reader())
        start = time.monotonic()
        sent = 0
        while sent < completions:
            n = min(BATCH, completions - sent)
            batch = pb.Batch(
                messages=[
                    pb.ClientMessage(op_completed=pb.OpCompleted(op_id=sent + i + 1))
                    for i in range(n)
                ]
            )
            await call.write(pb.ClientMessage(batch=batch))
            sent += n
        took = time.monotonic() - start
        await call.done_writing()
        try:
            await asyncio.wait_for(task, 120)
            status = (await call.code()).name
        except grpc.aio.AioRpcError as err:
            status = err.code().name
        handled = time.monotonic() - start
        # every completion handled is told back (one by one or counted in a summary)
        return {
            "sent": sent,
            "send_seconds": round(took, 2),
            "handled_seconds": round(handled, 2),
            "handled_per_s": round(sent / handled),
            "status": status,
            **read,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=3_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ctl = ControllerProcess(Path(tmp), ["--capacity", "100MiB/s"]).start()
        try:
            assert ctl.proc is not None and ctl.address is not None
            proc = psutil.Process(ctl.proc.pid)
            expiries: list[float] = []
            honest = Session(ctl.address, JobInfo("honest", "ann", "g"), "keep-last")
            assert honest.wait_attached(10)
            stop = threading.Event()

            def pump() -> None:
                while not stop.is_set():
                    honest.acquire(64 * 1024)

            pumper = threading.Thread(target=pump, daemon=True)
            pumper.start()
            time.sleep(1.0)  # settle: the idle level is read after start-up allocations
            idle = proc.memory_info().rss
            peak = idle
            sampling = threading.Event()

            def sample() -> None:
                nonlocal peak
                while not sampling.wait(0.05):
                    peak = max(peak, proc.memory_info().rss)
                    if not honest.attached:
                        expiries.append(time.monotonic())

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            figures = asyncio.run(flood(ctl.address, args.completions))
            time.sleep(1.0)  # let the controller settle after the stream ended
            after = proc.memory_info().rss
            sampling.set()
            sampler.join()
            stop.set()
            pumper.join(5)
            honest.close()
        finally:
            ctl.stop()
    print(
        json.dumps(
            {
                "bench": "notice_flood",
                "completions": args.completions,
                "flood": figures,
                "rss_idle_mib": round(idle / MiB, 1),
                "rss_peak_mib": round(peak / MiB, 1),
                "rss_after_mib": round(after / MiB, 1),
                "rss_peak_over_idle_mib": round((peak - idle) / MiB, 1),
                "honest_detached_samples": len(expiries),
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
