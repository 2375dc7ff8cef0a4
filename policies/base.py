"""The one interface every policy implements.

A policy is a pure function from a ``SystemView`` to a rate per job (bytes/s),
through its one entry point, ``allocate(view)``. It holds only its parameters (a
frozen pydantic model) and, where the paper's strategy learns online, state
derived from the views it was shown; it never does I/O, never reads a clock,
never logs in its hot path. What it proposes is enforced by
``policies.decision.decide``, the one decision path of the controller and the
simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from burstctl.policies.schedule import NO_SCHEDULES, Schedule
from burstctl.policies.view import JobId, RowRates, SystemView


class PolicyParams(BaseModel):
    """Parameters of a policy; subclasses add fields. Unknown keys are rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Offload(Protocol):
    """Runs ``work`` away from the decision path (the controller: a worker thread) and then
    calls ``done`` with its result on the decision path, followed by a new decision."""

    def __call__(self, work: Callable[[], Any], done: Callable[[Any], None]) -> None: ...


# The policy classes that keep the default ``schedules`` (none), and those that keep the
# default ``period`` (none): ``decision.decide`` asks them nothing (a set look-up instead
# of a call, at each of the simulator's decisions). Filled as the classes are defined.
WITHOUT_SCHEDULES: set[type[Policy]] = set()
WITHOUT_PERIOD: set[type[Policy]] = set()


class Policy:
    """Base class: ``name``, ``Params`` and ``allocate(view)``."""

    name: ClassVar[str]
    Params: ClassVar[type[PolicyParams]] = PolicyParams
    # The ``JobView`` fields ``allocate`` reads, besides the view's capacity and which
    # jobs are active, for a policy that keeps no state between calls: two views equal in
    # them get equal rates, so the replicas' exchange keeps its share while the digest
    # columns they come from do not change (controller/peers.py). None (the default,
    # always safe): any field, and time (``now``, released_at, posted_at).
    reads: ClassVar[frozenset[str] | None] = None
    # The policy keeps state built from the views it decides (clusters, a pattern): the
    # merged view of several replicas is decided by an instance of its own, so that the
    # replica's own decisions and the merged ones do not rebuild each other's state
    # (controller/state.py: ``PolicySlot.merged``).
    keeps_state: ClassVar[bool] = False
    # What the policy leaves unallotted stays so: between exchanges a replica does not top
    # jobs up into it (policies/decision.py: ``blend``). False for a policy that defers jobs
    # on purpose (DPSAC's admission).
    conserving: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.schedules is Policy.schedules:
            WITHOUT_SCHEDULES.add(cls)
        if cls.period is Policy.period:
            WITHOUT_PERIOD.add(cls)

    def __init__(self, params: PolicyParams | None = None) -> None:
        self.params = params if params is not None else self.Params()
        if not isinstance(self.params, self.Params):
            raise TypeError(
                f"{self.name} takes {self.Params.__name__}, got {type(params).__name__}"
            )

    def allocate(self, view: SystemView) -> Mapping[JobId, float] | RowRates:
        """Rates in bytes/s for the active jobs of ``view``; absent jobs get 0.

        By job id, or as (row, rate) pairs of the view's rows (``RowRates``: a policy
        that reads the view's columns answers in rows, and no job id is looked up on
        the way to the decision)."""
        raise NotImplementedError

    def schedules(self, view: SystemView) -> Mapping[JobId, Schedule]:
        """Periodic patterns of I/O windows for some jobs of ``view`` (a time-dependent
        allocation, ``policies/schedule.py``); called after ``allocate`` on the same view.
        A job given one gets the pattern's mean rate instead of its ``allocate`` rate, and
        its client paces to the windows. Default: none, every job gets a plain rate."""
        return NO_SCHEDULES

    def use_offload(self, offload: Offload | None) -> None:
        """Where to run slow work (PerSched's pattern) so that it does not hold up decisions
        for other jobs; the controller's ``PolicySlot`` gives one as it builds the policy,
        before its first decision. Without one (the simulator, tests) such a policy does the
        work in the decision. Default: ignored."""

    def period(self, view: SystemView) -> float | None:
        """Seconds after which the policy wants to decide again even if nothing
        happens (PeriodicGreedyYield's δ); None: only at events."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"
