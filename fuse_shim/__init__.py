"""The FUSE passthrough filesystem and ``burstctl mount`` (a later issue; empty for now)."""
