"""DPSAC: probabilistic scheduling of I/O via application clustering ([DPSAC]).

Pure building blocks (no I/O, no clock, no threads; every draw from a ``random.Random``
passed in), shared by the live policy ``dpsac`` (``policies/dpsac/live.py``) and the
simulator:

- ``clustering``: 1-D K-means by dynamic programming, Algorithm 1 ([DPSAC] §4.2), and the
  elbow rule;
- ``merge``: the batch rule of [DPSAC] §4.1–§4.2 (insert a small batch, cluster and merge a
  large one);
- ``partition``: EIO_k, U_k, the quotas U_k·S and PFS shares U_k·B ([DPSAC] §4.3);
- ``dist``: the per-cluster load distribution Dist, Algorithm 2 ([DPSAC] §4.4.1), with
  exact removal, and its tail (the transition-to-full probability, §4.4.2);
- ``algorithm3``: the probabilistic scheduling of one cluster per time unit ([DPSAC] §4.4.3);
- ``priorities``: MinDilation, MaxSysEff and MinMax-γ orders ([DPSAC] §3.3, §4.4.3);
- ``updaters``: ST, DT and OK (Algorithm 4) for joins and exits ([DPSAC] §4.5).

docs/dpsac.md gives the units and every reading of a gap in the paper.
"""
