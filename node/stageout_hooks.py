"""What the stage-out needs of the parts around it, each given to `stageout.StageOut` when it
is built.

- `DrainHooks`, the controller's side (the `Pacer`; tests pass fakes): each job's drain stream
  paces its copies, and the job's gauges on the buffer are reported through it.
- `Changed`, the shim's side: the stage-out changes files on its own (it evicts one, brings one
  back, punches holes where drained extents were), and the shim serving them is told of each
  (`StageOut.changed`). The mount passes `inodes.InodeTable.changed`: its kernel drops the
  attributes it cached of the file, so that a ``stat`` through the mount shows the change at
  once rather than after ``--attr-timeout``. What the file reads is never changed by these
  (an evicted file reads its PFS copy, the same bytes), so no cached page is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from burstctl.client.job import JobInfo
from burstctl.node.stageout_marks import Key

# Called with a file's (st_dev, st_ino) after the stage-out changed it; never raises.
Changed = Callable[[Key], None]


class DrainHooks(Protocol):
    """What the drain needs of the controller's side (the `Pacer`; tests pass fakes)."""

    def drain(self, job: JobInfo, nbytes: int) -> None:
        """Paces ``nbytes`` of the job's copy to the PFS (its drain stream)."""

    def report_buffer(self, job: JobInfo, resident: int, pending: int, error: str) -> None:
        """The job's gauges on the buffer."""


__all__ = ["Changed", "DrainHooks"]
