"""The one interface every policy implements.

A policy is a pure function from a ``SystemView`` to a rate per job (bytes/s).
It holds only its parameters (a frozen pydantic model) and, where the paper's
strategy learns online, state derived from the views it was shown; it never
does I/O, never reads a clock, never logs in its hot path. What it proposes is
enforced by ``policies.decision.decide``, the one decision path of the
controller and the simulator.

A policy may also declare an array entry point (:class:`ArrayAllocator`, through
:meth:`Policy.array_allocator`) for the simulator, which then decides without
building views. It is a promise checked by the conformance suite on every
registered policy: the same rates as the view path, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from burstctl.policies.schedule import Schedule
from burstctl.policies.view import JobId, SystemView


class PolicyParams(BaseModel):
    """Parameters of a policy; subclasses add fields. Unknown keys are rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(slots=True)
class ArrayView:
    """A view given as arrays indexed by ``JobView.index`` (the simulator's own lists).

    The view's jobs are the rows ``active``, every one active, with distinct
    indices in increasing order (the stable order), whose job ids sort like their
    indices. Row i has P_i in ``progress``, τ_i in ``released_at``, its demand in
    ``demand``, b_i in ``cap`` (the simulator passes b_i for both), the remaining
    volume V_i of its pending operation (known) in ``remaining``, its full volume
    in ``volume``, its post time R_i in ``posted_at``, the work phase before it in
    ``last_work`` and its job id in ``job_ids``. ``now``, ``capacity`` and
    ``horizon`` are the view's, which was observed (``SystemView.observed``).
    The lists are the caller's: read them during the call, never keep them.
    """

    now: float
    capacity: float
    horizon: float | None
    active: Sequence[int]
    progress: Sequence[float]
    released_at: Sequence[float]
    demand: Sequence[float]
    cap: Sequence[float]
    remaining: Sequence[float]
    posted_at: Sequence[float]
    volume: Sequence[float]
    last_work: Sequence[float]
    job_ids: Sequence[str]


class ArrayAllocator(Protocol):
    """A policy's decision over an :class:`ArrayView`: ``(index, rate)`` for the
    positive rates, in the order the view path's ``decide(policy, view).rates``
    lists them, with the same values."""

    def __call__(self, rows: ArrayView) -> list[tuple[int, float]]: ...


class Offload(Protocol):
    """Runs ``work`` away from the decision path (the controller: a worker thread) and then
    calls ``done`` with its result on the decision path, followed by a new decision."""

    def __call__(self, work: Callable[[], Any], done: Callable[[Any], None]) -> None: ...


class Policy:
    """Base class: ``name``, ``Params`` and ``allocate(view)``."""

    name: ClassVar[str]
    Params: ClassVar[type[PolicyParams]] = PolicyParams

    def __init__(self, params: PolicyParams | None = None) -> None:
        self.params = params if params is not None else self.Params()
        if not isinstance(self.params, self.Params):
            raise TypeError(
                f"{self.name} takes {self.Params.__name__}, got {type(params).__name__}"
            )

    def allocate(self, view: SystemView) -> Mapping[JobId, float]:
        """Rates in bytes/s for the active jobs of ``view``; absent jobs get 0."""
        raise NotImplementedError

    def schedules(self, view: SystemView) -> Mapping[JobId, Schedule]:
        """Periodic patterns of I/O windows for some jobs of ``view`` (a time-dependent
        allocation, ``policies/schedule.py``); called after ``allocate`` on the same view.
        A job given one gets the pattern's mean rate instead of its ``allocate`` rate, and
        its client paces to the windows. Default: none, every job gets a plain rate."""
        return {}

    def use_offload(self, offload: Offload | None) -> None:
        """Where to run slow work (PerSched's pattern) so that it does not hold up decisions
        for other jobs; the controller gives one before the first decision. Without one (the
        simulator, tests) such a policy does the work in the decision. Default: ignored."""

    def period(self, view: SystemView) -> float | None:
        """Seconds after which the policy wants to decide again even if nothing
        happens (PeriodicGreedyYield's δ); None: only at events."""
        return None

    def fixed_period(self) -> float | None:
        """What ``period(view)`` returns for every view, when that does not depend on
        the view (PeriodicGreedyYield's δ); None otherwise, or when there is no period."""
        return None

    def array_allocator(self) -> ArrayAllocator | None:
        """The array entry point standing for this policy's whole decision, or None.

        Only a policy whose ``period`` is always None, or always ``fixed_period()``,
        may return one (the simulator has no view to ask). A subclass that changes
        ``allocate``, ``period`` or ``fixed_period`` must say again what it offers
        here; the simulator does not take an entry point inherited past such a change.
        """
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"
