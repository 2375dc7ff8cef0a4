"""Who is calling: the job of a request (a FUSE request, or a process attaching to the node
agent), from the caller's pid, uid and gid.

A request carries the (thread) id, uid and gid of the process that made it (the kernel's
request context, or ``SO_PEERCRED`` on the agent's socket). The job comes from that process's
environment (``/proc/<pid>/environ``, read with psutil) through `JobInfo.from_env`:
``BURSTCTL_JOB_ID`` / ``SLURM_JOB_ID`` / ``SLURM_JOBID``, the node count and the priority; user
and group always come from the request's uid and gid. When the process names no job (or cannot
be read), its ancestors are asked, nearest first; when none does, the caller belongs to its
uid's default job ``user:<name>``.

Ownership is the controller's to decide, never the shim's by who came first
(docs/security.md): the shim vouches for the caller's uid (user and group always come from the
request's credentials) and opens a session for the job the caller names; a controller that
refuses it (``PERMISSION_DENIED``: the job is registered to another user, or another user's
unregistered job) makes the pacer call `Attributor.deny`, and from then on that uid's requests
naming that job go to its own default job. Naming another user's default job ``user:<name>``
gives the caller its own default job at once. Each redirection is logged once per (job, uid).

Results are cached per (pid, uid, gid) for ``ttl`` seconds, so a busy process costs one
dictionary lookup per request and a reused pid is looked at again soon.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psutil

from burstctl.client.job import JOB_ID_VARS, JobInfo, group_name, user_name

logger = logging.getLogger(__name__)

# How long a pid's job is cached (--attribution-ttl).
DEFAULT_ATTRIBUTION_TTL = 5.0
# How many ancestors are asked before the per-uid default job applies.
DEFAULT_MAX_ANCESTORS = 8
# Past this many cache entries, expired ones are swept out on the next miss.
_SWEEP_AT = 4096


@dataclass(frozen=True, slots=True)
class Caller:
    """The credentials of one request (pid 0: unknown, e.g. a kernel thread)."""

    pid: int
    uid: int
    gid: int


def read_process(pid: int) -> tuple[Mapping[str, str] | None, int | None]:
    """The environment and parent pid of ``pid`` (None for what cannot be read)."""
    try:
        proc = psutil.Process(pid)
    except (psutil.Error, OSError, ValueError):
        return None, None
    try:
        environ: Mapping[str, str] | None = proc.environ()
    except (psutil.Error, OSError):
        environ = None
    try:
        ppid: int | None = proc.ppid()
    except (psutil.Error, OSError):
        ppid = None
    return environ, ppid


def default_job(uid: int, gid: int) -> JobInfo:
    """The per-uid default job ``user:<name>`` of a caller that names no job."""
    user = user_name(uid)
    return JobInfo(job_id=f"user:{user}", user=user, group=group_name(gid))


class Attributor:
    """Maps a `Caller` to its `JobInfo`; thread-safe.

    ``read_process`` and ``clock`` are injectable for tests; by default the process is read
    through psutil and time is `time.monotonic`.
    """

    def __init__(
        self,
        ttl: float = DEFAULT_ATTRIBUTION_TTL,
        *,
        max_ancestors: int = DEFAULT_MAX_ANCESTORS,
        clock: Callable[[], float] = time.monotonic,
        read_process: Callable[[int], tuple[Mapping[str, str] | None, int | None]] = read_process,
    ) -> None:
        if not ttl >= 0:
            raise ValueError(f"ttl must be >= 0 seconds, got {ttl!r}")
        self._ttl = float(ttl)
        self._max_ancestors = max_ancestors
        self._clock = clock
        self._read_process = read_process
        self._lock = threading.Lock()
        self._cache: dict[Caller, tuple[float, JobInfo]] = {}
        self._denied: set[tuple[str, int]] = set()  # (job id, uid) the controller refused
        self._warned: set[tuple[str, int]] = set()
        self.lookups = 0  # cache misses that read /proc, for tests and logs

    def job_for(self, caller: Caller) -> JobInfo:
        """The job ``caller`` works for (see the module docstring for the rules)."""
        now = self._clock()
        with self._lock:
            hit = self._cache.get(caller)
            if hit is not None and hit[0] > now:
                return hit[1]
        job = self._resolve(caller)
        with self._lock:
            if len(self._cache) >= _SWEEP_AT:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            self._cache[caller] = (now + self._ttl, job)
        return job

    def deny(self, job_id: str, uid: int, reason: str = "") -> None:
        """The controller refused ``uid`` a session of ``job_id``: that uid's requests naming
        it go to its own default job from now on (cached answers are dropped)."""
        with self._lock:
            if (job_id, uid) in self._denied:
                return
            self._denied.add((job_id, uid))
            self._cache = {
                k: v for k, v in self._cache.items() if not (k.uid == uid and v[1].job_id == job_id)
            }
        logger.warning(
            "uid %d may not join job %r (%s); its I/O goes to its own default job",
            uid,
            job_id,
            reason or "refused by the controller",
        )

    def denied(self, job_id: str, uid: int) -> bool:
        """Whether the controller refused ``uid`` a session of ``job_id``."""
        with self._lock:
            return (job_id, uid) in self._denied

    def forget(self, pid: int | None = None) -> None:
        """Drops cached answers (of one pid, or all); refusals are kept."""
        with self._lock:
            if pid is None:
                self._cache.clear()
            else:
                self._cache = {k: v for k, v in self._cache.items() if k.pid != pid}

    # ------------------------------------------------------------------ resolution

    def _resolve(self, caller: Caller) -> JobInfo:
        self.lookups += 1
        own_default = default_job(caller.uid, caller.gid)
        claimed = self._claimed_job(caller)
        return own_default if claimed is None else self._check_allowed(caller, claimed, own_default)

    def _claimed_job(self, caller: Caller) -> JobInfo | None:
        """The job named by the caller's environment or its nearest ancestor's, if any."""
        pid: int | None = caller.pid
        seen: set[int] = set()
        for _ in range(self._max_ancestors + 1):
            if pid is None or pid <= 0 or pid in seen:
                return None
            seen.add(pid)
            environ, parent = self._read_process(pid)
            if environ is not None and any(environ.get(v, "").strip() for v in JOB_ID_VARS):
                try:
                    return JobInfo.from_env(environ, caller.uid, caller.gid)
                except ValueError as err:
                    logger.warning(
                        "pid %d (uid %d) has an invalid job identity, using its uid's default "
                        "job: %s",
                        pid,
                        caller.uid,
                        err,
                    )
                    return None
            pid = parent
        return None

    def _check_allowed(self, caller: Caller, claimed: JobInfo, own_default: JobInfo) -> JobInfo:
        """The claimed job unless it is another user's default job or the controller refused
        ``caller``'s uid a session of it."""
        job_id = claimed.job_id
        foreign_default = job_id.startswith("user:") and job_id != own_default.job_id
        with self._lock:
            if not foreign_default and (job_id, caller.uid) not in self._denied:
                return claimed
            key = (job_id, caller.uid)
            first = key not in self._warned
            self._warned.add(key)
        if first:
            logger.warning(
                "pid %d (uid %d) names job %r, which belongs to another user; "
                "attributing its I/O to %r",
                caller.pid,
                caller.uid,
                job_id,
                own_default.job_id,
            )
        return own_default
