"""A job's client sessions on the node: what the pacer needs of one, and how one is made and
closed.

The pacer (`burstctl.node.pacer`) speaks for each job through client sessions
(`burstctl.client.Session`: one job's connection to one controller replica), all on the node's
one `ClientRuntime` (one loop thread, one channel per replica, however many jobs). A job has
its *app* session (its I/O through the shim; with the mount, the burst buffer's space and
gauges too) and, with the mount's stage-out, its *drain* session (the copy of its files to the
PFS). `JobSession` is the part of a client session the pacer calls, so that tests can pass
fakes; `client_session_factory` makes the real ones with the shim's options.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from burstctl.client.job import JobInfo
from burstctl.client.options import BucketObserver, RateObserver
from burstctl.client.runtime import ClientRuntime
from burstctl.client.session import Session
from burstctl.common.channels import ChannelSecurity

logger = logging.getLogger(__name__)


class JobSession(Protocol):
    """A job's client session as the pacer uses it: the part of `burstctl.client.Session` it
    calls (tests pass fakes). A session that tracks the burst buffer also has
    ``acquire_space``, ``space_landed`` and ``report_buffer``, which the pacer calls only
    where they exist."""

    def acquire(self, nbytes: int, kind: str = "write") -> None: ...

    def acquire_metadata(self) -> None: ...

    def record(self, nbytes: int, kind: str = "write", calls: int = 1) -> None: ...

    def hold_waiting(self, waiting: bool) -> None: ...

    def end_phase(self) -> None: ...

    def close_soon(self) -> concurrent.futures.Future[None]: ...

    def wait_attached(self, timeout: float | None = None) -> bool: ...

    @property
    def refused(self) -> str | None: ...


SessionFactory = Callable[[JobInfo], JobSession]


class PacingConfig(Protocol):
    """What a `Pacer` and its sessions are configured with: the mount's
    `burstctl.fuse_shim.config.MountConfig` and the node agent's
    `burstctl.preload_shim.config.AgentConfig`."""

    @property
    def controller(self) -> str | None: ...

    @property
    def fallback(self) -> str: ...

    @property
    def quiet_gap(self) -> float: ...

    @property
    def session_idle(self) -> float: ...

    @property
    def attach_timeout(self) -> float: ...

    @property
    def fallback_grace(self) -> float: ...

    @property
    def metadata_cost(self) -> int: ...

    @property
    def stage_out(self) -> Path | None: ...

    def channel_security(self) -> ChannelSecurity: ...


def client_session_factory(
    config: PacingConfig,
    runtime: ClientRuntime,
    purpose: str = "app",
    *,
    buffer: bool | None = None,
    observer_for: Callable[[JobInfo], BucketObserver] | None = None,
    metadata_observer_for: Callable[[JobInfo], RateObserver] | None = None,
) -> SessionFactory:
    """Client sessions, one per job, with the shim's options, on ``runtime``.

    ``purpose``: ``app`` for the jobs' I/O through the shim (sessions that track the burst
    buffer: ``buffer=True`` unless ``buffer`` says otherwise), ``drain`` for the stage-out's
    copies to the PFS. ``observer_for``: each job's session gets ``observer_for(job)`` as its
    bucket observer (the node agent publishes the job's allocations to its page), and
    ``metadata_observer_for(job)`` as its metadata rate observer (the same page's metadata
    supply).
    """
    if not config.controller:
        raise ValueError("pacing needs a controller")
    controller = config.controller
    security = config.channel_security()
    drain = purpose == "drain"
    tracks_buffer = not drain if buffer is None else buffer and not drain

    def make(job: JobInfo) -> JobSession:
        return Session(
            controller,
            job,
            config.fallback,
            quiet_gap=config.quiet_gap,
            attach_timeout=config.attach_timeout,
            fallback_grace=config.fallback_grace,
            runtime=runtime,
            security=security,
            purpose="drain" if drain else "app",
            buffer=tracks_buffer,
            bucket_observer=None if observer_for is None else observer_for(job),
            metadata_observer=(
                None if metadata_observer_for is None else metadata_observer_for(job)
            ),
        )

    return make


def report_gauges(session: JobSession, buffer: tuple[int, int, str]) -> None:
    """Gives a session the job's buffer gauges (resident, pending, drain error), if its client
    tracks the buffer. Never raises."""
    report = getattr(session, "report_buffer", None)
    if report is None:
        return
    resident, pending, error = buffer
    try:
        report(resident, pending, drain_error=error)
    except RuntimeError:
        pass  # closed under us
    except Exception:
        logger.exception("reporting the buffer failed")


def close_session(job: JobInfo, session: JobSession, why: str) -> concurrent.futures.Future[None]:
    """Completes the job's phase and starts closing its session; logs when it is closed."""

    def closed(future: concurrent.futures.Future[None]) -> None:
        if future.cancelled() or future.exception() is not None:
            logger.error(
                "job %s: closing its session failed", job.job_id, exc_info=future.exception()
            )
        else:
            logger.info("job %s: session closed (%s)", job.job_id, why)

    try:
        session.end_phase()
        future = session.close_soon()
    except Exception as err:
        logger.exception("job %s: closing its session failed", job.job_id)
        future = concurrent.futures.Future()
        future.set_exception(err)
        return future
    future.add_done_callback(closed)
    return future
