"""The burst buffer's books: the one owner of what is on the buffer and what is promised.

docs/capacity.md is the reference; in short. Every APP session whose client tracks a burst
buffer (a mount; ``Hello.buffer``) is a *holder* with its last report — ``resident`` (bytes of
the job it holds on the buffer), ``pending`` (of which not on the PFS yet), ``added`` (bytes
it ever added; never decreases) and ``drain_error`` — and its space ``limit``, the most its
``added`` may reach. What a holder can occupy is at most

    reserved = resident + max(0, limit − added)

(resident can grow only by bytes added, and added only up to the limit), so

    used = Σ reserved over the holders + Σ parked residents  ≤  S

is kept by raising a limit only out of ``free = S − used``. A report can only lower a
holder's reservation (added grows by what resident grows, or resident shrinks by the drain)
— except a resident that grew beyond what was added, which the books take as it comes.

Grants (`BufferBooks.grant`): a holder that is writing — its ``added`` grew since its
previous report, or it reports waiting — is topped up
to an unused grant of one chunk, ``max(min_chunk, rate × horizon)``, doubled for every report
in which it still waits with space in hand and has added nothing (a write larger than a
chunk then gets through), at most S. When ``free`` does not cover every top-up it is shared
among the holders that want space in proportion to their chunks (so to their rates above the floor,
equally when their rates are 0), never beyond ``free``.

A holder that ends with a Goodbye releases its unused grant at once; its resident is
*parked* under its (job, host): a mount's bytes stay on the buffer after its stream ended.
One whose stream broke or expired parks its whole reservation (it may have written since its
last report). A parked resident is
replaced as soon as a client of the same job on the same host opens a stream with a Buffer
(its Hello reports what it holds now: a restarted mount does not count twice), or released by
an operator (`release`: a node that never comes back); with a ``retention`` > 0, dropped after
that many seconds. By default (0) it stays: the bytes are on the buffer until someone says
otherwise, and a resident dropped while they are would let the books grant space that is not
there.

Without a capacity (``size`` None) the books still hold the reports (``/v1/capacity``,
``/metrics``), and grant nothing: allocations then carry no space.

Single-threaded (the controller's loop); no I/O.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from burstctl.controller.signal import Signal
from burstctl.policies.sharing import water_fill
from burstctl.policies.view import BufferView

# Smallest grant topped up at once, bytes (a chunk is at least this).
DEFAULT_MIN_CHUNK = 1 << 20
# The chunk covers this many seconds of the holder's rate.
DEFAULT_HORIZON = 1.0
# Clients whose last ``added`` is remembered (to refuse a decrease across their streams).
MAX_REMEMBERED_CLIENTS = 4096
# The scheduler decides again when the fill, or a job's pending bytes, crosses a step of
# this fraction of S.
VIEW_STEP = 0.05


@dataclass(slots=True)
class Holder:
    """One APP session with a buffer, as the books know it."""

    sid: int
    job_id: str
    client_id: str
    host: str
    resident: int = 0
    pending: int = 0
    added: int = 0
    drain_error: str = ""
    limit: int = 0
    grew: bool = False  # added grew in the last report
    waiting: bool = False  # the last report said a write waits
    rate: float = 0.0  # bytes/s the session writes at (its allocation or measured rate)
    scale: int = 1  # chunk multiplier: doubles while it waits without progress

    @property
    def unused(self) -> int:
        return max(0, self.limit - self.added)

    @property
    def reserved(self) -> int:
        return self.resident + self.unused


@dataclass(slots=True)
class Parked:
    """The last report of an ended holder: its bytes are still on the buffer."""

    resident: int
    pending: int
    drain_error: str
    since: float


@dataclass(frozen=True, slots=True)
class JobBuffer:
    """One job's part of the buffer (``GET /v1/capacity``)."""

    job_id: str
    resident: int
    pending: int
    reserved: int
    drain_error: str
    waiting: bool


class BufferBooks:
    """The buffer's books of one replica (S is per replica)."""

    def __init__(
        self,
        size: int | None,
        drain_bandwidth: float | None = None,
        *,
        clock: Callable[[], float],
        retention: float = 0.0,
        min_chunk: int = DEFAULT_MIN_CHUNK,
        horizon: float = DEFAULT_HORIZON,
    ) -> None:
        if size is not None and size <= 0:
            raise ValueError(f"the buffer's size must be > 0, got {size}")
        self.size = size
        self.drain_bandwidth = drain_bandwidth
        self._clock = clock
        self.retention = retention
        self.min_chunk = min_chunk
        self.horizon = horizon
        self.holders: dict[int, Holder] = {}
        self.parked: dict[tuple[str, str], Parked] = {}
        self._by_job: dict[str, set[int]] = {}  # the holders of each job
        self._used = 0  # Σ reserved + Σ parked resident, kept as they change
        self._last_added: OrderedDict[str, int] = OrderedDict()  # by client_id
        self.changed = Signal()  # the view of the buffer moved by a step (docs/capacity.md)
        self._fill_step = 0
        self._pending_steps: dict[str, int] = {}
        self._view: BufferView | None = None  # cached until the books move by a step

    # ------------------------------------------------------------------ holders

    def added_problem(self, client_id: str, added: int) -> str | None:
        """Why ``added`` from ``client_id`` cannot be (it decreased), or None."""
        last = self._last_added.get(client_id)
        if last is not None and added < last:
            return f"must never decrease: {added} after {last} from client {client_id!r}"
        return None

    def open(
        self,
        sid: int,
        job_id: str,
        client_id: str,
        host: str,
        resident: int,
        pending: int,
        added: int,
        drain_error: str,
    ) -> Holder:
        """A holder's stream opens (its Hello had a Buffer): no unused grant (limit = added);
        a resident parked under the same (job, host) is replaced by this report."""
        parked = self.parked.pop((job_id, host), None)
        if parked is not None:
            self._used -= parked.resident
        holder = Holder(sid, job_id, client_id, host, resident, pending, added, drain_error)
        holder.limit = added
        self.holders[sid] = holder
        self._by_job.setdefault(job_id, set()).add(sid)
        self._used += holder.reserved
        self._remember(client_id, added)
        self._maybe_changed(job_id)
        return holder

    def report(
        self,
        sid: int,
        resident: int,
        pending: int,
        added: int,
        drain_error: str,
        waiting: bool,
        rate: float,
    ) -> None:
        """A holder's Usage (validated by the caller: `added_problem`, common/limits.py)."""
        holder = self.holders.get(sid)
        if holder is None:
            return
        holder.grew = added > holder.added
        holder.waiting = waiting
        holder.rate = rate if math.isfinite(rate) and rate > 0 else 0.0
        before = holder.reserved
        holder.resident, holder.pending, holder.added = resident, pending, added
        holder.drain_error = drain_error
        if holder.grew or not waiting:
            holder.scale = 1
        elif holder.unused > 0:  # it waits with space in hand: its write is larger
            holder.scale = min(holder.scale * 2, 1 << 20)
        self._used += holder.reserved - before
        self._remember(holder.client_id, added)
        self._maybe_changed(holder.job_id)

    def close(self, sid: int, *, clean: bool = True) -> None:
        """A holder's stream ended: its resident is parked and its unused grant released —
        after a Goodbye (``clean``: the last report came just before it). A stream that broke
        or expired may have added bytes since its last report, so its whole reservation
        (resident + unused) is parked instead, until the client is heard of again."""
        holder = self.holders.pop(sid, None)
        if holder is None:
            return
        self._used -= holder.reserved
        sids = self._by_job.get(holder.job_id)
        if sids is not None:
            sids.discard(sid)
            if not sids:
                del self._by_job[holder.job_id]
        resident = holder.resident if clean else holder.reserved
        if resident or holder.drain_error:
            key = (holder.job_id, holder.host)
            before = self.parked.get(key)
            pending = holder.pending
            if before is not None:  # two clients of one job on one host: both count
                resident += before.resident
                pending += before.pending
            if before is not None:
                self._used -= before.resident
            self.parked[key] = Parked(resident, pending, holder.drain_error, self._clock())
            self._used += resident
        self._maybe_changed(holder.job_id)

    def expire(self) -> None:
        """Drops parked residents older than ``retention`` (0: none)."""
        if self.retention <= 0:
            return
        now = self._clock()
        old = [k for k, p in self.parked.items() if now - p.since >= self.retention]
        for key in old:
            self._used -= self.parked.pop(key).resident
            self._maybe_changed(key[0])

    def release(self, job_id: str, host: str | None = None) -> int:
        """Forgets the parked residents of ``job_id`` (on ``host``, or on every host): an
        operator's word that those bytes left the buffer. Returns how many were dropped."""
        keys = [k for k in self.parked if k[0] == job_id and host in (None, k[1])]
        for key in keys:
            self._used -= self.parked.pop(key).resident
        if keys:
            self._maybe_changed(job_id)
        return len(keys)

    def _remember(self, client_id: str, added: int) -> None:
        self._last_added[client_id] = added
        self._last_added.move_to_end(client_id)
        while len(self._last_added) > MAX_REMEMBERED_CLIENTS:
            self._last_added.popitem(last=False)

    # ------------------------------------------------------------------ grants

    def _chunk(self, holder: Holder) -> int:
        base = max(float(self.min_chunk), holder.rate * self.horizon) * holder.scale
        top = self.size if self.size is not None else base
        return int(min(base, top))

    def grant(self) -> dict[int, int]:
        """Tops up the holders that write (module docstring); returns the new limits of the
        holders whose limit rose. Never raises ``used`` above S."""
        if self.size is None:
            return {}
        wants: dict[int, float] = {}
        weights: dict[int, float] = {}
        for sid, h in self.holders.items():
            chunk = self._chunk(h)
            unused = h.unused
            # Only a holder that writes now: one that never wrote (a reader) or stopped
            # writing holds no space it does not use (what it holds stays its own).
            if (h.grew or h.waiting) and unused < chunk:
                wants[sid] = float(chunk - unused)
                weights[sid] = float(chunk)
        if not wants:
            return {}
        free = self.size - self.used
        if free <= 0:
            return {}
        fits = sum(wants.values()) <= free
        shares = wants if fits else water_fill(wants, weights, float(free))
        changed: dict[int, int] = {}
        given = 0
        for sid, share in shares.items():
            amount = min(int(share), free - given)
            if amount <= 0:
                continue
            h = self.holders[sid]
            before = h.reserved
            # A limit below added (a client past a dropped reservation) restarts from added.
            h.limit = max(h.limit, h.added) + amount
            self._used += h.reserved - before
            h.grew = False  # served; the next report says whether it goes on
            given += amount
            changed[sid] = h.limit
        if changed:
            self._maybe_changed(None)
        return changed

    # ------------------------------------------------------------------ views

    @property
    def used(self) -> int:
        """Σ reserved over the holders + Σ parked residents (kept as they change)."""
        return self._used

    def recount(self) -> int:
        """`used` summed afresh (tests check the running total against it)."""
        return sum(h.reserved for h in self.holders.values()) + sum(
            p.resident for p in self.parked.values()
        )

    @property
    def free(self) -> int | None:
        return None if self.size is None else max(0, self.size - self.used)

    def limit_of(self, sid: int) -> int | None:
        """The space limit an allocation of session ``sid`` carries (None: no space)."""
        if self.size is None:
            return None
        holder = self.holders.get(sid)
        return holder.limit if holder is not None else None

    def jobs(self) -> dict[str, JobBuffer]:
        """Per job: resident, pending, reserved, drain error, whether a holder waits."""
        acc: dict[str, list[Any]] = {}
        for h in self.holders.values():
            row = acc.setdefault(h.job_id, [0, 0, 0, "", False])
            row[0] += h.resident
            row[1] += h.pending
            row[2] += h.reserved
            row[3] = row[3] or h.drain_error
            row[4] = row[4] or h.waiting
        for (job_id, _host), p in self.parked.items():
            row = acc.setdefault(job_id, [0, 0, 0, "", False])
            row[0] += p.resident
            row[1] += p.pending
            row[2] += p.resident
            row[3] = row[3] or p.drain_error
        return {
            j: JobBuffer(j, int(r[0]), int(r[1]), int(r[2]), str(r[3]), bool(r[4]))
            for j, r in acc.items()
        }

    def waiting_jobs(self) -> list[str]:
        """Jobs with a holder waiting for space (its last report said so)."""
        return sorted({h.job_id for h in self.holders.values() if h.waiting})

    def view(self) -> BufferView | None:
        """The buffer as the policies see it (``SystemView.buffer``); None without a size.

        Built again only when the books moved by a step (`_maybe_changed`), so a decision
        does not pay for every holder: between two steps it is within ``VIEW_STEP`` × S."""
        if self.size is None:
            return None
        if self._view is not None:
            return self._view
        jobs = self.jobs()
        self._view = BufferView(
            size=float(self.size),
            used=float(min(self.used, self.size)),
            drain_bandwidth=float(self.drain_bandwidth or 0.0),
            resident={j: float(b.resident) for j, b in jobs.items() if b.resident},
            pending={j: float(b.pending) for j, b in jobs.items() if b.pending},
        )
        return self._view

    def _job_pending(self, job_id: str) -> int:
        total = sum(self.holders[sid].pending for sid in self._by_job.get(job_id, ()))
        return total + sum(p.pending for (j, _h), p in self.parked.items() if j == job_id)

    def _maybe_changed(self, job_id: str | None) -> None:
        """Fires `changed` when the fill, or ``job_id``'s pending bytes, crossed a step of
        `VIEW_STEP` × S (a policy that reads the buffer decides again). Costs the job's
        holders, not the whole books."""
        if self.size is None:
            return
        step = max(1.0, self.size * VIEW_STEP)
        moved = False
        fill = int(self._used // step)
        if fill != self._fill_step:
            self._fill_step, moved = fill, True
        if job_id is not None:
            pending = self._job_pending(job_id)
            mark = -1 if pending == 0 else int(pending // step)
            if self._pending_steps.get(job_id, -1) != mark:
                moved = True
                if mark < 0:
                    self._pending_steps.pop(job_id, None)
                else:
                    self._pending_steps[job_id] = mark
        if moved:
            self._view = None
            self.changed()
