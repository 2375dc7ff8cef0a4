"""Job identity: who a session speaks for, validated, and derived from a process environment.

`JobInfo.from_env` is pure (environment, uid and gid come in as arguments) so the FUSE shim can
build the identity of another process from its ``/proc/<pid>/environ`` and credentials.
"""

from __future__ import annotations

import grp
import math
import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass

from burstctl.common.limits import (
    MAX_NODES,
    MAX_PRIORITY,
    MAX_TEXT,
    identifier_problem,
    period_problem,
)
from burstctl.common.units import parse_size

# What a controller accepts in a Hello (common/limits.py): a JobInfo that validates here
# is never refused there.
MAX_JOB_ID_LENGTH = MAX_TEXT

# The variables that name the job, first set wins (the FUSE shim looks for them too).
JOB_ID_VARS = ("BURSTCTL_JOB_ID", "SLURM_JOB_ID", "SLURM_JOBID")
_NODES_VARS = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
_PRIORITY_VAR = "BURSTCTL_PRIORITY"
# A periodic job's declared period (policy persched): compute seconds and bytes per iteration
PERIOD_W_VAR = "BURSTCTL_PERIOD_W"
PERIOD_VOL_VAR = "BURSTCTL_PERIOD_VOL"


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The unit of fairness: a job id, its owner, its size p_i (nodes) and its priority.

    A periodic job may declare its period ([PERSCHED]; policy ``persched``): ``w`` seconds of
    compute then ``vol_io`` bytes of I/O per iteration. Both or neither; None: not declared.
    """

    job_id: str
    user: str
    group: str
    nodes: int = 1
    priority: float = 1.0
    w: float | None = None
    vol_io: float | None = None

    def __post_init__(self) -> None:
        for name in ("job_id", "user", "group"):
            value = getattr(self, name)
            problem = identifier_problem(value)
            if problem:
                raise ValueError(f"{name} {problem}, got {value!r}")
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int):
            raise ValueError(f"nodes must be an integer, got {self.nodes!r}")
        if not 1 <= self.nodes <= MAX_NODES:
            raise ValueError(f"nodes must be between 1 and {MAX_NODES}, got {self.nodes}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int | float):
            raise ValueError(f"priority must be a number, got {self.priority!r}")
        if not math.isfinite(self.priority) or not 0 < self.priority <= MAX_PRIORITY:
            raise ValueError(
                f"priority must be finite, > 0 and <= {MAX_PRIORITY:g}, got {self.priority!r}"
            )
        object.__setattr__(self, "priority", float(self.priority))
        problem = period_problem(self.w, self.vol_io)
        if problem is not None:
            raise ValueError(f"{problem[0]} {problem[1]}")
        for name in ("w", "vol_io"):
            value = getattr(self, name)
            object.__setattr__(self, name, None if not value else float(value))

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        uid: int | None = None,
        gid: int | None = None,
    ) -> JobInfo:
        """Builds the identity of a process from its environment and credentials.

        The job id comes from ``BURSTCTL_JOB_ID``, ``SLURM_JOB_ID`` or ``SLURM_JOBID`` (first
        non-empty wins); without one the process belongs to its user's default job
        ``"user:<name>"``. Nodes come from ``SLURM_JOB_NUM_NODES`` or ``SLURM_NNODES``,
        priority from ``BURSTCTL_PRIORITY``, a declared period from ``BURSTCTL_PERIOD_W``
        (seconds) and ``BURSTCTL_PERIOD_VOL`` (bytes, units allowed: ``64MiB``).
        Defaults: this process's environment, euid, egid.
        """
        env = os.environ if environ is None else environ
        user = user_name(os.geteuid() if uid is None else uid)
        group = group_name(os.getegid() if gid is None else gid)
        job_var = _first_var(env, JOB_ID_VARS)
        if job_var is None:
            job_id = f"user:{user}"
        else:
            job_id = env[job_var].strip()
            if len(job_id) > MAX_JOB_ID_LENGTH:
                raise ValueError(f"{job_var} must be at most {MAX_JOB_ID_LENGTH} characters")
        nodes = 1
        nodes_var = _first_var(env, _NODES_VARS)
        if nodes_var is not None:
            nodes = _parse_nodes(nodes_var, env[nodes_var])
        priority = 1.0
        if env.get(_PRIORITY_VAR, "").strip():
            priority = _parse_priority(_PRIORITY_VAR, env[_PRIORITY_VAR])
        w = _parse_seconds(PERIOD_W_VAR, env[PERIOD_W_VAR]) if _set(env, PERIOD_W_VAR) else None
        vol_io = (
            _parse_bytes(PERIOD_VOL_VAR, env[PERIOD_VOL_VAR]) if _set(env, PERIOD_VOL_VAR) else None
        )
        try:
            return cls(
                job_id=job_id,
                user=user,
                group=group,
                nodes=nodes,
                priority=priority,
                w=w,
                vol_io=vol_io,
            )
        except ValueError as err:
            raise ValueError(f"job identity from the environment is invalid: {err}") from None


def user_name(uid: int) -> str:
    """The login name of ``uid``, or the number itself when it has no passwd entry."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    """The name of group ``gid``, or the number itself when it has no group entry."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _first_var(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if env.get(name, "").strip():
            return name
    return None


def _parse_nodes(name: str, text: str) -> int:
    try:
        nodes = int(text.strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer >= 1, got {text!r}") from None
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"{name} must be an integer in [1, {MAX_NODES}], got {text!r}")
    return nodes


def _parse_priority(name: str, text: str) -> float:
    try:
        priority = float(text.strip())
    except ValueError:
        raise ValueError(f"{name} must be a number > 0, got {text!r}") from None
    if not math.isfinite(priority) or priority <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {text!r}")
    return priority


def _set(env: Mapping[str, str], name: str) -> bool:
    return bool(env.get(name, "").strip())


def _parse_seconds(name: str, text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {text!r}")
    return value


def _parse_bytes(name: str, text: str) -> float:
    try:
        value = parse_size(text.strip())
    except ValueError as err:
        raise ValueError(f"{name} must be a size in bytes > 0 (e.g. 64MiB): {err}") from None
    if value <= 0:
        raise ValueError(f"{name} must be a size in bytes > 0, got {text!r}")
    return float(value)
