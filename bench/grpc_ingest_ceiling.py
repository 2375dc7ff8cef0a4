"""The ceiling under the controller: how many messages grpc.aio ingests with no work at all.

A server whose Session handler only counts messages, fed by the same kind of
open-loop load generator as bench/controller_events.py (one process, N
streams). Whatever the controller does per event comes on top of this, so its
events/s without batching cannot exceed it on the same machine. Prints JSON.

    python bench/grpc_ingest_ceiling.py [--sessions 10 1000] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import time

import grpc

from burstctl.controller.messages import decode_client_message
from burstctl.controller.servicer import SERVICE_NAME
from burstctl.proto.burstctl.v1 import controller_pb2 as pb
from burstctl.proto.burstctl.v1 import controller_pb2_grpc as pb_grpc


async def _serve(ready: mp.Queue, counts: mp.Queue) -> None:
    count = 0

    async def session(requests, context) -> None:  # type: ignore[no-untyped-def]
        nonlocal count
        async for _ in requests:
            count += 1

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    handler = grpc.stream_stream_rpc_method_handler(
        session,
        request_deserializer=decode_client_message,
        response_serializer=pb.ServerMessage.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE_NAME, {"Session": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ready.put(port)
    while True:
        await asyncio.sleep(0.5)
        counts.put((time.monotonic(), count))


def _server_main(ready: mp.Queue, counts: mp.Queue) -> None:
    asyncio.run(_serve(ready, counts))


async def _load(port: int, sessions: int, seconds: float) -> None:
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(max(1, sessions // 100))
    ]
    end = time.monotonic() + seconds
    msg = pb.ClientMessage(op_posted=pb.OpPosted(op_id=1, kind=pb.OP_KIND_WRITE, volume=1))

    async def one(i: int) -> None:
        call = pb_grpc.ControllerStub(channels[i % len(channels)]).Session()
        while time.monotonic() < end:
            await call.write(msg)
        await call.done_writing()
        await call

    await asyncio.gather(*(one(i) for i in range(sessions)), return_exceptions=True)
    for ch in channels:
        await ch.close()


def run(sessions: int, seconds: float, warmup: float) -> dict:
    ctx = mp.get_context("spawn")
    ready, counts = ctx.Queue(), ctx.Queue()
    server = ctx.Process(target=_server_main, args=(ready, counts), daemon=True)
    server.start()
    try:
        port = ready.get(timeout=30)
        asyncio.run(_load(port, sessions, warmup + seconds))
        samples = []
        while not counts.empty():
            samples.append(counts.get())
    finally:
        server.terminate()
        server.join(10)
    t_first = samples[0][0] + warmup
    window = [s for s in samples if s[0] >= t_first]
    (t0, c0), (t1, c1) = window[0], window[-1]
    return {"sessions": sessions, "messages_per_s": round((c1 - c0) / (t1 - t0))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[10, 1000])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    args = parser.parse_args()
    report = {
        "benchmark": "grpc_ingest_ceiling",
        "cpus": os.cpu_count(),
        "grpc": grpc.__version__,
        "runs": [run(n, args.seconds, args.warmup) for n in args.sessions],
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
