"""The ledger: each job's counters, kept across restarts of the replica.

The job table is soft state rebuilt from the sessions, but what a job moved is
not: a restart must not set ``/v1/jobs`` back to zero. The ledger writes the
counters of the jobs in the table (their own I/O's, and ``drained``: the bytes their drain
streams copied to the PFS) to ``<state_dir>/ledger.json`` at most every
``ledger_interval`` seconds (only when they changed; serialised and written off
the event loop) and once more at a clean stop. After a restart a job's saved
counters are carried into it when its first session arrives.

Nothing a live session reported is lost even between two saves: each session's
``Usage`` carries its cumulative totals, and the table books what exceeds the
totals last booked for that session (``JobTable.usage``), so a reconnecting
session books what the old controller never saved. Only what a session that
ended before the crash reported after the last save is lost (at most
``ledger_interval`` seconds of it). Carried counters of jobs that never come back
are dropped after ``job_retention``, as the table drops an inactive job. The table's
``drained_total`` (``/metrics``) is saved too, and goes on from its saved value.

The file is a ``DurableFile`` (common/files.py): written atomically, and an
unreadable one is kept aside and the counters start at 0.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from burstctl.common.files import DurableFile
from burstctl.controller.jobs import JobTable
from burstctl.controller.records import Counters, JobState

log = logging.getLogger(__name__)

LEDGER_FILE = "ledger.json"
_FORMAT = 1


def _counters(data: Any) -> Counters:
    if not isinstance(data, dict):
        raise ValueError("counters must be an object")
    c = Counters(**data)  # TypeError on an unknown field
    for name, value in c.as_dict().items():
        kind = float if name == "wait_seconds" else int
        if isinstance(value, bool) or not isinstance(value, kind | int) or value < 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return c


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


class Saved(NamedTuple):
    """What the ledger keeps of one job: its counters and its sessions' booked totals, and
    the bytes its drain streams copied with their clients' booked totals."""

    counters: Counters
    booked: dict[str, Counters]
    drained: int
    drain_booked: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return {
            "counters": self.counters.as_dict(),
            "booked": {k: v.as_dict() for k, v in self.booked.items()},
            "drained": self.drained,
            "drain_booked": self.drain_booked,
        }

    @classmethod
    def of(cls, job: JobState) -> Saved:
        return cls(job.counters, dict(job.booked), job.drained, dict(job.drain_booked))


Carried = dict[str, Saved]


def _parse(text: str) -> tuple[Carried, int]:
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise ValueError(f"not a burstctl ledger of format {_FORMAT}")
    jobs = data["jobs"]
    if not isinstance(jobs, dict):
        raise ValueError("jobs must be an object")
    carried = {
        str(job_id): Saved(
            _counters(entry["counters"]),
            {str(k): _counters(v) for k, v in entry.get("booked", {}).items()},
            _count("drained", entry.get("drained", 0)),
            {str(k): _count("drain_booked", v) for k, v in entry.get("drain_booked", {}).items()},
        )
        for job_id, entry in jobs.items()
    }
    return carried, _count("drained_total", data.get("drained_total", 0))


class Ledger:
    """``ledger.json`` of one replica, and the counters it carries into the jobs of
    ``table`` that return (it follows the table's ``job_added``). Carried counters are
    kept for the table's ``job_retention``, on the table's clock."""

    def __init__(self, state_dir: Path, table: JobTable) -> None:
        self.file = DurableFile(state_dir / LEDGER_FILE, "the jobs' counters")
        self._table = table
        self._clock = table.clock
        # job id -> what the previous run saved of it
        self.carried: Carried = {}
        self._loaded_at = self._clock()
        self.saved_version = -1  # the table's counters_version at the last save
        # the counters of the table's jobs as last snapshotted
        self._entries: Carried = {}
        table.job_added.connect(self.restore)

    @property
    def path(self) -> Path:
        return self.file.path

    @property
    def version(self) -> int:
        """Moves whenever a job's counters change (the table's ``counters_version``)."""
        return self._table.counters_version

    def load(self) -> int:
        """Reads the file (missing, or unreadable and kept aside: nothing carried); returns
        the number of jobs carried. Counters are accounting: a replica starts without them."""
        self._loaded_at = self._clock()
        loaded = self.file.load(_parse)
        if loaded is None:
            return 0
        carried, drained_total = loaded
        self.carried = carried
        self._table.drained_total += drained_total
        if carried:
            log.info("carried the counters of %d jobs from %s", len(carried), self.path)
        return len(carried)

    def restore(self, job: JobState) -> None:
        """Adds what the previous run saved for ``job`` to it (a job new to the table)."""
        saved = self.carried.pop(job.job_id, None)
        if saved is None:
            return
        job.counters = saved.counters + job.counters
        job.booked = {**saved.booked, **job.booked}
        job.drained += saved.drained
        job.drain_booked = {**saved.drain_booked, **job.drain_booked}
        self._entries[job.job_id] = Saved.of(job)  # saved if it stays idle

    def snapshot(self) -> dict[str, Any]:
        """What to save, taken on the event loop: only the jobs whose counters changed since
        the last snapshot are read (``JobTable.counted``), so a large table of idle jobs costs
        nothing here; serialising happens in `write`, off the loop."""
        table = self._table
        if self.carried and self._clock() - self._loaded_at > table.job_retention:
            self.carried.clear()  # their jobs did not come back within the retention
        for job_id in table.counted:
            job = table.jobs.get(job_id)
            if job is not None:
                self._entries[job_id] = Saved.of(job)
        table.counted.clear()
        for job_id in [j for j in self._entries if j not in table.jobs]:
            del self._entries[job_id]  # dropped from the table after its retention
        return {
            "carried": dict(self.carried),
            "entries": dict(self._entries),
            "drained_total": table.drained_total,
        }

    def write(self, snapshot: Mapping[str, Any]) -> None:
        """Writes ``snapshot`` (`DurableFile.save`: atomically); runs in a thread."""
        jobs = {
            job_id: saved.as_dict()
            for part in ("carried", "entries")
            for job_id, saved in snapshot[part].items()
        }
        data = {"format": _FORMAT, "jobs": jobs, "drained_total": snapshot["drained_total"]}
        self.file.save(json.dumps(data, separators=(",", ":")))
