"""Periodic I/O scheduling: PERSCHED's patterns, computed offline ([PERSCHED]).

Pure model and algorithms (no I/O, no clock); docs/persched.md describes them. The
live policy that enforces a pattern is ``policies/persched/live.py`` (``persched``).
"""

from burstctl.policies.persched.algorithm import (
    PerSchedResult,
    build_pattern,
    default_tmin,
    persched,
)
from burstctl.policies.persched.model import (
    App,
    Platform,
    cap,
    dilation,
    periodic_efficiency,
    rho,
    sys_eff,
    time_io,
    upper_bound,
)
from burstctl.policies.persched.pattern import AppPattern, Instance, Pattern
from burstctl.policies.persched.sets import (
    JUPITER_TMIN,
    AppSet,
    SetFileError,
    jupiter_set,
    load_set_file,
    parse_set,
)
from burstctl.policies.persched.validate import validate

__all__ = [
    "JUPITER_TMIN",
    "App",
    "AppPattern",
    "AppSet",
    "Instance",
    "Pattern",
    "PerSchedResult",
    "Platform",
    "SetFileError",
    "build_pattern",
    "cap",
    "default_tmin",
    "dilation",
    "jupiter_set",
    "load_set_file",
    "parse_set",
    "periodic_efficiency",
    "persched",
    "rho",
    "sys_eff",
    "time_io",
    "upper_bound",
    "validate",
]
