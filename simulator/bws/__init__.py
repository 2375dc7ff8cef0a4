"""The bandwidth-sharing simulator ([BWS], docs/simulator.md): the reference simulator's
instances and window (``instance``), the synthetic workloads of [BWS] §6.2 (``generate``),
the fluid event loop (``fluid``) and one run of a policy on a window (``runs``), sweeps of
policies × pressures × seeds (``sweep``) and their boxplots (``plots``)."""
