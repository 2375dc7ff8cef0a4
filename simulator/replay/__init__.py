"""Darshan logs replayed in the simulator (docs/simulator.md, "Darshan replay"): ``darshan.py``
reads a log (the one seam to PyDarshan), ``mapping.py`` turns logs into a window of
concurrent jobs, ``runs.py`` runs the policies on it."""
