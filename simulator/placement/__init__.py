"""The [DIST-IO] placement simulator (docs/simulator.md, "[DIST-IO] placement"): the sets
and their runs (``runs``), the workload generator (``workloads``) and the sweep's figures
(``report``)."""
