"""Files replaced whole, and the one rule for the durable stores that keep them.

``write_atomically`` is how every such file is written (the controller's state, ledger and
application profiles, the simulator's campaign files). ``DurableFile`` is what a store of
the controller holds: atomic writes (its directory made on first use) and one rule for a
file it cannot use. A missing file is no state yet; one that cannot be read or parsed is
kept aside, renamed ``NAME.unreadable-<n>`` (the first ``n`` free), with a warning naming
both paths, and the store starts without it: nothing is overwritten and nothing stops a
start. ``save_changes`` and ``keep_saving`` write a store's snapshot off the event loop
when it changed (the ledger, the profiles).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# What a parser raises for a file that is not what it should be: bad JSON or text
# (ValueError, pydantic's ValidationError among them), a missing key, a wrong type.
_UNPARSABLE = (ValueError, KeyError, TypeError, AttributeError)


def write_atomically(path: Path, data: str) -> None:
    """Replaces ``path`` with ``data`` so that a crash leaves the old file or the new one,
    never half of one: a temporary file in the same directory, fsync, rename, fsync of the
    directory. On an error nothing changed (the temporary file is removed)."""
    directory = path.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", dir=directory)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def default_state_dir() -> Path:
    """Where burstctl keeps durable state unless told: ``$XDG_STATE_HOME/burstctl``
    (``~/.local/state/burstctl``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "burstctl"


class DurableFile:
    """One file of a store's durable state (module docstring); ``what`` names it in logs."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what

    def load(self, parse: Callable[[str], T]) -> T | None:
        """The file parsed; None when it is missing, or unreadable (then kept aside)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:  # ValueError: not UTF-8 text
            self._keep_aside(exc)
            return None
        try:
            return parse(text)
        except _UNPARSABLE as exc:
            self._keep_aside(exc)
            return None

    def save(self, text: str) -> None:
        """Replaces the file with ``text`` (`write_atomically`); OSError if it cannot, and
        then nothing changed."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, text)

    def _keep_aside(self, problem: Exception) -> None:
        n = 1
        while (kept := self.path.with_name(f"{self.path.name}.unreadable-{n}")).exists():
            n += 1
        try:
            os.rename(self.path, kept)
        except FileNotFoundError:
            return  # gone meanwhile: nothing to keep
        except OSError as exc:
            log.warning(
                "%s (%s) is unreadable (%s) and cannot be kept aside as %s (%s); "
                "starting without it",
                self.path,
                self.what,
                problem,
                kept,
                exc,
            )
            return
        log.warning(
            "%s (%s) is unreadable (%s); kept aside as %s, starting without it",
            self.path,
            self.what,
            problem,
            kept,
        )


class Saved(Protocol):
    """A store saved off the event loop when it changed: ``version`` moves with every
    change, ``saved_version`` is the version last written; ``snapshot`` runs on the loop
    and returns plain values, ``write`` runs in a worker thread."""

    @property
    def file(self) -> DurableFile | None: ...

    @property
    def version(self) -> int: ...

    saved_version: int

    def snapshot(self) -> Any: ...

    def write(self, snapshot: Any) -> None: ...


async def save_changes(store: Saved) -> None:
    """Saves ``store`` if it changed since its last save; a failure is logged (the next
    save tries again), never raised."""
    version = store.version
    if version == store.saved_version or store.file is None:
        return
    snapshot = store.snapshot()
    try:
        await asyncio.to_thread(store.write, snapshot)
    except OSError as exc:
        log.warning("cannot save %s to %s: %s", store.file.what, store.file.path, exc)
    else:
        store.saved_version = version


async def keep_saving(stores: Sequence[Saved], interval: float) -> None:
    """Saves each of ``stores`` that changed every ``interval`` seconds, until cancelled."""
    while True:
        await asyncio.sleep(interval)
        for store in stores:
            await save_changes(store)
