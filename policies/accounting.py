"""Per-job accounting of the bandwidth-sharing model, and the ``JobView`` row it gives.

What a policy reads of a job (τ_i, the I/O phases, W_i^(done), V_i^(transferred),
P_i of eq. (6), the last work phase w_i, the mean past volume) follows from the
job's events: operations posted and completed, bytes moved. :class:`JobAccount`
keeps those quantities and :func:`job_view` turns them into a row. The
controller's job table and the simulator's trace replay both use them, so the
same events give both the same views, bit for bit ([BWS] §3).

Pure: the caller passes every time (``now``) and every event.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from burstctl.policies.view import JobId, JobView


class OpenOp(Protocol):
    """What the row needs of a pending operation."""

    @property
    def posted_at(self) -> float: ...  # R

    @property
    def volume(self) -> int: ...  # v, bytes; 0 = unknown

    @property
    def moved(self) -> int: ...  # bytes attributed to it so far


@dataclass(eq=False, slots=True, kw_only=True)
class JobAccount:
    """One job's clock-dependent quantities. A job is in its I/O phase while it has
    an open operation; the time in between is work."""

    first_seen: float  # τ_i
    index: int  # creation order: the stable tie-break of policies
    io_since: float | None = None  # start of the current I/O phase
    io_time: float = 0.0  # length of the completed I/O phases
    transferred: int = 0  # bytes moved while in I/O, V_i^(transferred)
    completed_ops: int = 0
    io_ended_at: float | None = None  # end of the previous I/O phase
    last_work: float = 0.0  # length of the work phase before the current I/O phase
    volume_sum: float = 0.0  # of completed operations (declared, else moved)

    def in_io(self) -> bool:
        return self.io_since is not None

    def io_seconds(self, now: float) -> float:
        return self.io_time + (now - self.io_since if self.io_since is not None else 0.0)

    def work_done(self, now: float) -> float:
        """W_i^(done): time since τ_i spent outside I/O phases. Inside an I/O phase it
        stands still, and is computed without ``now``: the same bits whenever asked."""
        if self.io_since is not None:
            return max(0.0, self.io_since - self.first_seen - self.io_time)
        return max(0.0, now - self.first_seen - self.io_time)

    def progress(self, now: float, cap: float) -> float:
        """P_i = W_i^(done) + V_i^(transferred) / b_i, the numerator of eq. (6)."""
        return self.work_done(now) + (self.transferred / cap if cap > 0 else 0.0)

    def live_yield(self, now: float, cap: float) -> float | None:
        """y_i = P_i / (now − τ_i) (eq. 6) as a live controller measures it; None before
        time has passed. In the model it is at most 1. Live, a phase's bounds are the
        times the controller receives them, so a start that came late makes the phase
        look shorter than it was, and a session's bucket moves its first bytes faster
        than b_i: V/b_i can pass the measured I/O time by a little. The measure is
        bounded at the model's 1, where those errors would put it above."""
        elapsed = now - self.first_seen
        return min(1.0, self.progress(now, cap) / elapsed) if elapsed > 0 else None

    def mean_volume(self) -> float:
        return self.volume_sum / self.completed_ops if self.completed_ops else 0.0

    def set_phase(self, has_ops: bool, now: float) -> bool:
        """The job has (``has_ops``) or has no open operation as of ``now``; True when
        that starts or ends an I/O phase."""
        if has_ops and self.io_since is None:
            self.io_since = now
            start = self.io_ended_at if self.io_ended_at is not None else self.first_seen
            self.last_work = now - start
            return True
        if not has_ops and self.io_since is not None:
            self.io_time += now - self.io_since
            self.io_since = None
            self.io_ended_at = now
            return True
        return False

    def transfer(self, nbytes: int) -> None:
        """Bytes moved; they count towards V_i^(transferred) only inside an I/O phase."""
        if self.io_since is not None:
            self.transferred += nbytes

    def op_completed(self, volume: int, moved: int) -> None:
        """An operation completed: its declared volume, else what it moved, joins the mean."""
        self.completed_ops += 1
        self.volume_sum += volume if volume > 0 else moved


def job_view(
    account: JobAccount,
    ops: Iterable[OpenOp],
    *,
    job_id: JobId,
    user: str,
    group: str,
    nodes: int,
    priority: float,
    cap: float,
    demand: float,
    now: float,
) -> JobView:
    """The row of a job in its I/O phase (``ops`` not empty): R_i is the earliest post,
    the volumes are the sums over its open operations (unknown if one is)."""
    ops = list(ops)
    known = all(o.volume > 0 for o in ops)
    return JobView(
        job_id,
        user,
        group,
        nodes,
        priority,
        cap,
        demand,
        min(o.posted_at for o in ops),  # posted_at
        float(sum(o.volume for o in ops)) if known else 0.0,  # volume
        float(sum(max(0, o.volume - o.moved) for o in ops)) if known else None,  # remaining
        float(sum(o.moved for o in ops)),  # moved
        account.first_seen,  # released_at
        account.progress(now, cap),
        account.last_work,
        account.mean_volume(),
        account.index,
    )
