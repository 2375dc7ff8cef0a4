"""Simulator instances: the application line format and the simulated window.

Owns parsing and writing of the reference simulator's application file (the
format [BWS-SIM] simu.cc: ``addApps`` reads and ``generate.py`` writes), one
application per line::

    name bandwidth age progress agePhase n wIter InitialType x_1 … x_n

and the preparation of a window from it, as ``addApps2`` and ``addApps`` do:
normalisation to B = 1, the window end T = window × minᵢ Sᵢ, truncation of
every application's phases to T, the period δ of PeriodicGreedyYield (from K,
the number of solo-mode phases) and the load L (the I/O pressure, [BWS]
eq. (11)).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# InitialType: 'C' means the first listed value is an I/O; any other token is work.
IO_FIRST = "C"
WORK_FIRST = "W"

# The reference asserts every kept total is within ±0.1 % of T (``addApps``).
KEPT_TOLERANCE = 1e-3

_HEADER_FIELDS = ("name", "bandwidth", "age", "progress", "agePhase", "n", "wIter", "InitialType")


class InstanceError(ValueError):
    """A malformed instance: names the line (1-based) and the field at fault."""

    def __init__(self, line: int, field: str, message: str) -> None:
        super().__init__(f"line {line}: {field}: {message}")
        self.line = line
        self.field = field


@dataclass(frozen=True, slots=True)
class Application:
    """One line of an instance, as written (volumes not yet normalised).

    ``values`` alternate between work durations (seconds) and I/O volumes (in
    the unit of ``bandwidth`` × seconds), starting with an I/O when
    ``initial_type`` is ``C``.
    """

    name: str
    bandwidth: float  # bw: the cap b_i = p_i·b before clipping to B
    age: float  # r: released r seconds before 0, τ = −r
    progress: float  # p₀: initial P, dedicated-equivalent seconds
    age_phase: float  # a: the first phase was posted at −a (its R)
    w_iter: float  # the "known" iteration length (Set-10)
    initial_type: str
    values: tuple[float, ...]
    line: int = 0  # 1-based source line, 0 when built in code

    @property
    def io_first(self) -> bool:
        return self.initial_type == IO_FIRST


def parse_instance(text: str) -> list[Application]:
    """Parses the line format; blank lines and ``#`` comment lines are skipped."""
    apps: list[Application] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        apps.append(_parse_line(stripped.split(), number))
    return apps


def read_instance(path: str | Path) -> list[Application]:
    """Reads and parses an instance file."""
    return parse_instance(Path(path).read_text(encoding="utf-8"))


def format_application(app: Application) -> str:
    """One line of the format; floats are written so that they parse back exactly."""
    head = [
        app.name,
        _fmt(app.bandwidth),
        _fmt(app.age),
        _fmt(app.progress),
        _fmt(app.age_phase),
        str(len(app.values)),
        _fmt(app.w_iter),
        app.initial_type,
    ]
    return " ".join(head + [repr(float(v)) for v in app.values])


def format_instance(apps: Iterable[Application]) -> str:
    return "".join(format_application(a) + "\n" for a in apps)


def write_instance(path: str | Path, apps: Iterable[Application]) -> None:
    Path(path).write_text(format_instance(apps), encoding="utf-8")


def _fmt(x: float) -> str:
    # Integral header fields as the reference generator writes them ("1 0 0 0").
    if x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(float(x))


def _parse_line(tokens: list[str], line: int) -> Application:
    if len(tokens) < len(_HEADER_FIELDS):
        raise InstanceError(
            line,
            "fields",
            f"expected at least {len(_HEADER_FIELDS)} fields "
            f"({' '.join(_HEADER_FIELDS)} x_1 … x_n), got {len(tokens)}",
        )
    name = tokens[0]
    bandwidth = _number(tokens[1], line, "bandwidth")
    if bandwidth <= 0.0:
        raise InstanceError(line, "bandwidth", f"must be > 0, got {tokens[1]}")
    age = _non_negative(tokens[2], line, "age")
    progress = _non_negative(tokens[3], line, "progress")
    age_phase = _non_negative(tokens[4], line, "agePhase")
    try:
        n = int(tokens[5])
    except ValueError:
        raise InstanceError(line, "n", f"not an integer: {tokens[5]!r}") from None
    if n < 0:
        raise InstanceError(line, "n", f"must be >= 0, got {n}")
    w_iter = _non_negative(tokens[6], line, "wIter")
    initial_type = tokens[7]
    raw_values = tokens[8:]
    if len(raw_values) != n:
        raise InstanceError(line, "n", f"says {n} values but the line has {len(raw_values)}")
    io = initial_type == IO_FIRST
    values = []
    for k, tok in enumerate(raw_values, start=1):
        kind = "volume" if io else "duration"
        values.append(_non_negative(tok, line, f"x_{k} ({kind})"))
        io = not io
    return Application(
        name=name,
        bandwidth=bandwidth,
        age=age,
        progress=progress,
        age_phase=age_phase,
        w_iter=w_iter,
        initial_type=initial_type,
        values=tuple(values),
        line=line,
    )


def _number(token: str, line: int, field: str) -> float:
    try:
        x = float(token)
    except ValueError:
        raise InstanceError(line, field, f"not a number: {token!r}") from None
    if not math.isfinite(x):
        raise InstanceError(line, field, f"not finite: {token!r}")
    return x


def _non_negative(token: str, line: int, field: str) -> float:
    x = _number(token, line, field)
    if x < 0.0:
        raise InstanceError(line, field, f"must be >= 0, got {token}")
    return x


# ---------------------------------------------------------------------------
# The window (``addApps2``, ``addApps``)


@dataclass(frozen=True, slots=True)
class Phase:
    """A kept phase, normalised: work in seconds, I/O as volume / B."""

    io: bool
    value: float
    cut: bool  # truncated at T


@dataclass(frozen=True, slots=True)
class WindowedApp:
    """An application normalised to B = 1 and truncated to [0, T]."""

    name: str
    cap: float  # b_i = min(bw, B) / B
    released_at: float  # τ = −age
    progress: float  # P(0) = p₀
    posted_at: float  # R of the first phase = −agePhase
    w_iter: float
    phases: tuple[Phase, ...]
    kept: float  # D_i: kept full-speed duration
    solo_phases: int  # 1 + later phases kept whole (a term of K)


@dataclass(frozen=True, slots=True)
class Window:
    """The prepared instance: [0, T], the applications, δ and the load L."""

    horizon: float  # T
    apps: tuple[WindowedApp, ...]
    solo_phases: int  # K = Σᵢ (1 + later phases kept whole)
    delta: float  # δ = Σᵢ Dᵢ / (K·n) ≈ T/K (PeriodicGreedyYield)
    load: float  # L = Σ kept normalised I/O volume / T (eq. 11, B = 1)
    bandwidth: float  # B used to normalise the input


def solo_duration(app: Application, bandwidth: float) -> float:
    """Sᵢ: full-speed duration of all listed phases (as ``addApps2``), in normalised units."""
    cap = min(app.bandwidth, bandwidth) / bandwidth
    io = app.io_first
    total = 0.0
    for v in app.values:
        total += (v / bandwidth) / cap if io else v
        io = not io
    return total


def prepare_window(
    apps: Sequence[Application], window: float = 1.0, bandwidth: float = 1.0
) -> Window:
    """Normalises and truncates ``apps`` to [0, T], T = window × minᵢ Sᵢ (``addApps``)."""
    if not apps:
        raise ValueError("the instance has no applications")
    if not (0.0 < window <= 1.0):
        raise ValueError(f"window must be in (0, 1], got {window}")
    if not (math.isfinite(bandwidth) and bandwidth > 0.0):
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    horizon = window * min(solo_duration(a, bandwidth) for a in apps)
    if horizon <= 0.0:
        raise ValueError("the window is empty: an application has no phase of positive length")
    prepared = []
    io_volume = 0.0
    for app in apps:
        w = _truncate(app, horizon, bandwidth)
        io_volume += sum(p.value for p in w.phases if p.io)
        prepared.append(w)
    solo = sum(w.solo_phases for w in prepared)
    delta = sum(w.kept for w in prepared) / (solo * len(prepared))
    return Window(
        horizon=horizon,
        apps=tuple(prepared),
        solo_phases=solo,
        delta=delta,
        load=io_volume / horizon,
        bandwidth=bandwidth,
    )


def _truncate(app: Application, horizon: float, bandwidth: float) -> WindowedApp:
    cap = min(app.bandwidth, bandwidth) / bandwidth
    phases: list[Phase] = []
    kept = 0.0  # D
    solo = 0
    io = app.io_first
    for k, raw in enumerate(app.values):
        value = raw / bandwidth if io else raw
        duration = value / cap if io else value
        if k == 0:
            solo = 1  # the first phase counts even when cut
            if duration > horizon:
                phases.append(Phase(io, cap * horizon if io else horizon, True))
                kept = horizon
                break
            phases.append(Phase(io, value, False))
            kept = duration
        elif kept + duration > horizon:
            rest = horizon - kept
            phases.append(Phase(io, cap * rest if io else rest, True))
            kept = horizon
            break
        else:
            phases.append(Phase(io, value, False))
            kept += duration
            solo += 1
        io = not io
    if abs(kept - horizon) > KEPT_TOLERANCE * horizon:
        raise _window_error(
            app, "values", f"kept duration {kept} is not within 0.1 % of T = {horizon}"
        )
    for k, p in enumerate(phases, start=1):
        if not p.value > 0.0:
            raise _window_error(app, f"x_{k}", "is 0 inside the window; kept phases must be > 0")
    return WindowedApp(
        name=app.name,
        cap=cap,
        released_at=-app.age,
        progress=app.progress,
        posted_at=-app.age_phase,
        w_iter=app.w_iter,
        phases=tuple(phases),
        kept=kept,
        solo_phases=solo,
    )


def _window_error(app: Application, field: str, message: str) -> ValueError:
    if app.line:
        return InstanceError(app.line, field, message)
    return ValueError(f"application {app.name!r}: {field}: {message}")
