"""One job's pacing page: the shared memory between the node agent and the preload library.

The agent creates one page per (job, user) as an anonymous ``memfd`` and passes it, with an
``eventfd``, over its Unix socket (``SCM_RIGHTS``) to each process of the job that attaches.
The library maps it ``MAP_SHARED`` and draws tokens from it with atomic operations: no socket
round trip per read or write. The layout (little-endian, native alignment, `PAGE_SIZE` bytes)
is the contract with the library (``preload_shim/page.c``); both sides check `MAGIC` and `VERSION`.

===== ====== ============== ==========================================================
off   type   name           meaning (writer)
===== ====== ============== ==========================================================
0     u32    magic          `MAGIC` (agent, once)
4     u32    version        `VERSION` (agent, once)
8     u64    seq            seqlock over t0/filled0/rate/burst: odd while written (agent)
16    i64    t0_ns          CLOCK_MONOTONIC ns the supply is anchored at (agent)
24    i64    filled0        tokens (bytes, cumulative) supplied up to t0 (agent)
32    f64    rate           bytes/s from t0 on; 0 = wait; +inf = unlimited (agent)
40    i64    burst          bytes: unused tokens beyond this are not kept (agent)
48    i64    heartbeat_ns   CLOCK_MONOTONIC ns of the agent's last tick (agent)
56    u32    flags          `FLAG_CLOSED`: the agent dropped the page: stop, reconnect;
                            `FLAG_STAGE`: the agent stages out: tell it every open
64    i64    taken          tokens reserved so far (library, compare-and-swap)
128   u64    req_read       bytes asked for by paced reads (library, atomic add)
136   u64    req_write      bytes asked for by paced writes
144   u64    moved_read     bytes paced reads returned
152   u64    moved_write    bytes paced writes returned
160   u64    calls_read     paced read calls
168   u64    calls_write    paced write calls
192   i64    waiters        library threads waiting for tokens now (atomic add/sub)
200   u64    wait_ns        ns waited, added when each wait ends
208   u64    waits          waits started
216   i64    wait_beat_ns   CLOCK_MONOTONIC ns a waiter last looked at the supply (library)
256   i64    space_limit    the most space_claimed may reach; INT64_MAX: unlimited (agent)
264   i64    space_claimed  bytes of writes claimed on the burst buffer (library, CAS)
272   i64    space_landed   of them, bytes whose write returned (library, atomic add)
280   i64    space_want     the claims a waiter for space needs covered (library, CAS max)
288   i64    writing        paced writes in flight while the agent stages out (library, add)
296   i64    hold           1 while the agent holds the job's writes out (agent)
320   u64    meta_seq       seqlock over the metadata supply, 328..359 (agent)
328   i64    meta_t0_ns     as t0_ns, for metadata operations (agent)
336   i64    meta_filled0   operations (cumulative) supplied up to meta_t0 (agent)
344   f64    meta_rate      operations/s from meta_t0 on; +inf = unpaced (agent)
352   i64    meta_burst     operations: unused ones beyond this are not kept (agent)
360   i64    meta_taken     operations reserved so far (library, compare-and-swap)
368   u64    calls_meta     paced metadata calls (library, atomic add)
===== ====== ============== ==========================================================

The library maps a page only if it is at least `PAGE_SIZE` bytes and sealed against shrinking
(``F_SEAL_SHRINK``, which `JobPage` sets): a page that shrank under a mapping would kill the
application with ``SIGBUS``.

The supply is ``filled(t) = filled0 + rate * (t - t0)`` (``filled0`` while the rate is 0). A
paced call of n bytes reserves with one compare-and-swap on ``taken``:
``new = max(taken, filled(now) - burst) + n`` (tokens beyond the burst that nobody used are
skipped, as the client's token bucket caps them), then waits until ``filled(now) >= new``,
re-reading the supply (a rate change re-times the wait), in slices, and stops waiting when the
agent's heartbeat is older than the library's dead-agent bound. The first waiter (``waiters``
0 → 1) writes 1 to the eventfd so that the agent tells the controller at once.

A process killed while it waits (SIGKILL, or SIGTERM's default action: the wait is a sleep in
the process, which any signal ends) cannot take itself off ``waiters``. So every waiter stamps
``wait_beat_ns`` as it starts and after each slice of its sleep, and the page counts as waited
on only while ``waiters > 0`` and that stamp is younger than `WAIT_STALE_NS` (`Counters.waiting`):
a count left by the dead is taken as nobody once it stops being stamped, and the next waiter
writes the eventfd then too, as the first one does. The tokens the dead reserved are then
supplied at once (`JobPage.forgive_the_dead`): no one is left to use them, and the next caller
would otherwise wait for them.

A paced call adds its bytes to ``req_*`` (and 1 to ``calls_*``) when it is asked for, before it
waits: the agent books ``req_*`` on the job's session every tick, which is what opens the job's
I/O phase at the controller; under a policy that allots a rate only to jobs in I/O (fair
share), a call that counted its bytes only after its wait would wait for a rate that never
comes.

The burst buffer's space (docs/capacity.md, "The space contract"): a paced write, once its
tokens are drawn, claims its bytes with one compare-and-swap on ``space_claimed`` while
``space_claimed + n <= space_limit``; beyond, it waits as for tokens (one of ``waiters``, the
eventfd, slices, the same dead-agent bound), having raised ``space_want`` to what it needs.
After the call it adds its claim to ``space_landed``. The agent raises ``space_limit`` out of
the space the job's session was granted (`preload_shim.space`), and forwards ``space_landed``
to the session once the job's resident bytes, measured after reading it, count those bytes:
claimed-but-not-landed bytes stay granted-and-unused in the controller's books. A new page is
unlimited; the agent's feed sets its limit to 0 before the page is handed out, so that its
first write waits for the agent's first grant.

Metadata operations (docs/preload.md, "Metadata calls"): the page has a second supply of the
same shape, one token per metadata call of a process on a path under the agent's paths
(``preload_shim/meta.c``). A call draws and waits as a read or write does, on that supply
(``meta_*``), but is no waiter of the page: a metadata limit is no wait for bandwidth, the
controller is not told. The agent publishes the job's session's metadata rate there
(`JobPage.publish_metadata`; unpaced, +inf, until one comes) and books ``calls_meta``.

This module is the agent's side: create, publish, beat, read the counters. When the library
is built, `JobPage` makes its stores and loads through the library's own exported helpers
(``burstctl_page_publish``/``_load``/``_store``: ``__atomic`` builtins with release/acquire
ordering, right on x86-64 and aarch64 alike), loaded with ``ctypes.CDLL`` (``RTLD_LOCAL``:
nothing is interposed in the agent's process); without it, with aligned ctypes stores.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import mmap
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from burstctl.client.metadata import metadata_burst

PAGE_SIZE = 4096
MAGIC = 0x31504342  # "BCP1"
VERSION = 4
FLAG_CLOSED = 1
FLAG_STAGE = 2

OFF_MAGIC = 0
OFF_VERSION = 4
OFF_SEQ = 8
OFF_T0 = 16
OFF_FILLED0 = 24
OFF_RATE = 32
OFF_BURST = 40
OFF_HEARTBEAT = 48
OFF_FLAGS = 56
OFF_TAKEN = 64
OFF_REQ_READ = 128
OFF_REQ_WRITE = 136
OFF_MOVED_READ = 144
OFF_MOVED_WRITE = 152
OFF_CALLS_READ = 160
OFF_CALLS_WRITE = 168
OFF_WAITERS = 192
OFF_WAIT_NS = 200
OFF_WAITS = 208
OFF_WAIT_BEAT = 216

# A page's waiters count only while one of them stamped ``wait_beat_ns`` this recently (they
# stamp it every 10 ms, the library's longest sleep); the library's WAIT_STALE_NS says the same.
WAIT_STALE_NS = 500_000_000
OFF_SPACE_LIMIT = 256
OFF_SPACE_CLAIMED = 264
OFF_SPACE_LANDED = 272
OFF_SPACE_WANT = 280
OFF_WRITING = 288
OFF_HOLD = 296
OFF_META_SEQ = 320  # the metadata supply: its t0, filled0, rate and burst follow, as at OFF_SEQ
OFF_META_TAKEN = 360
OFF_CALLS_META = 368
HOLD_TIMEOUT = 0.05  # s: how long a hold waits for the writes in flight
HOLD_POLL = 0.0005
SPACE_UNLIMITED = (1 << 63) - 1


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The built preload library's page helpers, or None when it is not built."""
    from burstctl.preload_shim.library import LibraryMissing, library_path

    try:
        lib = ctypes.CDLL(str(library_path()))  # RTLD_LOCAL: its interposers stay private
    except (LibraryMissing, OSError):
        return None
    vp, i64, i32, u32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_uint32
    lib.burstctl_page_publish.argtypes = [vp, i32, i64, i64, ctypes.c_double, i64]
    lib.burstctl_page_publish.restype = i32
    lib.burstctl_page_load.argtypes = [vp, i32]
    lib.burstctl_page_load.restype = i64
    lib.burstctl_page_store.argtypes = [vp, i32, i64]
    lib.burstctl_page_store.restype = None
    lib.burstctl_page_or_flags.argtypes = [vp, u32]
    lib.burstctl_page_or_flags.restype = u32
    lib.burstctl_page_reserve_and_wait.argtypes = [vp, i64, i32, i32]
    lib.burstctl_page_reserve_and_wait.restype = i32
    for name in ("burstctl_page_hold", "burstctl_page_writing"):
        getattr(lib, name).argtypes = [vp]
        getattr(lib, name).restype = i64
    lib.burstctl_page_release.argtypes = [vp]
    lib.burstctl_page_release.restype = None
    return lib


def monotonic_ns() -> int:
    """CLOCK_MONOTONIC in ns, the clock both sides of a page use."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@dataclass(frozen=True, slots=True)
class Counters:
    """A page's library-side counters, as read at one moment."""

    taken: int
    req_read: int
    req_write: int
    moved_read: int
    moved_write: int
    calls_read: int
    calls_write: int
    waiters: int
    wait_ns: int
    waits: int
    wait_beat_ns: int = 0
    calls_meta: int = 0

    def waiting(self, now_ns: int) -> bool:
        """Whether a process waits for tokens at ``now_ns`` (its beat is fresh: module doc)."""
        return self.waiters > 0 and now_ns - self.wait_beat_ns < WAIT_STALE_NS


class _Supply:
    """The views of one supply on the page: its seqlock word at ``at``, then t0, filled0,
    rate and burst (the bytes' at `OFF_SEQ`, the metadata operations' at `OFF_META_SEQ`)."""

    __slots__ = ("at", "burst", "filled0", "rate", "seq", "t0")

    def __init__(self, buffer: mmap.mmap, at: int) -> None:
        self.at = at
        self.seq = ctypes.c_uint64.from_buffer(buffer, at)
        self.t0 = ctypes.c_int64.from_buffer(buffer, at + 8)
        self.filled0 = ctypes.c_int64.from_buffer(buffer, at + 16)
        self.rate = ctypes.c_double.from_buffer(buffer, at + 24)
        self.burst = ctypes.c_int64.from_buffer(buffer, at + 32)

    def filled(self, now_ns: int) -> float:
        """Tokens supplied up to ``now_ns`` by the curve in force (inf while unlimited)."""
        rate = self.rate.value
        if rate == math.inf:
            return math.inf
        return self.filled0.value + rate * max(0, now_ns - self.t0.value) / 1e9


@dataclass(frozen=True, slots=True)
class Space:
    """A page's space counters, as read at one moment (``landed`` first: see `JobPage.space`)."""

    landed: int
    claimed: int
    want: int
    limit: int


class JobPage:
    """The agent's handle on one job's page: a memfd, its mapping and its eventfd.

    Only the agent's threads call it (under its own lock where they may race); the library's
    fields are only read here. With the library built, every store and load that processes
    share goes through its ``__atomic`` helpers (release stores, acquire loads, the seqlock
    with its fences); without it, aligned 8-byte ctypes stores in program order, which are
    single instructions but carry no ordering guarantee on weakly ordered CPUs (aarch64).
    ``address`` is the mapping's address in this process.
    """

    def __init__(self, name: str = "burstctl-page") -> None:
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, PAGE_SIZE)
            # Nobody may grow or shrink it under a mapping (a SIGBUS in the application).
            import fcntl

            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            self._map = mmap.mmap(self.fd, PAGE_SIZE, mmap.MAP_SHARED)
            self.eventfd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        except BaseException:
            os.close(self.fd)
            raise
        self._supply = _Supply(self._map, OFF_SEQ)
        self._meta = _Supply(self._map, OFF_META_SEQ)
        self._heartbeat = ctypes.c_int64.from_buffer(self._map, OFF_HEARTBEAT)
        self._flags = ctypes.c_uint32.from_buffer(self._map, OFF_FLAGS)
        self._i64 = {
            off: ctypes.c_int64.from_buffer(self._map, off)
            for off in (
                OFF_TAKEN,
                OFF_REQ_READ,
                OFF_REQ_WRITE,
                OFF_MOVED_READ,
                OFF_MOVED_WRITE,
                OFF_CALLS_READ,
                OFF_CALLS_WRITE,
                OFF_WAITERS,
                OFF_WAIT_NS,
                OFF_WAITS,
                OFF_WAIT_BEAT,
                OFF_SPACE_LIMIT,
                OFF_SPACE_CLAIMED,
                OFF_SPACE_LANDED,
                OFF_SPACE_WANT,
                OFF_META_TAKEN,
                OFF_CALLS_META,
            )
        }
        self._lib = _library()
        self._base = ctypes.c_char.from_buffer(self._map)  # the mapping's address, for the library
        self.address = ctypes.addressof(self._base)
        now = monotonic_ns()
        for supply, rate in ((self._supply, 0.0), (self._meta, math.inf)):
            # Bytes: nothing flows before the first allocation, as in a session. Metadata
            # operations: unpaced until the job's session has a metadata rate.
            supply.t0.value = now
            supply.filled0.value = 0
            supply.rate.value = rate
            supply.burst.value = 0
        self._heartbeat.value = now
        self._i64[OFF_SPACE_LIMIT].value = SPACE_UNLIMITED
        if self._lib is not None:
            # magic and version in one release store, after everything else
            self._lib.burstctl_page_store(self.address, OFF_MAGIC, (VERSION << 32) | MAGIC)
        else:
            ctypes.c_uint32.from_buffer(self._map, OFF_VERSION).value = VERSION
            ctypes.c_uint32.from_buffer(self._map, OFF_MAGIC).value = MAGIC

    # ------------------------------------------------------------------ the supply

    def filled(self, now_ns: int) -> float:
        """Tokens supplied up to ``now_ns`` by the curve in force (inf while unlimited)."""
        return self._supply.filled(now_ns)

    def publish(self, rate: float, burst: float, now_ns: int | None = None) -> None:
        """The job's rate (bytes/s; 0 = wait, inf = unlimited) and burst from ``now_ns`` on;
        tokens supplied so far were supplied at the old rate."""
        now = monotonic_ns() if now_ns is None else now_ns
        rate = float(rate)
        if math.isnan(rate) or rate < 0:
            raise ValueError(f"rate must be >= 0, got {rate!r}")
        burst_bytes = int(min(max(float(burst), 0.0), 2.0**62))
        filled = self.filled(now)
        if filled == math.inf:
            # Unlimited until now: full, as an unthrottled bucket is.
            filled = self._i64[OFF_TAKEN].value + burst_bytes
        self._write(now, int(min(filled, 2.0**62)), rate, burst_bytes)

    def drop_unreserved(self, now_ns: int | None = None) -> None:
        """Drops the tokens nobody reserved (a pattern's window ended)."""
        now = monotonic_ns() if now_ns is None else now_ns
        filled = self.filled(now)
        if filled == math.inf:
            return
        taken = self._i64[OFF_TAKEN].value
        self._write(now, int(min(filled, taken)), self.rate, self.burst)

    def forgive_the_dead(self, counters: Counters, now_ns: int) -> bool:
        """Covers the reservations of waiters that died mid-wait (``waiters`` left counted,
        its beat stale: module doc), so that the next caller does not wait for their I/O,
        which will not happen. True when it did."""
        if counters.waiters <= 0 or counters.waiting(now_ns):
            return False
        filled = self.filled(now_ns)
        if filled == math.inf or filled >= counters.taken:
            return False
        self._write(now_ns, int(min(counters.taken, 2.0**62)), self.rate, self.burst)
        return True

    def publish_metadata(self, rate: float, now_ns: int | None = None) -> None:
        """The job's metadata operations per second (0: unpaced) from ``now_ns`` on, on the
        page's metadata supply, with the burst of the session's own metadata bucket
        (`burstctl.client.metadata.metadata_burst`)."""
        now = monotonic_ns() if now_ns is None else now_ns
        rate = float(rate)
        if not 0.0 <= rate < math.inf:  # also NaN
            raise ValueError(f"a metadata rate must be >= 0 and finite, got {rate!r}")
        burst_ops = int(metadata_burst(rate))
        filled = self._meta.filled(now)
        if filled == math.inf:  # unpaced until now: full, as an unthrottled bucket is
            filled = self._load(OFF_META_TAKEN) + burst_ops
        supplied = math.inf if rate == 0.0 else rate
        self._write(now, int(min(filled, 2.0**62)), supplied, burst_ops, self._meta)

    def _write(
        self, t0: int, filled0: int, rate: float, burst: int, supply: _Supply | None = None
    ) -> None:
        supply = supply or self._supply
        if self._lib is not None:
            self._lib.burstctl_page_publish(self.address, supply.at, t0, filled0, rate, burst)
            return
        seq = supply.seq.value
        supply.seq.value = seq + 1  # odd: being written
        supply.t0.value = t0
        supply.filled0.value = filled0
        supply.rate.value = rate
        supply.burst.value = burst
        supply.seq.value = seq + 2

    @property
    def rate(self) -> float:
        return self._supply.rate.value

    @property
    def burst(self) -> int:
        return self._supply.burst.value

    @property
    def metadata_rate(self) -> float:
        """The metadata operations per second in force (0: unpaced)."""
        rate = self._meta.rate.value
        return 0.0 if rate == math.inf else rate

    # ------------------------------------------------------------------ liveness and counters

    def beat(self, now_ns: int | None = None) -> None:
        """The agent is alive (the library stops pacing on a page whose heartbeat is stale)."""
        now = monotonic_ns() if now_ns is None else now_ns
        if self._lib is not None:
            self._lib.burstctl_page_store(self.address, OFF_HEARTBEAT, now)
        else:
            self._heartbeat.value = now

    def mark_staging(self) -> None:
        """Tells the library that the agent stages the files out: it tells the agent of every
        paced open even while the space is unlimited (preload_shim/stage.c)."""
        if self._lib is not None:
            self._lib.burstctl_page_or_flags(self.address, FLAG_STAGE)
        else:
            self._flags.value = self._flags.value | FLAG_STAGE

    @contextlib.contextmanager
    def hold_writes(self, timeout: float = HOLD_TIMEOUT) -> Iterator[bool]:
        """Holds the job's paced writes out (`FLAG_STAGE` set) for the block: yields True once
        none is in flight, False when some still was after ``timeout`` seconds (a write that
        lasts, or a process killed in one: nothing may rely on the hold then). Writers wait
        at most the block's length (docs/preload.md, "Files drained while open")."""
        if self._lib is None:
            yield False
            return
        writing = self._lib.burstctl_page_hold(self.address)
        try:
            deadline = time.monotonic() + timeout
            while writing > 0 and time.monotonic() < deadline:
                time.sleep(HOLD_POLL)  # the writers in flight finish their one call each
                writing = self._lib.burstctl_page_writing(self.address)
            yield writing <= 0
        finally:
            self._lib.burstctl_page_release(self.address)

    def mark_closed(self) -> None:
        """Tells the library to stop drawing from this page (it reconnects on its next open)."""
        if self._lib is not None:
            self._lib.burstctl_page_or_flags(self.address, FLAG_CLOSED)
        else:
            self._flags.value = self._flags.value | FLAG_CLOSED

    def counters(self) -> Counters:
        """The library's counters (each a single aligned load; the set is not one snapshot)."""
        if self._lib is not None:
            load, addr = self._lib.burstctl_page_load, self.address
            return Counters(
                taken=load(addr, OFF_TAKEN),
                req_read=load(addr, OFF_REQ_READ),
                req_write=load(addr, OFF_REQ_WRITE),
                moved_read=load(addr, OFF_MOVED_READ),
                moved_write=load(addr, OFF_MOVED_WRITE),
                calls_read=load(addr, OFF_CALLS_READ),
                calls_write=load(addr, OFF_CALLS_WRITE),
                waiters=load(addr, OFF_WAITERS),
                wait_ns=load(addr, OFF_WAIT_NS),
                waits=load(addr, OFF_WAITS),
                wait_beat_ns=load(addr, OFF_WAIT_BEAT),
                calls_meta=load(addr, OFF_CALLS_META),
            )
        v = self._i64
        return Counters(
            taken=v[OFF_TAKEN].value,
            req_read=v[OFF_REQ_READ].value,
            req_write=v[OFF_REQ_WRITE].value,
            moved_read=v[OFF_MOVED_READ].value,
            moved_write=v[OFF_MOVED_WRITE].value,
            calls_read=v[OFF_CALLS_READ].value,
            calls_write=v[OFF_CALLS_WRITE].value,
            waiters=v[OFF_WAITERS].value,
            wait_ns=v[OFF_WAIT_NS].value,
            waits=v[OFF_WAITS].value,
            wait_beat_ns=v[OFF_WAIT_BEAT].value,
            calls_meta=v[OFF_CALLS_META].value,
        )

    # ------------------------------------------------------------------ the space

    def _load(self, off: int) -> int:
        if self._lib is not None:
            return int(self._lib.burstctl_page_load(self.address, off))
        return self._i64[off].value

    def space(self) -> Space:
        """The space counters; ``landed`` is read first, so every byte it counts was written
        before anything measured after this call."""
        landed = self._load(OFF_SPACE_LANDED)
        return Space(
            landed=landed,
            claimed=self._load(OFF_SPACE_CLAIMED),
            want=self._load(OFF_SPACE_WANT),
            limit=self._load(OFF_SPACE_LIMIT),
        )

    def set_space_limit(self, limit: int) -> None:
        """The most the job's processes may claim (`SPACE_UNLIMITED`: no limit)."""
        limit = min(max(int(limit), 0), SPACE_UNLIMITED)
        if self._lib is not None:
            self._lib.burstctl_page_store(self.address, OFF_SPACE_LIMIT, limit)
        else:
            self._i64[OFF_SPACE_LIMIT].value = limit

    def drain_events(self) -> int:
        """Reads (and resets) the eventfd's count of wait notices; 0 when none."""
        try:
            return os.eventfd_read(self.eventfd)
        except BlockingIOError:
            return 0

    def close(self) -> None:
        """Marks the page closed and releases the agent's handles (mapped copies live on)."""
        self.mark_closed()
        del self._supply, self._meta, self._heartbeat
        del self._flags, self._i64, self._base
        self._map.close()
        os.close(self.fd)
        os.close(self.eventfd)
