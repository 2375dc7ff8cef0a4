"""Every policy on a replay's window: the per-job yields and the papers' metrics.

Owns what ``burstctl sim replay`` prints: one ``simulate_yields`` run of each requested
policy (every registered one by default) on the window of ``mapping.replay_jobs``, its
metrics at T as ``sim run`` reports them and each job's yield at T ([BWS] eq. (8)). A
policy that fails on the window is a row with its error, the others still run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from burstctl.policies.registry import PolicyRegistry, default_registry
from burstctl.simulator.bws.fluid import SimulationError
from burstctl.simulator.bws.runs import SimResult, create_policy, simulate_yields
from burstctl.simulator.replay.mapping import Replay


@dataclass(frozen=True, slots=True)
class PolicyReplay:
    """One policy on a replay: its metrics and each job's yield (in the jobs' order), or
    the error that stopped it."""

    policy: str
    result: SimResult | None
    yields: tuple[float, ...]
    error: str = ""


def run_policies(
    replay: Replay,
    policies: Sequence[str] = (),
    registry: PolicyRegistry | None = None,
) -> list[PolicyReplay]:
    """Runs each of ``policies`` (every registered one when empty), in that order."""
    reg = registry if registry is not None else default_registry()
    names = list(policies) or reg.names()
    runs = []
    for name in names:
        try:
            policy = create_policy(name, replay.window, reg)
            result, yields = simulate_yields(replay.window, policy, registry=reg)
        except SimulationError as exc:
            runs.append(PolicyReplay(name, None, (), str(exc)))
            continue
        runs.append(PolicyReplay(name, result, yields))
    return runs
