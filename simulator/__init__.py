"""Simulators of the policies' families (docs/simulator.md), one subpackage each:
``bws`` (the bandwidth-sharing strategies, the paper's fluid event loop), ``persched``,
``dpsac`` and ``placement``; ``campaign`` runs the sweeps of all of them. The simulators
call the same ``burstctl.policies`` objects as the controller and never import the
controller.
"""
