"""The DPSAC simulator ([DPSAC] §5, docs/simulator.md "DPSAC"): the platform and its loop
(``model``), the three schedulers compared (``methods``), the experiments (``runs``) and
the paper's workloads (``workloads``)."""
