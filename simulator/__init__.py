"""Discrete-event simulator of the bandwidth-sharing policies (docs/simulator.md).

``instance`` owns the application line format and the window (T, truncation, δ,
load); ``generate`` the synthetic workloads of [BWS] §6.2; ``engine`` the
fluid event loop and the metrics; ``sweep`` campaigns in worker processes. The
simulator calls the same ``burstctl.policies`` objects as the controller and
never imports the controller.
"""
