"""The ledger: each job's counters, kept across restarts of the replica.

The job table is soft state rebuilt from the sessions, but what a job moved is
not: a restart must not set ``/v1/jobs`` back to zero. The ledger writes the
counters of the jobs in the table to ``<state_dir>/ledger.json`` at most every
``ledger_interval`` seconds (only when they changed; serialised and written off
the event loop) and once more at a clean stop. After a restart a job's saved
counters are carried into it when its first session arrives.

Nothing a live session reported is lost even between two saves: each session's
``Usage`` carries its cumulative totals, and the table books what exceeds the
totals last booked for that session (``JobTable.usage``), so a reconnecting
session books what the old controller never saved. Only what a session that
ended before the crash reported after the last save is lost (at most
``ledger_interval`` seconds of it). Carried counters of jobs that never come back
are dropped after ``job_retention``, as the table drops an inactive job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from burstctl.controller.jobs import Counters, JobState, JobTable
from burstctl.controller.state import write_atomically

log = logging.getLogger(__name__)

LEDGER_FILE = "ledger.json"
_FORMAT = 1


def _counters(data: Any) -> Counters:
    if not isinstance(data, dict):
        raise ValueError("counters must be an object")
    c = Counters(**data)  # TypeError on an unknown field
    for name, value in asdict(c).items():
        kind = float if name == "wait_seconds" else int
        if isinstance(value, bool) or not isinstance(value, kind | int) or value < 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return c


class Ledger:
    """``ledger.json`` of one replica, and the counters it carries into returning jobs."""

    def __init__(self, state_dir: Path, *, retention: float, clock: Callable[[], float]) -> None:
        self.path = state_dir / LEDGER_FILE
        self._retention = retention
        self._clock = clock
        # job id -> (counters, booked session totals) saved by the previous run
        self.carried: dict[str, tuple[Counters, dict[str, Counters]]] = {}
        self._loaded_at = clock()
        self.saved_version = -1  # the table's counters_version at the last save
        # the counters of the table's jobs as last snapshotted: job id -> (counters, booked)
        self._entries: dict[str, tuple[Counters, dict[str, Counters]]] = {}

    def load(self) -> int:
        """Reads the file (missing: nothing carried); returns the number of jobs carried.

        An unreadable file is logged and moved aside, never fatal: counters are
        accounting, and a replica must start without them.
        """
        self._loaded_at = self._clock()
        try:
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or data.get("format") != _FORMAT:
                raise ValueError(f"not a burstctl ledger of format {_FORMAT}")
            jobs = data["jobs"]
            if not isinstance(jobs, dict):
                raise ValueError("jobs must be an object")
            carried = {
                str(job_id): (
                    _counters(entry["counters"]),
                    {str(k): _counters(v) for k, v in entry.get("booked", {}).items()},
                )
                for job_id, entry in jobs.items()
            }
        except FileNotFoundError:
            return 0
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            kept = self.path.with_name(LEDGER_FILE + ".unreadable")
            log.warning(
                "%s is unreadable (%s); moved to %s, counters start at 0", self.path, exc, kept
            )
            with contextlib.suppress(OSError):
                os.replace(self.path, kept)
            return 0
        self.carried = carried
        return len(carried)

    def restore(self, job: JobState) -> None:
        """Adds what the previous run saved for ``job`` to it (a job new to the table)."""
        entry = self.carried.pop(job.job_id, None)
        if entry is None:
            return
        counters, booked = entry
        job.counters = counters + job.counters
        job.booked = {**booked, **job.booked}
        self._entries[job.job_id] = (job.counters, dict(job.booked))  # saved if it stays idle

    def snapshot(self, table: JobTable) -> dict[str, Any]:
        """What to save, taken on the event loop: only the jobs whose counters changed since
        the last snapshot are read (``JobTable.counted``), so a large table of idle jobs costs
        nothing here; serialising happens in `write`, off the loop."""
        if self.carried and self._clock() - self._loaded_at > self._retention:
            self.carried.clear()  # their jobs did not come back within the retention
        for job_id in table.counted:
            job = table.jobs.get(job_id)
            if job is not None:
                self._entries[job_id] = (job.counters, dict(job.booked))
        table.counted.clear()
        for job_id in [j for j in self._entries if j not in table.jobs]:
            del self._entries[job_id]  # dropped from the table after its retention
        return {"carried": dict(self.carried), "entries": dict(self._entries)}

    def write(self, snapshot: Mapping[str, Any]) -> None:
        """Writes ``snapshot`` atomically (`write_atomically`); runs in a thread."""
        jobs = {
            job_id: {"counters": asdict(c), "booked": {k: asdict(v) for k, v in b.items()}}
            for part in ("carried", "entries")
            for job_id, (c, b) in snapshot[part].items()
        }
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(
            self.path, json.dumps({"format": _FORMAT, "jobs": jobs}, separators=(",", ":"))
        )
