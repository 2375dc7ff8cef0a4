"""PerSched across replicas: one pattern for the whole system, each replica its part of it.

Every replica computes the same pattern from the merged view (the periodic jobs of every
digest, capacity Σ_r B_r: ``PolicySlot.merged`` decides it, ``policies/persched/live.py``),
so the pattern itself needs no exchange. Its *origin* does: a period must start at the same
instant on every replica, and replicas share no clock. The coordinator, the lowest replica id
in the merged view, announces the origin in its digests (``PatternOrigin``: the pattern's key
and an instant on its own clock); every other replica reads it on its own clock: the
announced instant plus its own clock less the coordinator's, read as the least (accepted −
sent) over the coordinator's recent digests (the least delayed one: a loaded replica that
took one digest late does not keep its windows late for it). A replica keeps the origin it
holds for a pattern while the coordinator it sees announces another one (a peer missing from
its view for a moment), and one that becomes the coordinator keeps it too: the periods do
not jump when views differ.

Each replica's part of a job's windows is the job's window rate times the part of the job's
bytes that goes through that replica (``fractions``), and a replica whose parts would pass
its capacity less the reserve at some instant scales its parts down to it: the rates in
force there never sum above its capacity. docs/replicas.md, "PerSched across replicas".

Pure but for the state it keeps between exchanges (the origin and the key it holds).
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from burstctl.controller.digest import NO_PATTERN, Digest, PatternOrigin, ReplicaId
from burstctl.policies.schedule import Schedule, Window
from burstctl.policies.view import JobId

# The coordinator's digests whose transit times the origin is read from (as NTP keeps the
# least delayed of its recent samples), and how far a better reading must move the origin
# before it is taken (a new origin is a new allocation for the job's sessions).
OFFSET_SAMPLES = 64
ORIGIN_STEP = 0.002


def key_name(key: object) -> str:
    """A short, deterministic name of a pattern's key (its periodic jobs, B and b)."""
    return hashlib.sha256(repr(key).encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class Part:
    """This replica's part of the global pattern: its schedules (origin on its clock) and
    their windows' peak together."""

    schedules: Mapping[JobId, Schedule]
    peak: float


NO_PART = Part({}, 0.0)


class GlobalPattern:
    """The origin this replica holds for the global pattern, and its part of the pattern."""

    def __init__(self, replica_id: ReplicaId) -> None:
        self.replica_id = replica_id
        self._key = ""  # the key of the pattern whose origin is held
        self._origin = 0.0  # on this replica's clock
        self._heard: tuple[str, float] | None = None  # the coordinator's (key, origin) taken
        self.coordinator: ReplicaId | None = None
        # This replica's clock less the coordinator's, as its digests' (accepted − sent): the
        # least of the recent ones is the one least delayed on the way (as NTP filters).
        self._offsets: deque[float] = deque(maxlen=OFFSET_SAMPLES)
        self._offsets_of: tuple[ReplicaId, int] | None = None  # (coordinator, incarnation)
        self._sampled: float | None = None  # the sent_at of the last digest sampled

    def announce(self) -> PatternOrigin:
        """What this replica's next digest says: the origin, if it coordinates one."""
        if self.coordinator == self.replica_id and self._key:
            return PatternOrigin(self._key, self._origin)
        return NO_PATTERN

    def _offset(self, coordinator: Digest, heard_at: float) -> float:
        """This replica's clock less the coordinator's (plus the least transit time): the
        least (accepted − sent) of its last digests, one sample per digest; the samples of
        another coordinator, or of an earlier run of it, are dropped."""
        of = (coordinator.replica_id, coordinator.incarnation)
        if of != self._offsets_of:
            self._offsets.clear()
            self._offsets_of, self._sampled = of, None
        if coordinator.sent_at != self._sampled:
            self._sampled = coordinator.sent_at
            self._offsets.append(heard_at - coordinator.sent_at)
        return min(self._offsets)

    def part(
        self,
        key: object | None,
        schedules: Mapping[JobId, Schedule],
        digests: Sequence[Digest],
        heard_at: Mapping[ReplicaId, float],
        now: float,
        capacity: float,
    ) -> Part:
        """This replica's part of the pattern ``schedules`` (the merged decision's, for the
        periodic jobs of ``key``; None: no pattern) given the exchange's ``digests`` (in
        replica id order), when each peer's was accepted (``heard_at``, this clock) and the
        capacity its parts may take at an instant (``capacity``: B_r less the reserve)."""
        if key is None or not schedules or not digests:
            self._key, self._heard, self.coordinator = "", None, None
            return NO_PART
        name = key_name(key)
        coordinator = digests[0].replica_id
        self.coordinator = coordinator
        if coordinator == self.replica_id:
            if name != self._key:
                self._key, self._origin = name, now
        else:
            announced = digests[0].pattern
            offset = self._offset(digests[0], heard_at.get(coordinator, now))
            if announced.key == name:
                heard = (announced.key, announced.origin)
                origin = announced.origin + offset
                moved = abs(origin - self._origin) > ORIGIN_STEP
                if heard != self._heard or name != self._key or moved:
                    self._key, self._origin = name, origin
                self._heard = heard
            elif name != self._key:
                return NO_PART  # not agreed yet: no windows rather than windows out of step
            # else the coordinator announces another pattern (or none) for now: this one's
            # origin, held since it was agreed, stands (a peer missing from one view for a
            # moment must not take the windows away)
        mine = fractions(digests, self.replica_id, schedules)
        parts = {
            j: Schedule(s.period, s.scaled(mine[j]).windows, self._origin)
            for j, s in schedules.items()
            if mine.get(j, 0.0) > 0.0
        }
        peak = peak_rate(parts.values())
        if peak > capacity > 0.0:  # parts that would pass this replica's capacity: scaled
            factor = capacity / peak
            parts = {j: s.scaled(factor) for j, s in parts.items()}
            peak = capacity
        return Part(parts, peak)


def fractions(
    digests: Sequence[Digest], replica_id: ReplicaId, jobs: Mapping[JobId, object]
) -> dict[JobId, float]:
    """The part of each job of ``jobs`` that goes through ``replica_id``: the mean volume of
    its operations there over the sum of those means on every replica it is on (the bytes of
    one iteration, not of all time: a replica that fell behind does not get less for it);
    evenly while a replica has completed no operation of the job yet. The parts of a job sum
    to 1."""
    means: dict[JobId, dict[ReplicaId, float]] = {}
    for digest in digests:
        d = digest.jobs
        for i, job_id in enumerate(d.job_id):
            if job_id in jobs:
                means.setdefault(job_id, {})[digest.replica_id] = float(d.mean_volume[i])
    out = {}
    for job_id, per_replica in means.items():
        if replica_id not in per_replica:
            continue
        total = math.fsum(per_replica.values())
        known = all(v > 0.0 for v in per_replica.values())
        out[job_id] = per_replica[replica_id] / total if known else 1.0 / len(per_replica)
    return out


def peak_rate(schedules: Iterable[Schedule]) -> float:
    """The largest sum of window rates at one instant over schedules of one pattern (the
    same period and origin)."""
    windows: list[Window] = []
    period = 0.0
    for s in schedules:
        period = s.period
        windows.extend(s.windows)
    if not windows:
        return 0.0
    edges: list[tuple[float, float]] = []
    for w in windows:  # a window past the period wraps into the next one
        for start, end in ((w.start, min(w.end, period)), (0.0, w.end - period)):
            if end > start:
                edges.append((start, w.rate))
                edges.append((end, -w.rate))
    edges.sort(key=lambda e: (e[0], e[1]))  # at one instant, ends before starts
    level = peak = 0.0
    for _, rate in edges:
        level += rate
        peak = max(peak, level)
    return peak
