"""Discrete-event simulator running the policies of ``burstctl.policies`` (a later issue)."""
