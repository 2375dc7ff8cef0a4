"""PerSched's loans: window time a periodic job leaves unused goes to the jobs of the reserve.

A periodic job whose window is open while it has no operation open (it computes, or moved its
iteration's bytes already) is a *lender*: for the rest of that window occurrence its sessions
hold its pattern less the rest of that window (``Loan.kept``), and the jobs that share the reserve
(*borrowers*) get the window's rate on top of their share until the window's end. A borrower's
loan is a schedule its client ends by itself (``borrowed``: a day-long period whose first
windows carry the loans, the rest its share), so no message has to reach it at the window's
end; a decision there (``next_change``) gives it back its plain share and the lender its whole
pattern. A lender that posts within its lent window is a lender no more: the next decision
gives it its window back (an increase the controller offers only once the borrowers applied
their decreases, docs/protocol.md, "Decreases before increases").

Pure: functions of the pattern in force, the instant and the view (docs/persched.md, "Live
policy", "Loans").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from burstctl.common.limits import MAX_PERIOD
from burstctl.policies.schedule import Schedule, Window
from burstctl.policies.sharing import water_levels
from burstctl.policies.view import JobId, RowRates, SystemView

# A loan shorter than this is not made: its messages would cost more than it moves.
MIN_LOAN = 0.005


@dataclass(frozen=True, slots=True)
class Loan:
    """The rest of ``lender``'s window: ``rate`` bytes/s until ``end`` (the view's clock)."""

    lender: JobId
    opened: float  # when the window opened (the view's clock)
    end: float
    rate: float
    kept: Schedule  # the lender's schedule, the lent window cut to its head


def open_window(schedule: Schedule, now: float) -> tuple[int, float] | None:
    """The window of ``schedule`` open at ``now`` and the instant it closes, or None."""
    phase = (now - schedule.origin) % schedule.period
    for i, w in enumerate(schedule.windows):
        for start in (w.start, w.start - schedule.period):  # the window, or its wrapped part
            if start <= phase < start + (w.end - w.start):
                return i, now + (start + (w.end - w.start) - phase)
    return None


def loans(
    schedules: Mapping[JobId, Schedule], now: float, view: SystemView, grace: float
) -> tuple[Loan, ...]:
    """The loans at ``now``: one per job of ``schedules`` (the pattern in force) that is not in
    I/O while one of its windows is open, ``grace`` seconds (at least ``MIN_LOAN``) or more
    after that window opened, with at least ``MIN_LOAN`` of it left."""
    jobs = view.jobs
    made = []
    for job_id, schedule in schedules.items():
        job = jobs.get(job_id)
        if job is not None and job.active:
            continue
        found = open_window(schedule, now)
        if found is None:
            continue
        i, end = found
        window = schedule.windows[i]
        opened = end - (window.end - window.start)
        head = max(grace, MIN_LOAN)
        if end - now < MIN_LOAN or now - opened < head:
            continue
        # The lender keeps the window's head, past by now: a schedule with no window would be
        # a rate of 0, which ends the windows its sessions hold between iterations.
        cut = Window(window.start, window.start + head, window.rate)
        windows = (*schedule.windows[:i], cut, *schedule.windows[i + 1 :])
        kept = Schedule(schedule.period, windows, schedule.origin)
        made.append(Loan(job_id, opened, end, window.rate, kept))
    return tuple(made)


def borrowed(
    view: SystemView, rows: Collection[int], reserve: float, made: tuple[Loan, ...]
) -> tuple[RowRates, dict[JobId, Schedule]]:
    """The borrowers' (``rows``: the jobs that share the reserve) rates and schedules under the
    loans ``made``: from now to each loan's end, the reserve and the loans still running,
    water-filled as the reserve alone is; after the last, the reserve alone. A borrower's
    schedule starts when the first of the loans' windows opened (so it stays the same while
    they do) and lasts a day (``MAX_PERIOD``): its client ends each loan itself, and the
    decision at the last loan's end (``next_change``) replaces it with a plain rate."""
    columns = view.columns
    demand, cap, ids = columns.demand, columns.cap, columns.job_id
    share = water_levels(rows, demand, cap, reserve)
    if not made or not rows:
        return share, {}
    origin = min(loan.opened for loan in made)
    ends = sorted({loan.end for loan in made})
    segments: list[tuple[float, float, dict[int, float]]] = []
    start = 0.0
    for end in ends:
        lent = sum(loan.rate for loan in made if loan.end >= end)
        segments.append(
            (start, end - origin, dict(water_levels(rows, demand, cap, reserve + lent)))
        )
        start = end - origin
    segments.append((start, MAX_PERIOD, dict(share)))
    schedules: dict[JobId, Schedule] = {}
    for r in rows:
        windows: list[Window] = []
        for begin, finish, levels in segments:
            rate = levels.get(r, 0.0)
            if rate <= 0.0:
                continue
            if windows and windows[-1].end == begin and windows[-1].rate == rate:
                windows[-1] = Window(windows[-1].start, finish, rate)
            else:
                windows.append(Window(begin, finish, rate))
        if windows:
            schedules[ids[r]] = Schedule(MAX_PERIOD, tuple(windows), origin)
    means = [(r, schedules[ids[r]].mean_rate()) for r in rows if ids[r] in schedules]
    return means, schedules


def next_change(
    schedules: Mapping[JobId, Schedule], now: float, view: SystemView, grace: float
) -> float | None:
    """Seconds from ``now`` to the next instant a loan may start or must end: the end of a
    window open now, or ``grace`` into the next window, of a job not in I/O. None: no such job.
    """
    jobs = view.jobs
    soonest: float | None = None
    for job_id, schedule in schedules.items():
        job = jobs.get(job_id)
        if job is not None and job.active:
            continue
        found = open_window(schedule, now)
        if found is not None:
            i, end = found
            w = schedule.windows[i]
            # the loan's start, if still to come
            at = end - (w.end - w.start) + max(grace, MIN_LOAN) - now
            if at <= 0.0:
                at = end - now
        else:
            phase = (now - schedule.origin) % schedule.period
            at = min((w.start - phase) % schedule.period for w in schedule.windows)
            at += max(grace, MIN_LOAN)
        if at > 0.0 and (soonest is None or at < soonest):
            soonest = at
    return soonest
