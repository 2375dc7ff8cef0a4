"""The [DIST-IO] simulator: allocation and placement of applications over N I/O resources.

Owns ``burstctl sim placement`` and ``sim placement-sweep``; the model, the metrics and the
choices the paper leaves open are in docs/simulator.md, "[DIST-IO] placement". The
allocators, placements, metrics and profiles are those of ``burstctl.policies.placement``;
this module only generates sets (``placement_workloads``), runs them and measures.

The engine is an exact fluid one, event to event. Application j alternates a compute
subphase (T_cpu/p_j) and an I/O subphase (V_io/p_j) made of n_j independent transfers of
V_io/(p_j·n_j), one on each of its n_j distinct resources, each at b_j(n_j)/n_j when
alone; the subphase ends when the last of its transfers ends ([DIST-IO] §III, Fig. 4).
A resource on which k applications have an unfinished transfer gives each of them 1/k of
its time, so each transfer moves at b_j(n_j)/(n_j·k). Between two events (a compute
subphase or a transfer ends) every rate is constant, so the loop jumps from event to
event. This is the limit of the paper's time-based simulator ([DIST-IO] §V-A: colliding
applications alternate one time unit each), where over many units each of k colliders
holds the resource 1/k of the time; the fluid form has no unit rounding and is far
faster.

Measurement window ([DIST-IO] §V-B asks for an interval where no application finishes
and every one completes at least one phase). Every application repeats its phase
sequence from the start when it is done, so none leaves, and the window is [0, t_end]
where t_end is the first moment every application has run all its p_j phases at least
once. Inside it: T_j the time application j spent in I/O subphases, V_j the volume it
moved, O_r the fraction of time resource r had at least one transfer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

_REL = 1e-9  # a transfer with less than this fraction of its volume left is over


@dataclass(frozen=True, slots=True)
class SimApp:
    """One application as the engine runs it."""

    phases: int  # p_j ≥ 1
    t_cpu: float  # T_cpu^j, all phases, s
    v_io: float  # V_io^j, all phases
    bandwidth: float  # b_j(n_j), the aggregate rate alone on its n_j resources
    resources: tuple[int, ...]  # S_j, distinct


@dataclass(frozen=True, slots=True)
class Measured:
    """What the engine measured over the window [0, t]."""

    t: float
    io_time: tuple[float, ...]  # T_j
    volume: tuple[float, ...]  # V_j
    busy: tuple[float, ...]  # O_r, fraction of t
    phases_done: tuple[int, ...]  # I/O subphases completed per application
    events: int


# audit(dt, resource → total share handed out during dt) after every step, for tests
Audit = Callable[[float, dict[int, float]], None]


def simulate(apps: Sequence[SimApp], n_resources: int, audit: Audit | None = None) -> Measured:
    """Runs the applications until each has done all its phases once (module docstring)."""
    k = len(apps)
    for j, a in enumerate(apps):
        if a.phases < 1 or a.t_cpu < 0 or a.v_io <= 0 or a.bandwidth <= 0:
            raise ValueError(f"application {j}: bad phases, T_cpu, V_io or bandwidth")
        if not a.resources or len(set(a.resources)) != len(a.resources):
            raise ValueError(f"application {j}: resources must be distinct and non-empty")
        if min(a.resources) < 0 or max(a.resources) >= n_resources:
            raise ValueError(f"application {j}: resource outside 0..{n_resources - 1}")
    cpu_len = [a.t_cpu / a.phases for a in apps]
    piece = [a.v_io / (a.phases * len(a.resources)) for a in apps]  # one transfer
    speed = [a.bandwidth / len(a.resources) for a in apps]  # one transfer, alone
    # state: cpu_end[j] is set while computing; rem[j] maps resource → volume left
    now = 0.0
    cpu_end: list[float | None] = [now + c for c in cpu_len]
    rem: list[dict[int, float]] = [{} for _ in apps]
    holders = [0] * n_resources  # applications with an unfinished transfer on r
    in_io: set[int] = set()
    done = [0] * k
    io_time = [0.0] * k
    volume = [0.0] * k
    busy = [0.0] * n_resources
    pending = set(range(k))  # applications yet to complete all their phases once
    events = 0

    def start_io(j: int) -> None:
        cpu_end[j] = None
        rem[j] = dict.fromkeys(apps[j].resources, piece[j])
        for r in apps[j].resources:
            holders[r] += 1
        in_io.add(j)

    for j in range(k):
        if cpu_len[j] <= 0.0:
            start_io(j)
    while pending:
        events += 1
        dt = float("inf")
        for end in cpu_end:
            if end is not None and end - now < dt:
                dt = end - now
        for j in in_io:
            sp = speed[j]
            for r, left in rem[j].items():
                t = left * holders[r] / sp
                if t < dt:
                    dt = t
        dt = max(dt, 0.0)
        if audit is not None:
            shares: dict[int, float] = {}
            for j in in_io:
                for r in rem[j]:
                    shares[r] = shares.get(r, 0.0) + 1.0 / holders[r]
            audit(dt, shares)
        now += dt
        for r in range(n_resources):
            if holders[r]:
                busy[r] += dt
        ended = []
        for j in in_io:
            io_time[j] += dt
            finished = []
            step = speed[j] * dt
            tol = piece[j] * _REL
            left_j = rem[j]
            for r, left in left_j.items():
                moved = step / holders[r]
                if left - moved <= tol:
                    volume[j] += left
                    finished.append(r)
                else:
                    volume[j] += moved
                    left_j[r] = left - moved
            for r in finished:
                del left_j[r]
            if not left_j:
                ended.append(j)
        for j in ended:  # the I/O subphase is over (holders change only after all moved)
            in_io.discard(j)
        # release the resources of the transfers that ended
        for r in range(n_resources):
            holders[r] = 0
        for j in in_io:
            for r in rem[j]:
                holders[r] += 1
        for j in ended:
            done[j] += 1
            if done[j] >= apps[j].phases:
                pending.discard(j)
            if cpu_len[j] > 0.0:
                cpu_end[j] = now + cpu_len[j]
            else:
                start_io(j)
        for j in range(k):
            end = cpu_end[j]
            if end is not None and end - now <= 1e-9 * max(1.0, now):
                start_io(j)
    return Measured(
        t=now,
        io_time=tuple(io_time),
        volume=tuple(volume),
        busy=tuple(b / now if now > 0 else 0.0 for b in busy),
        phases_done=tuple(done),
        events=events,
    )
