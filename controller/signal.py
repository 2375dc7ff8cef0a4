"""``Signal``: how a part of a replica tells the others that something changed.

The part that owns a state holds the signal; each part that must act on a
change connects itself when it is built (the scheduler to the job table and the
policy slot, the peer exchange to both). Listeners are called in the order they
connected, synchronously, on the replica's event loop.
"""

from __future__ import annotations

from collections.abc import Callable


class Signal:
    __slots__ = ("_listeners",)

    def __init__(self) -> None:
        self._listeners: list[Callable[[], None]] = []

    def connect(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def __call__(self) -> None:
        for listener in self._listeners:
            listener()
