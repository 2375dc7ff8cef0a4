"""The one interface every policy implements.

A policy is a pure function from a ``SystemView`` to a rate per job (bytes/s).
It holds only its parameters (a frozen pydantic model) and, where the paper's
strategy learns online, state derived from the views it was shown; it never
does I/O, never reads a clock, never logs in its hot path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from burstctl.policies.view import JobId, SystemView


class PolicyParams(BaseModel):
    """Parameters of a policy; subclasses add fields. Unknown keys are rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


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

    def period(self, view: SystemView) -> float | None:
        """Seconds after which the policy wants to decide again even if nothing
        happens (PeriodicGreedyYield's δ); None: only at events."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"
