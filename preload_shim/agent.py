"""The node agent (``burstctl agent``): one client session per job, one shared page per job.

The library in each process of a job connects to the agent's socket at its first paced open;
the agent takes the peer's credentials (``SO_PEERCRED``), resolves its job with the
`Attributor` and `Pacer` it shares with the mount (`burstctl.node`; `Pacer.admit`: the session
per (job, user), the attach wait for a named job, the controller's refusal sending the caller
to its own default job) and hands back that job's `JobPage` and eventfd. The pacing itself
happens in the processes, on the page; the agent:

- publishes every allocation or fallback of the job's session to its page (the session's
  bucket observer); with a pattern of windows, each window's rate at its edges, dropping the
  tokens nobody reserved when a window ends; and the session's metadata rate to the page's
  metadata supply (its metadata observer; docs/preload.md, "Metadata calls");
- every ``--tick`` seconds beats each page's heartbeat and books the bytes the job's processes
  asked for since the last tick on its session (`Pacer.record`: the session's counters and
  phases, as the mount's requests) and the metadata calls they made (counted only), and
  tells the session whether the job waits for tokens
  (`Pacer.waiting`); a process that starts waiting writes the eventfd, which ticks its page
  at once;
- counts each attached connection as an open file of the job (`Pacer.opened` / `released`),
  so the job's last process ending ends its phase as the mount's last close does;
- closes a page (`JobPage.mark_closed`) once it has had no connection and its job no session
  for ``--session-idle``; the library then stops pacing and attaches again at its next open;
- feeds each page the space its job's session was granted on the burst buffer and forwards
  the bytes landed there (`space.SpaceFeeder`, one thread per page, stepped every tick and at
  once when a process starts waiting);
- runs the stage-out of its directories (`staging.AgentStage`): the library tells it of every
  paced open and close (``OPEN``/``CLOSE`` with the descriptor, each on a connection of its
  own), so that the jobs' files are tagged, counted on the buffer, drained to the PFS and
  evicted as the mount's are, and evicted files are read from the PFS or restored.

Threads: the pages, the slots and the socket live on the agent's asyncio loop (the main
thread). Admission may wait for the controller (the attach timeout), so it runs in a pool;
the pacer's bookings run in order on one worker thread; the opens and closes the library tells
run in a pool (a restore may wait for space and bandwidth). The sessions run on the client
runtime's loop thread; their observers only hand the new bucket over to the agent's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from burstctl.client.bucket import Pattern
from burstctl.client.job import JobInfo
from burstctl.client.runtime import ClientRuntime
from burstctl.node.attribution import Attributor, Caller
from burstctl.node.pacer import Pacer
from burstctl.node.sessions import client_session_factory
from burstctl.preload_shim import server
from burstctl.preload_shim.config import AgentConfig
from burstctl.preload_shim.page import JobPage, monotonic_ns
from burstctl.preload_shim.space import SpaceFeeder
from burstctl.preload_shim.staging import AgentStage

logger = logging.getLogger(__name__)

# The most bytes one tick books from one counter: the page is writable by the job's own
# processes, so a counter may jump anywhere; it can only ever inflate its own job's books.
MAX_TICK_BYTES = 1 << 40
# Threads that admit attaching processes (each may wait up to the attach timeout).
_ADMIT_THREADS = 8
# Threads that answer the opens and closes the library tells (a restore may wait long).
_STAGE_THREADS = 8
# The most descriptors one message carries (the library sends one).
_MAX_FDS = 4

Key = tuple[str, str]  # (job id, user)
Bucket = tuple[float, float, Pattern | None]


@dataclass
class JobSlot:
    """One (job, user) as the agent sees it: its page, connections and last counters."""

    job: JobInfo
    page: JobPage | None = None
    conns: dict[int, int] = field(default_factory=dict)  # connection id -> pid
    bucket: Bucket | None = None  # the session's last allocation or fallback
    edge: asyncio.TimerHandle | None = None  # the next window edge of a pattern
    req_read: int = 0
    req_write: int = 0
    calls_meta: int = 0
    metadata: float = 0.0  # the session's metadata rate (ops/s, 0: unpaced)
    waiting: bool = False
    idle_since: float | None = None  # no connection and no session since
    space: SpaceFeeder | None = None  # the page's space on the burst buffer

    @property
    def key(self) -> Key:
        return (self.job.job_id, self.job.user)


class Agent:
    """The agent: its pacer, its pages and its socket (``listener``, from `server.listen`),
    on the running asyncio loop."""

    def __init__(
        self,
        config: AgentConfig,
        listener: socket.socket,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._clock = clock
        self.runtime = ClientRuntime(name="burstctl-agent-client")
        self.attributor = Attributor(config.attribution_ttl)
        self.pacer = Pacer(
            config,
            self.attributor,
            runtime=self.runtime,
            session_factory=client_session_factory(
                config,
                self.runtime,
                observer_for=self._observer_for,
                metadata_observer_for=self._metadata_observer_for,
            ),
            drain_session_factory=(
                None
                if config.stage_out is None
                else client_session_factory(config, self.runtime, "drain")
            ),
        )
        self.slots: dict[Key, JobSlot] = {}
        self.stage = AgentStage(config, self.pacer, self._hold_writes)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._admit = concurrent.futures.ThreadPoolExecutor(
            _ADMIT_THREADS, thread_name_prefix="burstctl-agent-admit"
        )
        self._book = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="burstctl-agent-book"
        )
        self._staging = concurrent.futures.ThreadPoolExecutor(
            _STAGE_THREADS, thread_name_prefix="burstctl-agent-stage"
        )
        self._reaping: concurrent.futures.Future[None] | None = None
        self._conn_ids = itertools.count(1)
        self._listener: socket.socket | None = listener
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False

    # ------------------------------------------------------------------ the pages' supply

    def _observer_for(self, job: JobInfo) -> Callable[[float, float, Pattern | None], None]:
        """The bucket observer of the job's session: hands each bucket to the agent's loop."""
        key = (job.job_id, job.user)

        def observe(rate: float, burst: float, pattern: Pattern | None) -> None:
            self._on_loop(self._apply_bucket, key, job, (rate, burst, pattern))

        return observe

    def _metadata_observer_for(self, job: JobInfo) -> Callable[[float], None]:
        """The metadata rate observer of the job's session: hands each rate to the loop."""
        key = (job.job_id, job.user)
        return lambda rate: self._on_loop(self._apply_metadata, key, job, rate)

    def _on_loop(self, callback: Callable[..., None], *args: Any) -> None:
        """Runs ``callback(*args)`` on the agent's loop (from a session's loop thread)."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the agent stops
                loop.call_soon_threadsafe(callback, *args)

    def _apply_metadata(self, key: Key, job: JobInfo, rate: float) -> None:
        if self._stopping:
            return
        slot = self.slots.get(key) or self._slot(job)
        slot.metadata = rate
        if slot.page is not None:
            slot.page.publish_metadata(rate)

    def _slot(self, job: JobInfo) -> JobSlot:
        slot = self.slots.get((job.job_id, job.user))
        if slot is None:
            slot = self.slots[job.job_id, job.user] = JobSlot(job)
        return slot

    def _apply_bucket(self, key: Key, job: JobInfo, bucket: Bucket) -> None:
        if self._stopping:
            return
        slot = self.slots.get(key) or self._slot(job)
        slot.bucket = bucket
        self._publish(slot)

    def _publish(self, slot: JobSlot) -> None:
        """Writes the slot's bucket to its page (a pattern: the rate in force, and a timer
        for the next window edge)."""
        if slot.edge is not None:
            slot.edge.cancel()
            slot.edge = None
        if slot.page is None or slot.bucket is None:
            return
        rate, burst, pattern = slot.bucket
        if pattern is None:
            slot.page.publish(rate, burst)
            return
        now = self._clock()
        slot.page.publish(pattern.rate_at(now), burst)
        self._arm_edge(slot, pattern, now)

    def _arm_edge(self, slot: JobSlot, pattern: Pattern, now: float) -> None:
        assert self._loop is not None
        at = pattern.next_edge(now)
        slot.edge = self._loop.call_later(max(0.0, at - now), self._on_edge, slot, pattern)

    def _on_edge(self, slot: JobSlot, pattern: Pattern | None) -> None:
        """A window of the pattern starts or ends: its rate goes to the page."""
        slot.edge = None
        if slot.page is None or slot.bucket is None or slot.bucket[2] is not pattern:
            return  # closed, or another bucket came since
        if pattern is None:
            return
        now = self._clock()
        rate = pattern.rate_at(now)
        if rate < slot.page.rate:
            # A window ended: what it earned and nobody reserved is not carried over
            # (as the client's bucket drops it between windows).
            slot.page.drop_unreserved()
        slot.page.publish(rate, slot.bucket[1])
        self._arm_edge(slot, pattern, now)

    # ------------------------------------------------------------------ the tick

    def tick(self) -> None:
        """Beats every page, books its counters' growth, closes pages idle long enough."""
        now = self._clock()
        for slot in list(self.slots.values()):
            if slot.page is not None:
                slot.page.beat()
                self._account(slot)
            if slot.space is not None:
                slot.space.poke()
            self._close_if_idle(slot, now)
        if self._reaping is None or self._reaping.done():
            self._reaping = self._staging.submit(self._booked, self.stage.reap)

    def _account(self, slot: JobSlot) -> None:
        """Books the bytes the job's processes asked for since the last look; the waiters."""
        page = slot.page
        assert page is not None
        counters = page.counters()
        job = slot.job
        for kind, now_at in (("read", counters.req_read), ("write", counters.req_write)):
            before = slot.req_read if kind == "read" else slot.req_write
            # The page is the job's own: a counter that went back or jumped books 0 or the
            # cap, and counting goes on from where it is now.
            delta = min(max(now_at - before, 0), MAX_TICK_BYTES)
            if kind == "read":
                slot.req_read = now_at
            else:
                slot.req_write = now_at
            if delta:
                self._book.submit(self._booked, self.pacer.record, job, kind, delta)
        calls = min(max(counters.calls_meta - slot.calls_meta, 0), MAX_TICK_BYTES)
        slot.calls_meta = counters.calls_meta
        if calls:  # metadata calls: counted, no bytes, no phase (client/core.py)
            self._book.submit(self._booked, self.pacer.record, job, "metadata", 0, calls)
        now_ns = monotonic_ns()
        waiting = counters.waiting(now_ns)
        if page.forgive_the_dead(counters, now_ns):
            logger.info(
                "job %s: a process died waiting for tokens: its tokens supplied", job.job_id
            )
        if waiting != slot.waiting:
            slot.waiting = waiting
            self._book.submit(self._booked, self.pacer.waiting, job, waiting)

    @staticmethod
    def _booked(call: Callable[..., None], *args: Any) -> None:
        try:
            call(*args)
        except Exception:  # never let one booking stop the others
            logger.exception("booking on a job's session failed")

    def _on_event(self, slot: JobSlot) -> None:
        """The page's eventfd: a process started waiting; tick that page now."""
        if slot.page is None:
            return
        slot.page.drain_events()
        slot.page.beat()
        self._account(slot)
        if slot.space is not None:
            slot.space.poke()

    def _close_if_idle(self, slot: JobSlot, now: float) -> None:
        if slot.conns or self.pacer.session_of(slot.job) is not None:
            slot.idle_since = None
            return
        if slot.idle_since is None:
            slot.idle_since = now
            return
        if now - slot.idle_since < self.config.session_idle:
            return
        self._drop(slot)
        del self.slots[slot.key]
        logger.info("job %s (%s): page closed (idle)", slot.job.job_id, slot.job.user)

    def _drop(self, slot: JobSlot) -> None:
        """Closes the slot's page: the library stops drawing from it."""
        if slot.edge is not None:
            slot.edge.cancel()
            slot.edge = None
        if slot.waiting:
            slot.waiting = False
            self._book.submit(self._booked, self.pacer.waiting, slot.job, False)
        space, slot.space = slot.space, None
        if space is not None:
            space.stop()
        page, slot.page = slot.page, None
        if page is not None:
            assert self._loop is not None
            self._loop.remove_reader(page.eventfd)
            page.close()

    @contextlib.contextmanager
    def _hold_writes(self, job: JobInfo | None) -> Iterator[bool]:
        """Holds the job's processes out of their paced writes, on every page of the job (one
        per user): True once none is in flight (`JobPage.hold_writes`)."""
        pages = [
            s.page
            for s in list(self.slots.values())
            if s.page and job and s.job.job_id == job.job_id
        ]
        with contextlib.ExitStack() as stack:
            try:
                held = all([stack.enter_context(page.hold_writes()) for page in pages])
            except (AttributeError, ValueError, OSError):  # a page closed under us
                held = False
            yield held and bool(pages)

    def _page_of(self, slot: JobSlot) -> JobPage:
        """The slot's page, created (with the session's last bucket) on first attach."""
        if slot.page is None:
            page = JobPage(f"burstctl-job-{slot.job.job_id}")
            if self.config.stage_out is not None:
                page.mark_staging()
            slot.page = page
            counters = page.counters()
            slot.req_read, slot.req_write = counters.req_read, counters.req_write
            slot.calls_meta = counters.calls_meta
            assert self._loop is not None
            self._loop.add_reader(page.eventfd, self._on_event, slot)
            self._publish(slot)
            page.publish_metadata(slot.metadata)
            job = slot.job
            slot.space = SpaceFeeder(
                page,
                f"burstctl-agent-space-{job.job_id}",
                session_of=lambda: self.pacer.session_of(job),
                measure=lambda: self.stage.refresh(job),
            )
            logger.info("job %s (%s): page created", slot.job.job_id, slot.job.user)
        return slot.page

    # ------------------------------------------------------------------ the socket

    async def serve(self, stop: asyncio.Event) -> None:
        """Listens, ticks and answers until ``stop`` is set; then cleans up."""
        self._loop = asyncio.get_running_loop()
        logger.info(
            "agent listening on %s, pacing %s through %s",
            self.config.socket,
            ":".join(self.config.paths),
            self.config.controller,
        )
        await asyncio.to_thread(self.stage.start)
        accept = asyncio.create_task(self._accept())
        ticker = asyncio.create_task(self._ticks())
        try:
            await stop.wait()
        finally:
            accept.cancel()
            ticker.cancel()
            await self.close()

    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick)
            try:
                self.tick()
            except Exception:  # never let the tick die: pages would look dead
                logger.exception("agent tick failed")

    async def _accept(self) -> None:
        assert self._loop is not None and self._listener is not None
        while True:
            conn, _ = await self._loop.sock_accept(self._listener)
            conn.setblocking(False)
            task = asyncio.create_task(self._serve_conn(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve_conn(self, conn: socket.socket) -> None:
        assert self._loop is not None
        conn_id = next(self._conn_ids)
        attached: JobSlot | None = None
        try:
            caller = server.peer_of(conn)
            while True:
                try:
                    message, fds = await server.receive(self._loop, conn, _MAX_FDS)
                except OSError:
                    return
                if not message:
                    return  # EOF: the process is done (or never attached)
                if attached is not None:
                    continue  # an attached library sends nothing else
                words = message.strip()
                if fds:
                    await self._told(conn, caller, words, fds)
                elif words == server.ATTACH:
                    attached = await self._attach(conn, conn_id, caller)
                elif words == b"PATHS":
                    server.send(conn, b"PATHS " + ":".join(self.config.paths).encode())
                elif words == b"STATUS":
                    server.send(conn, b"STATUS " + json.dumps(self.status()).encode())
                else:
                    server.send(conn, b"NO unknown request")
        finally:
            if attached is not None:
                attached.conns.pop(conn_id, None)
                if not self._stopping:
                    self._book.submit(self._booked, self.pacer.released, conn_id)
            conn.close()

    async def _told(
        self, conn: socket.socket, caller: Caller, words: bytes, fds: list[int]
    ) -> None:
        """An open (answered) or a close the library tells, with its descriptor."""
        assert self._loop is not None
        for extra in fds[1:]:
            os.close(extra)
        fd = fds[0]
        verb, _, arg = words.partition(b" ")
        try:
            if verb == b"OPEN" and arg.lstrip(b"-").isdigit():
                answer = await self._loop.run_in_executor(
                    self._staging, self.stage.opened, caller, fd, int(arg)
                )
                sent = () if answer.fd is None else (answer.fd,)
                server.send(conn, answer.text.encode(), sent)
                if answer.fd is not None:
                    os.close(answer.fd)
            elif verb == b"CLOSE":
                await self._loop.run_in_executor(self._staging, self.stage.closed, caller, fd)
            else:
                os.close(fd)
                server.send(conn, b"NO unknown request")
        except Exception:
            logger.exception("the stage-out of pid %d's %s failed", caller.pid, verb.decode())
            if verb == b"OPEN":
                server.send(conn, b"SKIP")

    async def _attach(self, conn: socket.socket, conn_id: int, caller: Caller) -> JobSlot | None:
        """Admits the caller's job, gives it the job's page; the slot, or None (refused)."""
        assert self._loop is not None
        try:
            job = await self._loop.run_in_executor(self._admit, self.pacer.admit, caller)
        except Exception as err:
            logger.exception("admitting pid %d failed", caller.pid)
            server.send(conn, f"NO {err}".encode())
            return None
        if job is None or self._stopping:
            server.send(conn, b"NO the agent is stopping")
            return None
        slot = self._slot(job)
        page = self._page_of(slot)
        if not server.send(
            conn, f"OK {server.PROTOCOL} {job.job_id}".encode(), (page.fd, page.eventfd)
        ):
            return None
        slot.conns[conn_id] = caller.pid
        slot.idle_since = None
        self._book.submit(self._booked, self.pacer.opened, caller, conn_id)
        logger.debug("pid %d (uid %d) attached to job %s", caller.pid, caller.uid, job.job_id)
        return slot

    # ------------------------------------------------------------------ status and close

    def status(self) -> dict[str, Any]:
        """The agent's jobs (page, counters, connections) for STATUS."""
        jobs = []
        for slot in self.slots.values():
            entry: dict[str, Any] = {
                "job_id": slot.job.job_id,
                "user": slot.job.user,
                "connections": sorted(slot.conns.values()),
                "session": self.pacer.session_of(slot.job) is not None,
                "page": slot.page is not None,
                "waiting": slot.waiting,
            }
            if slot.page is not None:
                rate = slot.page.rate
                entry["rate"] = None if math.isinf(rate) else rate
                entry["unlimited"] = math.isinf(rate)
                entry["burst"] = slot.page.burst
                entry["metadata_rate"] = slot.page.metadata_rate
                entry["counters"] = dataclasses.asdict(slot.page.counters())
                entry["space"] = dataclasses.asdict(slot.page.space())
            if slot.bucket is not None:
                entry["pattern"] = slot.bucket[2] is not None
            jobs.append(entry)
        return {
            "paths": list(self.config.paths),
            "open_files": self.stage.open_files(),
            "pending_copies": self.stage.pending_copies(),
            "jobs": jobs,
            "connections": {
                str(pid): slot.job.job_id
                for slot in self.slots.values()
                for pid in slot.conns.values()
            },
        }

    async def close(self) -> None:
        """Marks every page closed, removes the socket, closes every session (Goodbye)."""
        self._stopping = True
        for slot in self.slots.values():
            if slot.page is not None:
                slot.page.mark_closed()  # first: the library stops pacing at once
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(FileNotFoundError):
                self.config.socket.unlink()
            listener.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for slot in self.slots.values():
            self._drop(slot)
        self._book.shutdown(wait=True)
        self._admit.shutdown(wait=False, cancel_futures=True)
        # The pacer first: closing the sessions lets go of any restore waiting for space.
        await asyncio.to_thread(self.pacer.close)
        self._staging.shutdown(wait=True, cancel_futures=True)
        await asyncio.to_thread(self.stage.close)
        await asyncio.to_thread(self.runtime.close)


def run_agent(config: AgentConfig) -> int:
    """Runs the agent until SIGTERM or SIGINT; 0 on a clean stop."""

    listener = server.listen(config.socket)  # before anything starts: AgentError

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Agent(config, listener).serve(stop)
        logger.info("agent stopped")

    asyncio.run(main())
    return 0
