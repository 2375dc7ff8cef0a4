"""burstctl: policy-driven I/O bandwidth sharing for HPC burst buffers."""

__version__ = "0.1.0"
