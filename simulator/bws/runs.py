"""One run of a bandwidth-sharing policy on a prepared window: ``simulate`` and its result.

Owns what ``burstctl sim run``, the sweeps and ``burstctl sim replay`` call: the policy made
for the window (``create_policy``: δ and known ω from the instance), the v2 warm-up, and the
metrics at T of the fluid event loop (``fluid.Run``) as a ``SimResult``, with each
application's own yield at T on request (``simulate_yields``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from burstctl.policies.base import Policy
from burstctl.policies.registry import PolicyRegistry, default_registry
from burstctl.simulator.bws.fluid import Run, app_ids
from burstctl.simulator.bws.instance import Window

SWITCH_POLICY = "fair-share"  # v2 runs FairShare on [0, T/2) (simulate's v2 switch)

Windows = Literal["v1", "v2"]


@dataclass(frozen=True, slots=True)
class SimResult:
    """Metrics of one run at T (as the reference's ``simulate`` computes them), and the run."""

    policy: str
    instance: str | None
    windows: str
    applications: int  # m
    horizon: float  # T
    delta: float  # δ of the window (used by policies with a ``delta`` parameter)
    min_yield: float  # eq. (8), capped at 1, whole history
    efficiency: float  # eq. (10), weighted by b_i
    utilization: float  # eq. (9), p_i = 1
    utilization_reference: float  # the reference's integer-truncated Utilization (setUtilGopi)
    pressure: float  # load L (eq. 11)
    events: int  # decisions taken (policy calls)
    wall_seconds: float
    known_omega: bool = False  # set-10 ran with known ω (the instance's wIter), not learned

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def create_policy(
    name: str,
    window: Window,
    registry: PolicyRegistry | None = None,
    *,
    known_omega: bool = False,
) -> Policy:
    """``registry.create(name)``; a policy whose ``Params`` has ``delta`` gets the window's δ.

    ``known_omega``: a policy whose ``Params`` has ``known_omega`` (set-10) gets each
    application's wIter from the instance as its known ω (applications with wIter > 0; the
    reference's Set10); without it, ω is learned (its Set10Learn).
    """
    reg = registry if registry is not None else default_registry()
    cls = reg.get(name)
    fields = cls.Params.model_fields
    params: dict[str, Any] = {"delta": window.delta} if "delta" in fields else {}
    if known_omega and "known_omega" in fields:
        ids = app_ids(len(window.apps))
        params["known_omega"] = {
            ids[i]: app.w_iter for i, app in enumerate(window.apps) if app.w_iter > 0.0
        }
    return reg.create(name, params)


def simulate(
    window: Window,
    policy: Policy | str,
    *,
    windows: Windows = "v1",
    registry: PolicyRegistry | None = None,
    instance: str | None = None,
    seed: int = 0,
) -> SimResult:
    """Runs ``policy`` on ``window`` and returns the metrics at T."""
    return simulate_yields(
        window, policy, windows=windows, registry=registry, instance=instance, seed=seed
    )[0]


def simulate_yields(
    window: Window,
    policy: Policy | str,
    *,
    windows: Windows = "v1",
    registry: PolicyRegistry | None = None,
    instance: str | None = None,
    seed: int = 0,
) -> tuple[SimResult, tuple[float, ...]]:
    """Runs ``policy`` on ``window``: the metrics at T, and each application's yield at T
    (eq. (8), not capped), in the window's order."""
    reg = registry if registry is not None else default_registry()
    strategy = create_policy(policy, window, reg) if isinstance(policy, str) else policy
    if windows not in ("v1", "v2"):
        raise ValueError(f"windows must be 'v1' or 'v2', got {windows!r}")
    started = time.perf_counter()
    run = Run(window, strategy, reg.create(SWITCH_POLICY) if windows == "v2" else None, seed)
    run.loop()
    wall = time.perf_counter() - started
    min_yield, efficiency, utilization, utilization_ref = run.metrics()
    result = SimResult(
        policy=strategy.name,
        instance=instance,
        windows=windows,
        applications=len(window.apps),
        horizon=window.horizon,
        delta=window.delta,
        min_yield=min_yield,
        efficiency=efficiency,
        utilization=utilization,
        utilization_reference=utilization_ref,
        pressure=window.load,
        events=run.events,
        wall_seconds=wall,
        known_omega=bool(getattr(strategy.params, "known_omega", None)),
    )
    return result, tuple(run.yields())
