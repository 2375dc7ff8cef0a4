"""``Signal``: how a part of a replica tells the others that something changed.

The part that owns a state holds the signal; each part that must act on a
change connects itself when it is built (the scheduler to the job table and the
policy slot, the peer exchange to both, the ledger to the table's new jobs).
Listeners are called in the order they connected, synchronously, on the
replica's event loop, with the signal's arguments (``Signal[[JobState]]`` passes
the job; ``Signal[[]]`` nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, ParamSpec

P = ParamSpec("P")


class Signal(Generic[P]):
    __slots__ = ("_listeners",)

    def __init__(self) -> None:
        self._listeners: list[Callable[P, None]] = []

    def connect(self, listener: Callable[P, None]) -> None:
        self._listeners.append(listener)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for listener in self._listeners:
            listener(*args, **kwargs)
