"""Replica sync: digest size, CPU per exchange and convergence time.

Starts R controller replicas, each in its own process (this script with
``--worker``: ``app.build_replica`` + ``start``, each the others' peer on a fixed
loopback port, size-fair, B = 1 GiB/s, b = 256 MiB/s, λ = ``--interval``, each
started at a random phase of λ), as in production where every replica is its
own process on its own storage server. J jobs are placed on them, each on 1–3
replicas (seeded: every worker derives the same placement from the seed and
injects its share). Jobs are injected into a replica's job table through the
table's own API (``open_session`` + ``post``, as the gRPC servicer calls them),
not from client sessions: every job has one open operation on each of its
replicas and wants b_i there. The parent drives the workers over their
stdin/stdout (one JSON object a line). Then, per case:

- digest bytes: ``len(to_proto(d).SerializeToString())`` of every
  replica's full digest (mean, max), and what the replicas' links wrote in
  the CPU window: full digests and deltas (``controller/delta.py``), their
  number and mean bytes, and the exchanges that kept their share because no
  digest had changed (``shares_kept``);
- CPU per exchange: each worker's own process CPU time (every thread: asyncio
  loop and gRPC core) over ``--exchanges`` λ with the replicas idle but for the
  exchange, divided by the exchanges that replica made. One replica's exchange
  thus includes building and sending its digest, receiving and validating
  R − 1 digests, the global split and the scheduler decision it triggers (and
  its idle background tasks). Also each replica's CPU seconds per wall second
  (its fraction of one core), mean and max over the replicas;
- with ``--moving F``, a fraction F of each replica's jobs move 1 MiB per λ
  during the CPU window (a Usage report through the table's own ``usage``, the
  session waiting on its allocation so its demand stays b_i): their
  ``transferred``, ``remaining`` and ``usage_bytes`` change at every exchange,
  so each delta carries them, but no share changes (size-fair reads none of
  them). With ``--wobble`` as well, each moving job reports 0.5–1.5 MiB, drawn
  anew every λ, as a session that is not waiting: its demand (measured rate ×
  headroom) moves past the delta's tolerance, so every exchange merges, decides
  and splits again (a cluster where jobs start and end I/O phases every λ pays
  the same). The default, 0, is the steady state of the runs above;
- the pure parts timed alone in this process once the workers have stopped
  (median CPU time of 5), on replica r0's data (a copy of its job table, never
  started, and the digests fetched from the workers): ``build_digest``,
  encode, decode with validation, the targets (merge, global decision and
  split), and all of them as in one exchange without gRPC;
- convergence: at a random instant one new job (8 nodes) posts an operation on
  one replica; the time until every replica's ``peer_sync.local_targets`` equals
  the share the new steady state gives (computed beforehand from the workers'
  digests with the same merge and split). Each worker checks its own
  share every 1 ms and stamps the first match with ``time.monotonic()`` (one
  clock for all processes on Linux). Target: ≤ λ + one client heartbeat
  (0.25 s, ``client/session.py``); also reported in λ (target at 8 × 10,000
  jobs: ≤ 1.5 λ).

Prints JSON; ``--profile`` prints to stderr a cProfile of replica r0's exchange
without gRPC (``exchange_pure_ms``: build, encode, decode, validate and merge
R − 1 digests, targets), done offline on the digests fetched in steady state.
That is the full path, every peer digest decoded whole and the targets
recomputed: what an exchange costs when its inputs changed. A steady-state
exchange with deltas decodes empty deltas and keeps its share.

    python bench/replica_sync.py [--replicas 2 4 8] [--jobs 10 100 1000] [--interval 0.5]
        [--exchanges 10] [--moving 0.0 [--wobble]] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import cProfile
import dataclasses
import gc
import io
import json
import logging
import math
import os
import pstats
import random
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from burstctl.controller import app
from burstctl.controller.config import load_config
from burstctl.controller.digest import Digest, JobDigest
from burstctl.controller.digest_wire import from_proto, to_proto
from burstctl.controller.local_digest import build_digest
from burstctl.controller.membership import Membership
from burstctl.controller.merge import Merged, merge, split_targets
from burstctl.controller.records import JobMeta, OpKind
from burstctl.policies.base import Policy
from burstctl.policies.decision import decide
from burstctl.policies.registry import PolicyRegistry, default_registry
from burstctl.policies.view import JobId, job_cap
from burstctl.proto.burstctl.v1 import peer_pb2 as pb

HEARTBEAT = 0.25  # s, the client's report interval (client/session.py)
CPU_TARGET = 0.10  # of one core, for 1,000 and 10,000 jobs among 8 replicas
VOLUME = 1 << 30  # bytes of every injected operation
MOVED = 1 << 20  # bytes a moving job reports per λ (--moving)
LINE_LIMIT = 1 << 26  # bytes of one protocol line (a 1,000-job digest is about 80 kB)
Columns = list[dict[JobId, float]]


# ---------------------------------------------------------------------------
# Shared by the parent and the workers


@dataclasses.dataclass(frozen=True)
class Placed:
    job_id: str
    nodes: int
    user: str
    replicas: tuple[int, ...]


def plan(
    replicas: int, jobs: int, interval: float, seed: int
) -> tuple[random.Random, list[float], list[Placed]]:
    """Start offsets in [0, λ) and the job placement: the same in every process for a seed.
    The parent goes on drawing the convergence trials from the returned generator."""
    rng = random.Random(seed)
    offsets = sorted(rng.uniform(0.0, interval) for _ in range(replicas))
    placed = []
    for j in range(jobs):
        nodes = rng.choice([1, 2, 4, 8])
        where = rng.sample(range(replicas), rng.randint(1, min(3, replicas)))
        placed.append(Placed(f"j{j:04d}", nodes, f"u{j % 10}", tuple(where)))
    return rng, offsets, placed


def build_replica(
    index: int, ports: list[int], interval: float, state: Path, placed: list[Placed]
) -> app.Replica:
    """Replica ``index`` with its share of the jobs injected; not started."""
    config = load_config(
        grpc_listen=f"127.0.0.1:{ports[index]}",
        http_listen="127.0.0.1:0",
        capacity="1GiB/s",
        node_bandwidth="256MiB/s",
        policy="size-fair",
        state_dir=state,
        replica_id=f"r{index}",
        peers=[f"127.0.0.1:{p}" for j, p in enumerate(ports) if j != index],
        sync_interval=interval,
        heartbeat_timeout=1e6,  # injected sessions send no heartbeats
        job_retention=1e6,
        log_level="WARNING",
    )
    svc = app.build_replica(config)
    for p in placed:
        if index in p.replicas:
            inject(svc, p.job_id, p.nodes, p.user)
    return svc


def inject(svc: app.Replica, job_id: str, nodes: int, user: str) -> None:
    """One session of ``job_id`` with one open operation, as the servicer makes them."""
    session = svc.table.open_session(JobMeta(job_id, user, "bench", nodes, 1.0), "bench", "local")
    svc.table.post(session, 1, OpKind.WRITE, VOLUME)


def digest_of(svc: app.Replica) -> Digest:
    """What ``svc`` would send now, without touching its own bookkeeping."""
    slot = svc.slot
    return build_digest(
        svc.table,
        replica_id=svc.config.replica_id,
        incarnation=1,
        sequence=1,
        capacity=svc.config.capacity,
        node_bandwidth=svc.config.node_bandwidth,
        policy=(slot.name, slot.params, slot.version, slot.origin),
        usage_seen={},
        now=time.monotonic(),
    )


def same(column: dict[JobId, float] | None, want: dict[JobId, float]) -> bool:
    if column is None or column.keys() != want.keys():
        return False
    return all(math.isclose(column[j], r, rel_tol=1e-9, abs_tol=1e-3) for j, r in want.items())


# ---------------------------------------------------------------------------
# Worker: one replica in its own process


class Worker:
    """Serves the parent's commands, one JSON object a line, until ``quit`` or stdin EOF."""

    def __init__(self, svc: app.Replica, out: int) -> None:
        self.svc = svc
        self.out = out
        self.since: float | None = None  # when the column first equalled the expected one
        self.matched = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        self._mover: asyncio.Task[None] | None = None

    def reply(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg).encode() + b"\n"
        while data:
            data = data[os.write(self.out, data) :]

    async def serve(self) -> None:
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        self.reply({"ready": True})
        while line := await reader.readline():  # b"": the parent is gone
            msg = json.loads(line)
            try:
                answer = await self.handle(msg)
            except Exception as exc:
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            self.reply(answer)
            if msg["cmd"] == "quit":
                break

    async def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        sync = self.svc.peer_sync
        assert sync is not None
        cmd = msg["cmd"]
        if cmd == "start":
            await self.svc.start()
            return {"port": self.svc.grpc_port}
        if cmd == "stats":
            links = sync.links
            return {
                "time": time.monotonic(),
                "cpu": time.process_time(),  # user + sys of every thread of this process
                "exchanges": sync.exchanges,
                "live": len(sync.membership.live_peers()),
                "failures": sum(link.failures for link in links),
                "fulls": sum(link.fulls for link in links),
                "full_bytes": sum(link.full_bytes for link in links),
                "deltas": sum(link.deltas for link in links),
                "delta_bytes": sum(link.delta_bytes for link in links),
                "shares_kept": sync.reused,
            }
        if cmd == "digest":
            wire = to_proto(digest_of(self.svc)).SerializeToString()
            return {"digest": base64.b64encode(wire).decode()}
        if cmd == "expect":
            self.expect(msg["want"])
            return {}
        if cmd == "add_job":
            t = time.monotonic()
            inject(self.svc, msg["job_id"], msg["nodes"], "new")
            return {"t": t}
        if cmd == "wait":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.matched.wait(), msg["timeout"])
            return {"since": self.since}
        if cmd == "match":
            return {"since": self.since}
        if cmd == "move":
            if self._mover is not None:
                self._mover.cancel()
                self._mover = None
            if msg["fraction"] > 0:
                self._mover = asyncio.create_task(
                    self.move(msg["fraction"], msg["wobble"]), name="bench-move"
                )
            return {}
        if cmd == "quit":
            self.expect(None)
            if self._mover is not None:
                self._mover.cancel()
            return {}
        raise ValueError(f"unknown command {cmd!r}")

    def expect(self, want: dict[JobId, float] | None) -> None:
        """Watch the column for ``want`` from now on; None: stop watching."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self.since = None
        self.matched.clear()
        if want is not None:
            self._watch = asyncio.create_task(self.watch(want), name="bench-watch")

    async def move(self, fraction: float, wobble: bool) -> None:
        """Every λ, the first ``fraction`` of the jobs (by id) report MOVED bytes, waiting
        on their allocation; ``wobble``: 0.5–1.5 × MOVED, drawn anew, not waiting."""
        table = self.svc.table
        interval = self.svc.config.sync_interval
        jobs = sorted(table.jobs)
        sessions = [
            s for j in jobs[: round(fraction * len(jobs))] for s in table.jobs[j].sessions.values()
        ]
        rng = random.Random(len(jobs))
        while True:
            for session in sessions:
                moved = round(MOVED * rng.uniform(0.5, 1.5)) if wobble else MOVED
                table.usage(session, moved, 0, 0.0, interval, not wobble)
            await asyncio.sleep(interval)

    async def watch(self, want: dict[JobId, float]) -> None:
        sync = self.svc.peer_sync
        assert sync is not None
        seen: object = object()
        while True:
            column = sync.local_targets
            if column is not seen:  # a new column after each exchange; compare only those
                seen = column
                if not same(column, want):
                    self.since = None
                    self.matched.clear()
                elif self.since is None:
                    self.since = time.monotonic()
                    self.matched.set()
            await asyncio.sleep(0.001)


async def run_worker(args: argparse.Namespace, out: int) -> None:
    ports = [int(p) for p in args.ports.split(",")]
    _, _, placed = plan(len(ports), args.jobs, args.interval, args.seed)
    svc = build_replica(args.index, ports, args.interval, Path(args.state), placed)
    # the controller's own collector settings (cli/daemon.py)
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)
    worker = Worker(svc, out)
    try:
        await worker.serve()
    finally:
        worker.expect(None)
        await svc.stop(grace=0)


def worker_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="one replica, driven over stdin/stdout")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--ports", required=True, help="every replica's gRPC port, comma-separated")
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--state", required=True)
    args = parser.parse_args(argv)
    # Startup digests are rejected until a peer has answered once; those warnings are expected.
    logging.basicConfig(level=logging.ERROR)
    out = os.dup(1)  # the protocol's own descriptor; a stray print() goes to stderr
    os.dup2(2, 1)
    asyncio.run(run_worker(args, out))


# ---------------------------------------------------------------------------
# Parent


class Replica:
    """The parent's handle on one worker process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._lock = asyncio.Lock()

    async def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.pid} exited ({await self.proc.wait()})")
        msg: dict[str, Any] = json.loads(line)
        if "error" in msg:
            raise RuntimeError(f"worker {self.proc.pid}: {msg['error']}")
        return msg

    async def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        async with self._lock:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
            await self.proc.stdin.drain()
            return await self.read()


def reserve_port() -> socket.socket:
    """A loopback port held bound (not listening) until its replica starts: peers need
    fixed ports, and the OS hands no held port to another replica's listener."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


async def spawn(
    workers: list[Replica], ports: list[int], interval: float, jobs: int, seed: int, state: Path
) -> None:
    """Start one worker per port (appended to ``workers`` at once, so a failure still
    stops them) and wait until each has built its replica and injected its jobs."""
    for i in range(len(ports)):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--worker",
            f"--index={i}",
            f"--ports={','.join(map(str, ports))}",
            f"--interval={interval}",
            f"--jobs={jobs}",
            f"--seed={seed}",
            f"--state={state / f'r{i}'}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=LINE_LIMIT,
            # gRPC core logs every GOAWAY of the replicas' shutdown otherwise
            env={"GRPC_VERBOSITY": "ERROR", **os.environ},
        )
        workers.append(Replica(proc))
    await asyncio.gather(*(w.read() for w in workers))


async def start(workers: list[Replica], held: list[socket.socket], offsets: list[float]) -> None:
    """Replica i starts at a random offset in [0, λ): exchange phases independent, as
    between hosts (started back to back, the replicas would exchange nearly in step).
    Its port is released just before it binds it."""
    t0 = time.perf_counter()
    for i, w in enumerate(workers):
        await asyncio.sleep(max(0.0, t0 + offsets[i] - time.perf_counter()))
        held[i].close()
        await w.call("start")


async def stop(workers: list[Replica], grace: float = 2.0) -> None:
    """Stdin EOF asks each worker to stop; then SIGTERM by pid, then SIGKILL."""
    for w in workers:
        if w.proc.stdin is not None:
            w.proc.stdin.close()
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        running = [w.proc for w in workers if w.proc.returncode is None]
        if not running:
            return
        for proc in running:
            if sig is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, sig)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in running)), grace)


async def stats(workers: list[Replica]) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(w.call("stats") for w in workers)))


async def until_live(workers: list[Replica], deadline: float) -> None:
    """Wait until every worker holds a live digest of each of its peers."""
    end = time.monotonic() + deadline
    while any(s["live"] < len(workers) - 1 for s in await stats(workers)):
        if time.monotonic() > end:
            raise SystemExit(f"{len(workers)} replicas: peers not live after {deadline} s")
        await asyncio.sleep(0.05)


async def fetch_wires(workers: list[Replica]) -> list[bytes]:
    """Every worker's serialized digest, as it would send it now."""
    replies = await asyncio.gather(*(w.call("digest") for w in workers))
    return [base64.b64decode(r["digest"]) for r in replies]


def decode(wire: bytes) -> Digest:
    return from_proto(pb.Digest.FromString(wire))


def targets_of(merged: Merged, policy: Policy) -> Any:
    """x per entry: the global decision on the merged view, split (PeerSync._share)."""
    return split_targets(merged, decide(policy, merged.view).rates)


def expected_columns(digests: list[Digest], registry: PolicyRegistry) -> Columns:
    """Every replica's share once all of them hold ``digests`` (PeerSync._share)."""
    merged = merge(sorted(digests, key=lambda d: d.replica_id))
    policy = registry.create(digests[0].policy, digests[0].policy_params)
    matrix = merged.by_edge(targets_of(merged, policy))
    out = []
    for d in digests:
        covered = {j.job_id for j in d.jobs if j.open_op}
        out.append(
            {
                j: rate
                for (j, r), rate in matrix.items()
                if r == d.replica_id and j in covered and math.isfinite(rate)
            }
        )
    return out


async def converge(
    workers: list[Replica], want: Columns, deadline: float, add: tuple[int, str] | None = None
) -> float | None:
    """Seconds from now (or from ``add``: replica index, new job) until every replica's
    column equals ``want``; None: not within ``deadline``. Each worker stamps its first
    matching column itself; the parent only collects the stamps."""
    await asyncio.gather(
        *(w.call("expect", want=col) for w, col in zip(workers, want, strict=True))
    )
    try:
        if add is None:
            t0 = time.monotonic()
        else:
            where, job_id = add
            t0 = (await workers[where].call("add_job", job_id=job_id, nodes=8))["t"]
        end = t0 + deadline
        while (left := end - time.monotonic()) > 0:
            since = [
                r["since"]
                for r in await asyncio.gather(*(w.call("wait", timeout=left) for w in workers))
            ]
            if None in since:
                return None
            # all matched once; still so now (no replica left the state since)?
            if [r["since"] for r in await asyncio.gather(*(w.call("match") for w in workers))] == (
                since
            ):
                return max(0.0, max(since) - t0)
        return None
    finally:
        await asyncio.gather(*(w.call("expect", want=None) for w in workers))


def median_ms(fn: Callable[[], object], repeat: int = 5) -> float:
    """Median CPU time of this thread per call: other processes on the machine do not count."""
    samples = []
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        samples.append(time.thread_time() - t0)
    return round(statistics.median(samples) * 1e3, 3)


def reference_ms() -> float:
    """A fixed pure-Python loop (CPU ms): this VM's speed drifts by up to 2× within
    minutes, so each case records it next to its CPU times."""

    def loop() -> int:
        return sum(i * i for i in range(300_000))

    return median_ms(loop, repeat=3)


def exchange_of(shadow: app.Replica, peer_wires: list[bytes]) -> Callable[[], None]:
    """Replica r0's share of one exchange without gRPC: build and encode its digest,
    decode, validate and take in every peer's, merge, decide and split, keep its
    share. One Membership and one policy instance for every call, as a replica
    keeps them (the check of each peer's policy is made once)."""
    slot = shadow.slot
    members = Membership(shadow.config.replica_id, registry=slot.registry)
    sequence = 0

    def once() -> None:
        nonlocal sequence
        sequence += 1
        own = digest_of(shadow)
        to_proto(own).SerializeToString()
        for data in peer_wires:
            peer = decode(data)
            # a new sequence number each time: accepted, as in steady state
            members.receive(dataclasses.replace(peer, sequence=sequence), 0.0, validated=True)
        merged = merge(members.digests(own))
        merged.share(targets_of(merged, slot.policy), shadow.config.replica_id)

    return once


def pure_parts(shadow: app.Replica, wires: list[bytes]) -> dict[str, float]:
    """The exchange's pure steps, timed alone on replica r0's data."""
    digests = [decode(w) for w in wires]
    ordered = sorted(digests, key=lambda d: d.replica_id)
    policy = shadow.slot.policy
    return {
        "digest_build_ms": median_ms(lambda: digest_of(shadow)),
        "digest_encode_ms": median_ms(lambda: to_proto(digests[0]).SerializeToString()),
        "digest_decode_ms": median_ms(lambda: decode(wires[0])),
        "targets_ms": median_ms(lambda: targets_of(merge(ordered), policy)),
        "exchange_pure_ms": median_ms(exchange_of(shadow, wires[1:])),
    }


def print_profile(shadow: app.Replica, wires: list[bytes], repeat: int = 20) -> None:
    once = exchange_of(shadow, wires[1:])
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(repeat):
        once()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    out.write(
        f"# cProfile of replica r0's exchange without gRPC, {len(wires)} replicas, "
        f"{len(shadow.table.jobs)} jobs here, {repeat} exchanges\n"
    )
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(30)
    print(out.getvalue(), file=sys.stderr)


def new_job(job_id: str, digest: Digest) -> Digest:
    """``digest`` with one more job: 8 nodes and one open operation, as ``add_job`` makes."""
    extra = JobDigest(
        job_id=job_id,
        user="new",
        group="bench",
        nodes=8,
        priority=1.0,
        demand=job_cap(8, digest.node_bandwidth, digest.capacity),
        usage_bytes=0.0,
        progress=0.0,
        released_at=digest.sent_at,  # times are instants on the sender's clock
        posted_at=digest.sent_at,
        remaining=float(VOLUME),
        open_op=True,
    )
    jobs = sorted((*digest.jobs, extra), key=lambda j: j.job_id)
    return dataclasses.replace(digest, jobs=tuple(jobs))


async def run_case(
    replicas: int,
    jobs: int,
    interval: float,
    exchanges: int,
    trials: int,
    seed: int,
    profile: bool,
    moving: float = 0.0,
    wobble: bool = False,
) -> dict:
    rng, offsets, placed = plan(replicas, jobs, interval, seed)
    registry = default_registry()
    with tempfile.TemporaryDirectory(prefix="replica-sync-") as tmp:
        held = [reserve_port() for _ in range(replicas)]
        ports = [int(s.getsockname()[1]) for s in held]
        workers: list[Replica] = []
        try:
            await spawn(workers, ports, interval, jobs, seed, Path(tmp))
            await start(workers, held, offsets)
            await until_live(workers, 20 * interval + 10)
            wires = await fetch_wires(workers)
            want = expected_columns([decode(w) for w in wires], registry)
            if await converge(workers, want, 20 * interval + 10) is None:
                raise SystemExit(f"{replicas}×{jobs}: replicas did not reach the steady state")
            failed0 = sum(s["failures"] for s in await stats(workers))

            # CPU per exchange: the replicas do nothing but exchange for `exchanges` λ.
            if moving:
                await asyncio.gather(
                    *(w.call("move", fraction=moving, wobble=wobble) for w in workers)
                )
            await asyncio.sleep(interval)
            before = await stats(workers)
            await asyncio.sleep(exchanges * interval)
            after = await stats(workers)
            if moving:
                await asyncio.gather(*(w.call("move", fraction=0.0, wobble=False) for w in workers))
                await until_live(workers, 20 * interval + 10)
            reference = reference_ms()
            cpu = [a["cpu"] - b["cpu"] for a, b in zip(after, before, strict=True)]
            wall = [a["time"] - b["time"] for a, b in zip(after, before, strict=True)]
            made = [a["exchanges"] - b["exchanges"] for a, b in zip(after, before, strict=True)]
            sent = {
                key: sum(a[key] - b[key] for a, b in zip(after, before, strict=True))
                for key in ("fulls", "full_bytes", "deltas", "delta_bytes", "shares_kept")
            }
            per_exchange = [c / m for c, m in zip(cpu, made, strict=True)]
            core = [c / w for c, w in zip(cpu, wall, strict=True)]

            # Convergence: one new job at a random instant of the exchange cycle.
            times: list[float | None] = []
            for t in range(trials):
                await asyncio.sleep(rng.uniform(0.0, interval))
                where = rng.randrange(replicas)
                job_id = f"new{t}"
                digests = [decode(w) for w in await fetch_wires(workers)]
                digests[where] = new_job(job_id, digests[where])
                want = expected_columns(digests, registry)  # computed before the clock starts
                times.append(await converge(workers, want, 10 * interval + 5, (where, job_id)))
            # Sends that failed since the steady state (deadline λ): a loop too busy.
            failures = sum(s["failures"] for s in await stats(workers)) - failed0
        finally:
            for sock in held:
                sock.close()
            await stop(workers)

        # The pure parts once the workers are gone: they would compete for the cores.
        shadow = build_replica(0, ports, interval, Path(tmp) / "shadow", placed)
        parts = pure_parts(shadow, wires)
        if profile:
            print_profile(shadow, wires)

    sizes = [len(w) for w in wires]

    done = [x for x in times if x is not None]
    target = interval + HEARTBEAT
    worst = max(done) if len(done) == len(times) and done else math.inf
    return {
        "replicas": replicas,
        "jobs": jobs,
        "interval_s": interval,
        "moving_fraction": moving,
        "wobble": wobble,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "digest_bytes_mean": round(statistics.fmean(sizes)),
        "digest_bytes_max": max(sizes),
        "full_digests_sent": sent["fulls"],
        "full_bytes_mean": round(sent["full_bytes"] / sent["fulls"]) if sent["fulls"] else None,
        "deltas_sent": sent["deltas"],
        "delta_bytes_mean": round(sent["delta_bytes"] / sent["deltas"]) if sent["deltas"] else None,
        "shares_kept": sent["shares_kept"],
        "exchanges": sum(made),
        "exchange_period_s": round(
            statistics.fmean(w / m for w, m in zip(wall, made, strict=True)), 3
        ),
        "failed_sends": failures,
        "cpu_per_exchange_ms_mean": round(statistics.fmean(per_exchange) * 1e3, 3),
        "cpu_per_exchange_ms_max": round(max(per_exchange) * 1e3, 3),
        "cpu_fraction_per_replica_mean": round(statistics.fmean(core), 4),
        "cpu_fraction_per_replica_max": round(max(core), 4),
        "cpu_fraction_all_replicas": round(sum(cpu) / statistics.fmean(wall), 4),
        "reference_loop_ms": reference,
        **parts,
        "convergence_trials": len(times),
        "convergence_timeouts": len(times) - len(done),
        "convergence_s_median": round(statistics.median(done), 3) if done else None,
        "convergence_s_max": round(worst, 3) if math.isfinite(worst) else None,
        "convergence_intervals_median": (
            round(statistics.median(done) / interval, 2) if done else None
        ),
        "convergence_intervals_max": round(worst / interval, 2) if math.isfinite(worst) else None,
        "convergence_target_s": target,
        "meets_convergence_target": worst <= target,
        "meets_convergence_target_in_intervals": worst <= 1.5 * interval,
        "meets_cpu_target": (
            max(core) <= CPU_TARGET
            if replicas == 8 and jobs in (1000, 10000) and interval == 0.5
            else None
        ),
    }


async def run_all(args: argparse.Namespace) -> list[dict]:
    return [
        await run_case(
            r,
            n,
            args.interval,
            args.exchanges,
            args.trials,
            args.seed,
            args.profile,
            args.moving,
            args.wobble,
        )
        for r in args.replicas
        for n in args.jobs
    ]


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--jobs", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--interval", type=float, default=0.5, help="λ, seconds")
    parser.add_argument("--exchanges", type=int, default=10, help="λ in the CPU window")
    parser.add_argument("--trials", type=int, default=5, help="convergence trials per case")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--moving", type=float, default=0.0, help="fraction of jobs moving bytes every λ"
    )
    parser.add_argument(
        "--wobble", action="store_true", help="moving jobs' demand changes every λ (--moving)"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile one exchange (stderr)")
    parser.add_argument("--quick", action="store_true", help="2 replicas, 10 and 100 jobs")
    args = parser.parse_args()
    if args.quick:
        args.replicas, args.jobs, args.exchanges, args.trials = [2], [10, 100], 4, 2
    logging.basicConfig(level=logging.ERROR)
    load_before = os.getloadavg()[0]
    runs = asyncio.run(run_all(args))
    report = {
        "benchmark": "replica_sync",
        "harness": "one process per replica",
        "policy": "size-fair",
        "capacity_per_replica": "1GiB/s",
        "node_bandwidth": "256MiB/s",
        "heartbeat_s": HEARTBEAT,
        # other work on the machine: CPU time is less disturbed by it than wall time
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpu_count": os.cpu_count(),
        "runs": runs,
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
