"""One job's space on the burst buffer, carried between its session and its pacing page.

The library claims space on the page (`page.JobPage.space`: ``claimed``, ``landed``, ``want``)
and waits while its claims would pass the page's ``limit``; the job's client session holds the
controller's grant (`burstctl.client.space.SpaceGate`: ``limit``, ``added``, and the waiting,
the attach wait, the fallback grace, the close, all as for the mount's writes). `PageSpace`
joins the two, one step at a time on its own thread (`SpaceFeeder`), so that a step that waits
for the controller's grant holds up no other job:

- while the job's processes write, it acquires on the session (``acquire_space(n,
  landed=False)``) the space the session was granted and has not handed out (its ``limit −
  added``; not while they do not: another writer of the job, a restore, may need it), and,
  when a process waits for more
  (``want`` above the page's limit), that much more — a wait in the session's own gate, which
  tells the controller the job waits; then it raises the page's limit by what it acquired.
  With no capacity at the controller (no limit once attached) the page is unlimited;
- it forwards the page's ``landed`` bytes to the session (``space_landed``) only after the
  job's resident bytes were measured (``measure``), ``landed`` having been read first: a
  report never pairs an ``added`` with a ``resident`` that misses some of its bytes
  (docs/capacity.md, "Bytes in flight");
- a new session of the job (the idle sweep closed the last, or it was never opened) starts
  from the page's current claims: what was claimed under the old one is not landed on the new
  one, and the page gets no space until the new one grants it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from burstctl.preload_shim.page import SPACE_UNLIMITED, JobPage, Space

logger = logging.getLogger(__name__)


class PageSpace:
    """The page's share of one job session's space grant (one step at a time)."""

    def __init__(self, page: JobPage) -> None:
        self._page = page
        self._session: Any = None
        self._base = 0  # the page's claims when `_session` began to feed it
        self._granted = 0  # bytes acquired on `_session` for the page
        self._forwarded = 0  # the page's landed bytes forwarded to `_session`
        self._seen = 0  # the page's claims at the last step
        page.set_space_limit(page.space().claimed)  # nothing until a session grants it

    def step(self, session: Any, measure: Callable[[], None]) -> None:
        """Feeds the page from ``session`` (the job's open session, or None)."""
        page = self._page
        space = page.space()  # landed first
        if session is not self._session:
            self._session = session
            self._base, self._granted = space.claimed, 0
            self._forwarded = space.claimed
            page.set_space_limit(space.claimed)
        if session is None or getattr(session, "acquire_space", None) is None:
            return
        limit = session.space_limit
        if limit is None and session.wait_attached(0):
            # No capacity at the controller: nothing waits; the claims still go on the
            # session's books (its ``added``), which never waits then.
            page.set_space_limit(SPACE_UNLIMITED)
            self._acquire(session, space.claimed - (self._base + self._granted))
        else:
            # Only while the job's processes write (they claimed since the last step, or one
            # waits): a grant the page took while they do not would sit unused in the page,
            # out of reach of the job's other writers (a restore) until the session ends.
            writing = space.claimed > self._seen or space.want > space.limit
            if limit is not None and writing:
                self._acquire(session, limit - session.buffer_added)  # never waits
                page.set_space_limit(self._base + self._granted)  # the page's at once
            need = space.want - (self._base + self._granted)
            if need > 0:
                # What landed goes to the books before the wait: the controller grants more
                # only once it sees the bytes it granted are on the buffer (their space freed
                # by the drain), and a wait that held them back would wait for ever.
                self._forward(session, page.space(), measure)
                self._acquire(session, need)  # waits in the session's gate
            if session.closed:
                return  # closed under us: it let everything through; the next step resets
            page.set_space_limit(self._base + self._granted)
        self._seen = space.claimed
        self._forward(session, space, measure)

    def _forward(self, session: Any, space: Space, measure: Callable[[], None]) -> None:
        """The page's landed bytes (``space``: read before) to the session, after the job's
        resident bytes were measured again."""
        measure()
        landed = space.landed - self._forwarded
        if landed > 0:
            session.space_landed(landed)
            self._forwarded = space.landed

    def _acquire(self, session: Any, nbytes: int) -> None:
        """Takes ``nbytes`` of the session's space for the page (waits in its gate)."""
        if nbytes > 0:
            session.acquire_space(nbytes, landed=False)
            self._granted += nbytes


class SpaceFeeder:
    """A thread that steps one page's `PageSpace` at every `poke` (the agent's tick, a
    waiter's eventfd), until `stop`. ``session_of()``: the job's open session, or None;
    ``measure()``: re-measures the job's resident bytes."""

    def __init__(
        self,
        page: JobPage,
        name: str,
        session_of: Callable[[], Any],
        measure: Callable[[], None],
    ) -> None:
        self._space = PageSpace(page)
        self._session_of = session_of
        self._measure = measure
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def poke(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Ends the thread after its step in progress (which a closed session lets go)."""
        self._stopping = True
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                self._space.step(self._session_of(), self._measure)
            except Exception:  # never let the feed die: the job's writes would wait for ever
                logger.exception("feeding a page's space failed")
