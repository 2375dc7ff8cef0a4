"""The profile store: what each application did in its past I/O phases (docs/placement-live.md).

An *application* is keyed by ``(name, nodes)``: ``name`` is the ``app`` a job was registered
with (``POST /v1/jobs``, field ``app``), else the job id's prefix before its first ``.``, ``_``
or ``-`` (a Slurm array ``1234_7`` and a step ``1234.0`` share ``1234``); ``nodes`` is the job's
node count Q_j. For each key the store keeps what the placement heuristics of [DIST-IO] read:

- ``volume_per_phase``: the mean bytes of one I/O phase (v_io);
- ``compute_seconds``: the mean time between two I/O phases (t_cpu, the compute gap);
- ``phases``: how many phases were measured;
- ``bandwidth``: b_j(n), bytes/s observed during phases at ``n`` replicas (EWMA per n).

It is filled by :class:`PhaseRecorder` from the job table's phases (``JobTable.phase_ended``): a
phase starts with a job's first open operation and ends when its last one completes, or at its
last byte's report if that came earlier (``policies/periods.py: PhaseLog``, which also learns
the job's period from the same phases); its volume is what the job's sessions booked on this
replica during it. A job striped evenly
over ``n`` replicas moves about ``n`` times that in all, so the volume and the bandwidth are
scaled by ``n`` — the approximation of even striping ([DIST-IO] §III: n equal transfers). ``n``
is this replica plus the live peers whose last digest lists the job.

Bounded (``max_keys``, least recently updated dropped first) and persisted as JSON in the state
directory (``profiles.json``, a ``DurableFile`` of common/files.py: written atomically, and an
unreadable one kept aside, the store starting empty). Pure but for ``load``/``write``; the
caller passes times.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from burstctl.common.files import DurableFile
from burstctl.controller.jobs import JobTable
from burstctl.controller.records import JobMeta, JobState
from burstctl.policies.periods import Phase

log = logging.getLogger(__name__)

PROFILES_FILE = "profiles.json"
DEFAULT_MAX_KEYS = 10_000
# Weight of the newest sample in the per-count bandwidth EWMA.
BANDWIDTH_ALPHA = 0.5
# A phase shorter than this gives no bandwidth sample (its duration is mostly noise).
MIN_PHASE_SECONDS = 1e-3
# The largest replica count a bandwidth sample or a job description may name (b_j(n) is a
# table of n entries: a bound on memory as much as on sense).
MAX_REPLICA_COUNT = 4096

AppKey = tuple[str, int]

_PREFIX = re.compile(r"[._-]")


def app_name(job_id: str, app: str = "") -> str:
    """The application name of a job: its registered ``app``, else its id's prefix."""
    if app:
        return app
    return _PREFIX.split(job_id, maxsplit=1)[0] or job_id


def app_key(meta: JobMeta) -> AppKey:
    """The application key of a job: its application name and its node count."""
    return app_name(meta.job_id, meta.app), meta.nodes


@dataclass(slots=True)
class AppProfile:
    """What one application key did (module docstring)."""

    volume_per_phase: float = 0.0  # mean bytes per phase
    compute_seconds: float = 0.0  # mean gap between phases
    phases: int = 0  # phases measured (volume and gap means)
    gaps: int = 0  # gaps measured
    bandwidth: dict[int, float] = field(default_factory=dict)  # n -> bytes/s
    # Its catalog version (controller/catalog.py): the highest (version, origin) wins across
    # replicas; 0: measured before profiles were exchanged.
    version: int = 0
    origin: str = ""
    changed_at: float = 0.0  # wall clock of the origin when it made this version

    def observe(self, volume: float, seconds: float, gap: float | None, count: int) -> None:
        self.phases += 1
        self.volume_per_phase += (volume - self.volume_per_phase) / self.phases
        if gap is not None and gap >= 0:
            self.gaps += 1
            self.compute_seconds += (gap - self.compute_seconds) / self.gaps
        if seconds >= MIN_PHASE_SECONDS and volume > 0 and 1 <= count <= MAX_REPLICA_COUNT:
            sample = volume / seconds
            prev = self.bandwidth.get(count)
            self.bandwidth[count] = (
                sample if prev is None else BANDWIDTH_ALPHA * sample + (1 - BANDWIDTH_ALPHA) * prev
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "volume_per_phase": self.volume_per_phase,
            "compute_seconds": self.compute_seconds,
            "phases": self.phases,
            "gaps": self.gaps,
            "bandwidth": {str(n): b for n, b in sorted(self.bandwidth.items())},
            "version": self.version,
            "origin": self.origin,
            "changed_at": self.changed_at,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> AppProfile:
        bandwidth = {int(n): float(b) for n, b in dict(raw.get("bandwidth", {})).items()}
        profile = cls(
            volume_per_phase=float(raw.get("volume_per_phase", 0.0)),
            compute_seconds=float(raw.get("compute_seconds", 0.0)),
            phases=int(raw.get("phases", 0)),
            gaps=int(raw.get("gaps", 0)),
            version=int(raw.get("version", 0)),
            origin=str(raw.get("origin", "")),
            changed_at=float(raw.get("changed_at", 0.0)),
            bandwidth={
                n: b
                for n, b in bandwidth.items()
                if 1 <= n <= MAX_REPLICA_COUNT and b > 0 and math.isfinite(b)
            },
        )
        numbers = (profile.volume_per_phase, profile.compute_seconds)
        counts = (profile.phases, profile.gaps, profile.version)
        if min(counts) < 0 or not all(math.isfinite(x) for x in (*numbers, profile.changed_at)):
            raise ValueError("bad numbers")
        return profile


def _entries(text: str) -> list[Any]:
    """The entries of a profiles file; ValueError, KeyError or TypeError if it is none."""
    entries = json.loads(text)["profiles"]
    if not isinstance(entries, list):
        raise ValueError("profiles must be a list")
    return entries


class ProfileStore:
    """Profiles by application key, at most ``max_keys`` (LRU), saved under ``state_dir``
    (None: kept in memory only)."""

    def __init__(self, state_dir: Path | None, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.file = (
            DurableFile(state_dir / PROFILES_FILE, "the application profiles")
            if state_dir is not None
            else None
        )
        self.max_keys = max_keys
        self._profiles: OrderedDict[AppKey, AppProfile] = OrderedDict()
        self.version = 0  # bumped at every change
        self.saved_version = 0

    @property
    def path(self) -> Path | None:
        return self.file.path if self.file is not None else None

    def __len__(self) -> int:
        return len(self._profiles)

    def get(self, key: AppKey) -> AppProfile | None:
        return self._profiles.get(key)

    def keys(self) -> list[AppKey]:
        return list(self._profiles)

    def items(self) -> list[tuple[AppKey, AppProfile]]:
        """Every profile with its key, least recently updated first."""
        return list(self._profiles.items())

    def observe(
        self,
        key: AppKey,
        volume: float,
        seconds: float,
        gap: float | None,
        count: int,
        stamp: tuple[int, str, float] | None = None,
    ) -> AppProfile:
        """One I/O phase of ``key``: ``volume`` bytes in ``seconds`` at ``count`` replicas,
        ``gap`` seconds after its previous phase (None: the first one seen); ``stamp``: the
        profile's new catalog (version, origin, changed_at)."""
        profile = self._profiles.pop(key, None) or AppProfile()
        profile.observe(volume, seconds, gap, count)
        if stamp is not None:
            profile.version, profile.origin, profile.changed_at = stamp
        self._insert(key, profile)
        return profile

    def adopt(self, key: AppKey, profile: AppProfile) -> bool:
        """A peer's newer version of ``key``'s profile (controller/catalog.py) in place of the
        one held. When the store is full, a key it does not hold is taken only if it is newer
        than the least recently updated one, which it evicts: replicas with the same bound
        keep the same newest profiles. True if taken."""
        if key not in self._profiles and len(self._profiles) >= self.max_keys:
            oldest = next(iter(self._profiles.values()))
            if (profile.version, profile.origin) <= (oldest.version, oldest.origin):
                return False
        self._profiles.pop(key, None)
        self._insert(key, profile)
        return True

    def _insert(self, key: AppKey, profile: AppProfile) -> None:
        self._profiles[key] = profile
        while len(self._profiles) > self.max_keys:
            self._profiles.popitem(last=False)
        self.version += 1

    # -- persistence ----------------------------------------------------------
    def load(self) -> int:
        """Reads the saved profiles (missing, or unreadable and kept aside: none); how many.
        A bad entry of a readable file is skipped (logged), the others are kept."""
        if self.file is None:
            return 0
        entries = self.file.load(_entries)
        if entries is None:
            return 0
        self._profiles.clear()
        for entry in entries[-self.max_keys :]:
            try:
                key = (str(entry["app"]), int(entry["nodes"]))
                self._profiles[key] = AppProfile.from_json(entry)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("%s: skipped a bad profile entry (%s)", self.path, exc)
        self.saved_version = self.version
        if self._profiles:
            log.info("loaded %d application profiles from %s", len(self._profiles), self.path)
        return len(self._profiles)

    def snapshot(self) -> dict[str, Any]:
        """What ``write`` saves (least recently updated first), as plain values."""
        return {
            "profiles": [
                {"app": name, "nodes": nodes, **p.to_json()}
                for (name, nodes), p in self._profiles.items()
            ]
        }

    def write(self, snapshot: dict[str, Any]) -> None:
        """Writes a snapshot (`DurableFile.save`: atomically); OSError if it cannot."""
        if self.file is not None:
            self.file.save(json.dumps(snapshot))

    def save(self) -> None:
        version = self.version
        self.write(self.snapshot())
        self.saved_version = version


class PhaseRecorder:
    """Turns the I/O phases of ``table`` (its ``phase_ended``: the job table's one observation
    of a phase, ``JobState.phases``) into profile samples in ``store`` (module docstring).

    ``count_of(job_id)`` gives the number of replicas the job is present on; its volume is
    what its sessions booked here during the phase (its counters). ``stamp()`` gives each new
    sample's catalog version (controller/catalog.py, ``Catalog.next_stamp``; None: none).
    """

    def __init__(
        self,
        store: ProfileStore,
        table: JobTable,
        count_of: Callable[[str], int],
        stamp: Callable[[], tuple[int, str, float]] | None = None,
    ) -> None:
        self.store = store
        self._count_of = count_of
        self._stamp = stamp
        table.phase_ended.connect(self.record)

    def record(self, job: JobState, phase: Phase) -> None:
        count = max(1, self._count_of(job.job_id))
        volume = phase.volume * count
        stamp = self._stamp() if self._stamp is not None else None
        self.store.observe(app_key(job.meta), volume, phase.seconds, phase.gap, count, stamp)
