"""The columns the simulator's run lends its views (``SystemView.of_columns``): the
per-application lists of ``fluid.Run`` read in place, plus two derived columns.

Kept apart from the event loop: ``fluid`` is compiled (setup.py), and these subclass
interpreted classes (``Columns``, ``Sequence``), which a compiled module cannot.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from burstctl.policies.view import Columns, JobView


class Moved(Sequence[float]):
    """The views' ``moved`` column: V − Q of the I/O phase under way, by application."""

    __slots__ = ("_remaining", "_volume")

    def __init__(self, volume: list[float], remaining: list[float]) -> None:
        self._volume = volume
        self._remaining = remaining

    def __getitem__(self, i: int) -> float:  # type: ignore[override]
        return self._volume[i] - self._remaining[i]

    def __len__(self) -> int:
        return len(self._volume)


class SimColumns(Columns):
    """The run's columns; ``job(row)`` keeps the ``JobView`` it builds until the row
    moves (served, or back in I/O: the loop empties ``views[row]``), so that a policy
    that reads rows as objects builds one per change, not one per decision."""

    __slots__ = ("used", "views")

    def __init__(self, **columns: Sequence[Any]) -> None:
        super().__init__(**columns)
        self.views: list[JobView | None] = [None] * len(columns["index"])
        self.used = False  # a JobView was built: the loop empties the served rows' views

    def job(self, row: int) -> JobView:
        view = self.views[row]
        if view is None:
            view = self.views[row] = super().job(row)
            self.used = True
        return view


class MeanVolume(Sequence[float]):
    """The views' ``mean_volume`` column: the mean volume of the completed I/O phases
    (phases alternate from each application's first), from the running sums of the
    application's I/O volumes in order, made on first read."""

    __slots__ = ("_first_io", "_phase", "_sums", "_values")

    def __init__(self, values: list[list[float]], phase: list[int], first_io: list[bool]) -> None:
        self._values = values
        self._phase = phase
        self._first_io = first_io
        self._sums: list[list[float] | None] = [None] * len(values)

    def __getitem__(self, i: int) -> float:  # type: ignore[override]
        k = self._phase[i]
        count = (k + 1 if self._first_io[i] else k) // 2  # I/O phases before phase k
        if not count:
            return 0.0
        sums = self._sums[i]
        if sums is None:  # Σ of the first n I/O volumes, added in order, at [n − 1]
            io = self._values[i][0 if self._first_io[i] else 1 :: 2]
            sums = self._sums[i] = list(accumulate(io))
        return sums[count - 1] / count

    def __len__(self) -> int:
        return len(self._values)
