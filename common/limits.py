"""Bounds on what burstctl accepts from outside, one definition for every door.

A client's Hello and operations (gRPC), a peer's digest (gRPC) and a REST body
are all checked against these, so a value one door accepts is never refused
by another further on (a job id a client may use is one a peer accepts in a
digest). Beyond them a value is taken for a bug or an attack, not a measurement.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal, get_args

MAX_TEXT = 256  # characters of an identifier: job id, user, group, replica id, host
MAX_NODES = 1 << 20  # p_i, compute nodes of one job
MAX_PRIORITY = 1e9
MAX_PERIOD_W = 86_400.0  # s of compute per iteration a periodic job may declare (persched)
MAX_PERIOD_VOL = float(2**53)  # bytes per iteration a periodic job may declare
# s an operation may say it stayed open after its last byte (OpCompleted.quiet_seconds)
MAX_QUIET_SECONDS = 86_400.0
MAX_RATE = 1e15  # bytes/s: 1 PB/s for one storage server or one job
# bytes/s: the rate floor. A rate below it is 0 ("wait"), on both ends: the controller
# pushes 0 instead (a residue of rounding in a sum, never an allotment), and a client
# paces at 0, never at n / 1e-9 seconds per request. Any rounding residue of sums of rates up
# to MAX_RATE is below it (an ulp of 1e15 is 0.125).
MIN_RATE = 1.0
MAX_JOBS = 100_000  # jobs in one digest, and the default cap of a replica's job table
MAX_COUNTER = 2**63 - 1  # incarnations, sequence numbers, versions: int64 on the wire
MAX_BATCH = 1024  # client messages in one Batch
MAX_BUFFER_BYTES = 2**63 - 1  # Buffer.resident/pending/added: int64 on the wire
MAX_DRAIN_ERROR = 1024  # bytes (UTF-8) of Buffer.drain_error

# Defaults of the configurable limits of a replica (controller/config.py, docs/configuration.md).
# Beyond one, the controller answers RESOURCE_EXHAUSTED with a message naming it.
DEFAULT_MAX_SESSIONS = 2048  # open Session streams on one replica
DEFAULT_MAX_SESSIONS_PER_CLIENT = 1024  # ... from one client host (peer address)
DEFAULT_MAX_OPEN_OPS = 1024  # operations open at once on one session
DEFAULT_MAX_NOTICES = 64  # Error notices queued on one session; more are counted, not queued
DEFAULT_MAX_MESSAGE_BYTES = 16 << 20  # one gRPC message; a digest of MAX_JOBS short ids fits
DEFAULT_SHED_LOOP_LAG = 1.0  # s of event-loop lag beyond which new sessions are refused
DEFAULT_RETRY_AFTER = 2.0  # s a refused client is told to wait (metadata retry-after-ms)
RETRY_AFTER_KEY = "retry-after-ms"  # trailing metadata of a RESOURCE_EXHAUSTED refusal


def identifier_problem(value: object) -> str | None:
    """Why ``value`` is not an identifier (1..MAX_TEXT printable characters), or None."""
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if not value:
        return "must not be empty"
    if len(value) > MAX_TEXT:
        return f"longer than {MAX_TEXT} characters"
    if not value.isprintable():
        return "must be printable characters only"
    return None


# s a keep-last client keeps a vanished controller's last rate after its lease before it
# moves to its share of that controller's fallback budget (client/fallback.py); the survivors
# of a dead replica count that replica's rates as long (controller config ``fallback_grace``).
DEFAULT_FALLBACK_GRACE = 30.0


# A periodic pattern of I/O windows (Allocation.windows, docs/protocol.md): at most this many
# windows per period, and a period of at most a day.
MAX_WINDOWS = 64
MAX_PERIOD = 86_400.0


def windows_problem(
    period: float, windows: Sequence[tuple[float, float, float]]
) -> tuple[str, str] | None:
    """Why a pattern of ``(start, end, rate)`` windows over ``period`` seconds is malformed,
    as ``(field, reason)`` with the field named as on the wire (``period_seconds``,
    ``window[2].end_seconds``), or None when it is well formed.

    Well formed: ``0 < period <= MAX_PERIOD``; at most ``MAX_WINDOWS`` windows; each with
    ``0 <= start < period``, ``start < end``, ``end - start <= period`` (an end past the
    period wraps into the next one) and a finite rate in ``[0, MAX_RATE]``; no two windows
    overlap, wrap-around included. NaN fails every check.
    """
    if not (0.0 < period <= MAX_PERIOD):
        return "period_seconds", f"must be in (0, {MAX_PERIOD:g}] seconds, got {period!r}"
    if len(windows) > MAX_WINDOWS:
        return "window", f"{len(windows)} windows, more than MAX_WINDOWS = {MAX_WINDOWS}"
    for i, (start, end, rate) in enumerate(windows):
        if not (0.0 <= start < period):
            return f"window[{i}].start_seconds", f"must be in [0, period), got {start!r}"
        if not (start < end <= start + period):
            return (
                f"window[{i}].end_seconds",
                f"must be in (start, start + period] = ({start!r}, {start + period!r}], "
                f"got {end!r}",
            )
        if not (0.0 <= rate <= MAX_RATE):
            return f"window[{i}].rate", f"must be in [0, {MAX_RATE:g}] bytes/s, got {rate!r}"
    order = sorted(range(len(windows)), key=lambda i: windows[i][0])
    for before, after in itertools.pairwise(order):
        if windows[after][0] < windows[before][1]:
            return f"window[{after}].start_seconds", f"overlaps window[{before}]"
    if order and windows[order[-1]][1] - period > windows[order[0]][0]:
        return f"window[{order[-1]}].end_seconds", f"wraps over window[{order[0]}]"
    return None


def period_problem(w: float | None, vol_io: float | None) -> tuple[str, str] | None:
    """Why a declared period (``w`` seconds of compute, ``vol_io`` bytes per iteration) is
    malformed, as ``(field, reason)``, or None. Both unset (None or 0) means "not periodic";
    otherwise both must be finite and in (0, max]."""
    unset_w = w is None or w == 0
    unset_vol = vol_io is None or vol_io == 0
    if unset_w and unset_vol:
        return None
    for name, value, top in (("w", w, MAX_PERIOD_W), ("vol_io", vol_io, MAX_PERIOD_VOL)):
        if value is None or value == 0:
            return name, "must be set too: a period declares both w and vol_io"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return name, f"must be a number, got {value!r}"
        if not (0.0 < value <= top):  # NaN fails
            return name, f"must be finite and in (0, {top:g}], got {value!r}"
    return None


def buffer_problem(
    resident: int, pending: int, added: int, drain_error: str
) -> tuple[str, str] | None:
    """Why a Buffer report (docs/capacity.md) is malformed, as ``(field, reason)`` with the
    field named as on the wire (``resident``, ``pending``...), or None: sizes in
    ``[0, MAX_BUFFER_BYTES]``, ``pending <= resident``, ``drain_error`` at most
    ``MAX_DRAIN_ERROR`` bytes. (That ``added`` never decreases is the session's check.)"""
    for name, value in (("resident", resident), ("pending", pending), ("added", added)):
        if not (0 <= value <= MAX_BUFFER_BYTES):
            return name, f"must be in [0, 2**63 - 1] bytes, got {value!r}"
    if pending > resident:
        return "pending", f"must be <= resident ({resident}), got {pending}"
    size = len(drain_error.encode())
    if size > MAX_DRAIN_ERROR:
        return "drain_error", f"is {size} bytes, more than {MAX_DRAIN_ERROR}"
    return None


# Names of [DIST-IO]'s allocators and placements (policies/placement: ALLOCATORS, PLACEMENTS;
# a unit test keeps them equal), here so that the REST API and the command line check them
# without importing the numerical code.
AllocatorName = Literal["random", "static", "best-bdw", "nsys-allocator", "tcpu-allocator", "mckp"]
PlacementName = Literal["random", "greedy-non-clairvoyant", "greedy-clairvoyant"]
ALLOCATOR_NAMES: tuple[str, ...] = get_args(AllocatorName)
PLACEMENT_NAMES: tuple[str, ...] = get_args(PlacementName)
# Where the [DIST-IO] simulator's generated applications get their b_j(n)
# (simulator/placement/curves.py): the parametrised shapes or [FORGE]'s measurements.
CurveSource = Literal["synthetic", "measured"]
CURVE_SOURCES: tuple[str, ...] = get_args(CurveSource)
