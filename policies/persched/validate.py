"""Check a periodic pattern against the model's constraints ([PERSCHED] §2).

:func:`validate` returns the violations as one-line strings (empty: valid):

- at every instant, the sum of the rates is at most ``B``;
- every rate is positive and at most min(β·b, B);
- each instance moves exactly ``vol_io``, inside its own window: from the end of its
  compute phase to the compute start of the application's next instance (cyclically);
- an application's compute and I/O never overlap (nor do two of its phases);
- SysEff and Dilation recomputed from the pattern equal the reported ones, if given.

Times are compared with an absolute tolerance of a millisecond, volumes and rates
relatively (1e-6, plus what a millisecond at full rate moves).
"""

from __future__ import annotations

import math

from burstctl.policies.persched.model import Platform, cap
from burstctl.policies.persched.pattern import Pattern

TIME_TOL = 1e-3
REL_TOL = 1e-6


def validate(
    pattern: Pattern,
    platform: Platform,
    *,
    sys_eff: float | None = None,
    dilation: float | None = None,
) -> list[str]:
    T = pattern.period
    problems: list[str] = []
    if not (T > 0 and math.isfinite(T)):
        return [f"period: must be > 0, got {T}"]
    B = platform.B
    rate_events: list[tuple[float, float]] = []
    for entry in pattern.apps:
        app = entry.app
        name = app.name
        limit = cap(app, platform)
        insts = sorted(entry.instances, key=lambda inst: inst.compute_start % T)
        busy: list[tuple[float, float, str]] = []
        for i, inst in enumerate(insts):
            start = inst.compute_start % T
            label = f"{name} instance {i} (compute at {start:.6g})"
            if len(insts) > 1:
                nxt = insts[(i + 1) % len(insts)].compute_start % T
                window_end = nxt if nxt > start else nxt + T
            else:
                window_end = start + T
            window_start = start + app.w
            if window_start > window_end + TIME_TOL:
                problems.append(
                    f"{label}: compute ends at {window_start:.6g}, after the next instance"
                    f" starts at {window_end:.6g}"
                )
            busy.extend(_wrap(start, start + app.w, T, f"{label} compute"))
            moved = 0.0
            for io_start, io_end, rate in inst.io:
                what = f"{label} I/O [{io_start:.6g}, {io_end:.6g})"
                if not io_end > io_start:
                    problems.append(f"{what}: empty or reversed interval")
                    continue
                if not rate > 0:
                    problems.append(f"{what}: rate {rate} must be > 0")
                    continue
                if rate > limit * (1 + REL_TOL):
                    problems.append(f"{what}: rate {rate:.6g} > min(beta*b, B) = {limit:.6g}")
                # the interval, moved by whole periods to start in the instance's window
                shifted = io_start + T * math.floor((window_start - TIME_TOL - io_start) / T + 1)
                if shifted - (window_start - TIME_TOL) >= T:
                    shifted -= T
                shifted_end = shifted + (io_end - io_start)
                if shifted_end > window_end + TIME_TOL:
                    problems.append(
                        f"{what}: outside the instance's window"
                        f" [{window_start % T:.6g}, {window_end % T:.6g}) (mod T)"
                    )
                moved += (io_end - io_start) * rate
                busy.extend(_wrap(io_start, io_end, T, f"{what}"))
                for piece_start, piece_end, _ in _wrap(io_start, io_end, T, ""):
                    rate_events.append((piece_start, rate))
                    rate_events.append((piece_end, -rate))
            tol = REL_TOL * app.vol_io + 2 * TIME_TOL * limit * max(1, len(inst.io))
            if abs(moved - app.vol_io) > tol:
                problems.append(f"{label}: moves {moved:.9g} GB, vol_io is {app.vol_io:.9g} GB")
        busy.sort()
        reach, holder = -math.inf, ""
        for s2, e2, what2 in busy:
            if s2 < reach - TIME_TOL:
                problems.append(
                    f"{name}: {holder} and {what2} overlap on [{s2:.6g}, {min(reach, e2):.6g})"
                )
            if e2 > reach:
                reach, holder = e2, what2
    rate_events.sort()
    level = 0.0
    worst = (0.0, 0.0)
    for i, (t, delta) in enumerate(rate_events):
        level += delta
        nxt = rate_events[i + 1][0] if i + 1 < len(rate_events) else T
        if nxt - t > TIME_TOL / 10 and level > worst[0]:
            worst = (level, t)
    if worst[0] > B * (1 + REL_TOL) + 1e-9:
        problems.append(f"bandwidth: {worst[0]:.9g} GB/s in use at t = {worst[1]:.6g}, B = {B:.9g}")
    if sys_eff is not None:
        actual = pattern.sys_eff(platform)
        if not math.isclose(actual, sys_eff, rel_tol=1e-9, abs_tol=1e-12):
            problems.append(f"sys_eff: reported {sys_eff!r}, the pattern gives {actual!r}")
    if dilation is not None:
        actual = pattern.dilation(platform)
        if not math.isclose(actual, dilation, rel_tol=1e-9):
            problems.append(f"dilation: reported {dilation!r}, the pattern gives {actual!r}")
    return problems


def _wrap(start: float, end: float, T: float, what: str) -> list[tuple[float, float, str]]:
    """``[start, end)`` on the circle of length ``T`` as at most two pieces in ``[0, T)``."""
    if end - start >= T:
        return [(0.0, T, what)]
    s = start % T
    e = s + (end - start)
    if e <= T:
        return [(s, e, what)]
    return [(s, T, what), (0.0, e - T, what)]
