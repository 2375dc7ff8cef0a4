"""``burstctl sim``: the simulators, one module of commands per research family."""

from __future__ import annotations

import click

from burstctl.cli import LazyGroup


@click.group(
    cls=LazyGroup,
    lazy={
        "generate": "burstctl.cli.sim.bws:sim_generate",
        "run": "burstctl.cli.sim.bws:sim_run",
        "sweep": "burstctl.cli.sim.bws:sim_sweep",
        "plot": "burstctl.cli.sim.bws:sim_plot",
        "persched": "burstctl.cli.sim.persched:sim_persched",
        "persched-compare": "burstctl.cli.sim.persched:sim_persched_compare",
        "dpsac": "burstctl.cli.sim.dpsac:sim_dpsac",
        "dpsac-join": "burstctl.cli.sim.dpsac:sim_dpsac_join",
        "dpsac-plot": "burstctl.cli.sim.dpsac:sim_dpsac_plot",
        "placement": "burstctl.cli.sim.placement:sim_placement",
        "placement-sweep": "burstctl.cli.sim.placement:sim_placement_sweep",
        "replay": "burstctl.cli.sim.replay:sim_replay",
    },
)
def sim() -> None:
    """Discrete-event simulator of the bandwidth-sharing policies (docs/simulator.md)."""
