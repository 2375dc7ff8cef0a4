"""A periodic pattern as data ([PERSCHED] §2, "periodic pattern notation").

A pattern has a period ``T``; per application, its instances in one period, each
with the start of its compute phase and the I/O sub-intervals ``(start, end, rate)``
that move its ``vol_io`` at ``rate`` GB/s. An instance computes on
``[compute_start, compute_start + w)`` and transfers in sub-intervals that lie in
``[compute_start + w, next compute_start)`` (cyclically). Sub-interval times are
given unwrapped from the instance's compute start, so they may exceed ``T``: the
instant ``t`` of the pattern is ``t mod T``.

JSON shape::

    {"period": T, "apps": [{"name", "w", "vol_io", "beta",
                            "instances": [{"compute_start": s,
                                           "io": [[start, end, rate_GBps], ...]}, ...]}, ...]}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from burstctl.policies.persched.model import App, Platform
from burstctl.policies.persched.model import dilation as _dilation
from burstctl.policies.persched.model import sys_eff as _sys_eff

Interval = tuple[float, float, float]  # (start, end, rate in GB/s)


@dataclass(frozen=True, slots=True)
class Instance:
    compute_start: float
    io: tuple[Interval, ...]

    def volume(self) -> float:
        return sum((end - start) * rate for start, end, rate in self.io)


@dataclass(frozen=True, slots=True)
class AppPattern:
    app: App
    instances: tuple[Instance, ...] = field(default_factory=tuple)

    @property
    def n_per(self) -> int:
        return len(self.instances)


@dataclass(frozen=True, slots=True)
class Pattern:
    period: float
    apps: tuple[AppPattern, ...]

    def counts(self) -> list[int]:
        return [entry.n_per for entry in self.apps]

    def app_list(self) -> list[App]:
        return [entry.app for entry in self.apps]

    def sys_eff(self, platform: Platform) -> float:
        return _sys_eff(self.app_list(), self.counts(), self.period, platform)

    def dilation(self, platform: Platform) -> float:
        return _dilation(self.app_list(), self.counts(), self.period, platform)

    def to_json(self) -> dict[str, Any]:
        return {
            "period": self.period,
            "apps": [
                {
                    "name": entry.app.name,
                    "w": entry.app.w,
                    "vol_io": entry.app.vol_io,
                    "beta": entry.app.beta,
                    "instances": [
                        {
                            "compute_start": inst.compute_start,
                            "io": [[start, end, rate] for start, end, rate in inst.io],
                        }
                        for inst in entry.instances
                    ],
                }
                for entry in self.apps
            ],
        }

    @classmethod
    def from_json(cls, data: Any) -> Pattern:
        """The inverse of :meth:`to_json`; a ``ValueError`` names the first bad field."""
        if not isinstance(data, dict):
            raise ValueError("pattern: must be an object")
        period = _number(data, "period", "pattern")
        if period <= 0:
            raise ValueError(f"period: must be > 0, got {period}")
        apps = data.get("apps")
        if not isinstance(apps, list):
            raise ValueError("apps: must be a list")
        entries = []
        for i, item in enumerate(apps):
            where = f"apps[{i}]"
            if not isinstance(item, dict):
                raise ValueError(f"{where}: must be an object")
            name = item.get("name")
            if not isinstance(name, str):
                raise ValueError(f"{where}.name: must be a string")
            app = App(
                name,
                _number(item, "w", where),
                _number(item, "vol_io", where),
                _number(item, "beta", where),
            )
            raw = item.get("instances")
            if not isinstance(raw, list):
                raise ValueError(f"{where}.instances: must be a list")
            instances = []
            for j, inst in enumerate(raw):
                iwhere = f"{where}.instances[{j}]"
                if not isinstance(inst, dict):
                    raise ValueError(f"{iwhere}: must be an object")
                start = _number(inst, "compute_start", iwhere)
                io = inst.get("io")
                if not isinstance(io, list):
                    raise ValueError(f"{iwhere}.io: must be a list")
                intervals: list[Interval] = []
                for m, triple in enumerate(io):
                    if (
                        not isinstance(triple, list)
                        or len(triple) != 3
                        or not all(_is_number(x) for x in triple)
                    ):
                        raise ValueError(f"{iwhere}.io[{m}]: must be [start, end, rate]")
                    intervals.append((float(triple[0]), float(triple[1]), float(triple[2])))
                instances.append(Instance(start, tuple(intervals)))
            entries.append(AppPattern(app, tuple(instances)))
        return cls(period, tuple(entries))


def empty_pattern(period: float, apps: Sequence[App]) -> Pattern:
    return Pattern(period, tuple(AppPattern(app) for app in apps))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(data: dict[str, Any], key: str, where: str) -> float:
    value = data.get(key)
    if not _is_number(value):
        raise ValueError(f"{where}.{key}: must be a number, got {value!r}")
    return float(value)  # type: ignore[arg-type]
