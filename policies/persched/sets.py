"""Set files: a platform and its applications, as JSON, strictly validated.

    {"B": GB/s, "b": GB/s per core,
     "apps": [{"name": str, "w": s, "vol_io": GB, "beta": cores}, ...]}

The order of ``apps`` matters: it breaks ties in PERSCHED's insertion order
([PERSCHED-SIM] ``insertInSchedule``: the lowest index wins). Every problem is a
:class:`SetFileError` whose message names the field (``apps[2].beta: must be > 0,
got 0``) or the JSON line and column; nothing is returned from half a file.

The ten Jupiter sets of [PERSCHED] Table 2 ship as ``sets/set01.json`` …
``set10.json``: the Intrepid profiles of Table 1 scaled to Jupiter (w ×64, β /64,
b = 0.01 GB/s per core, B = 3 GB/s, [PERSCHED] §4.2), in the application order of
[PERSCHED-SIM] ``src/sets/setN``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from burstctl.policies.persched.model import App, Platform

JUPITER_SETS = range(1, 11)

# The T_min [PERSCHED-SIM] README.md gives for reproducing the paper's sets 1–10
# (rounded up from max_k(w + time_io); set 1 about twice that).
JUPITER_TMIN: dict[int, float] = {
    1: 900.0,
    2: 16000.0,
    3: 16000.0,
    4: 16000.0,
    5: 495000.0,
    6: 16000.0,
    7: 4544.0,
    8: 495000.0,
    9: 16000.0,
    10: 16000.0,
}

_TOP_KEYS = ("B", "b", "apps")
_APP_KEYS = ("name", "w", "vol_io", "beta")


class SetFileError(ValueError):
    """A malformed set file; the message is one line naming the field or position."""


@dataclass(frozen=True, slots=True)
class AppSet:
    platform: Platform
    apps: tuple[App, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "B": self.platform.B,
            "b": self.platform.b,
            "apps": [
                {"name": a.name, "w": a.w, "vol_io": a.vol_io, "beta": a.beta} for a in self.apps
            ],
        }


def parse_set(text: str) -> AppSet:
    """Parse and validate the text of a set file."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SetFileError(
            f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    if not isinstance(data, dict):
        raise SetFileError(f"top level: must be an object, got {_kind(data)}")
    _keys(data, _TOP_KEYS, "")
    B = _positive(data, "B", "")
    b = _positive(data, "b", "")
    raw = data["apps"]
    if not isinstance(raw, list):
        raise SetFileError(f"apps: must be a list, got {_kind(raw)}")
    if not raw:
        raise SetFileError("apps: must not be empty")
    apps: list[App] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        where = f"apps[{i}]"
        if not isinstance(item, dict):
            raise SetFileError(f"{where}: must be an object, got {_kind(item)}")
        _keys(item, _APP_KEYS, where + ".")
        name = item["name"]
        if not isinstance(name, str) or not name:
            raise SetFileError(f"{where}.name: must be a non-empty string, got {name!r}")
        if name in names:
            raise SetFileError(f"{where}.name: duplicate name {name!r}")
        names.add(name)
        apps.append(
            App(
                name,
                _positive(item, "w", where + "."),
                _positive(item, "vol_io", where + "."),
                _positive(item, "beta", where + "."),
            )
        )
    return AppSet(Platform(B, b), tuple(apps))


def load_set_file(path: str | Path) -> AppSet:
    """Read and validate a set file; an unreadable file is a :class:`SetFileError` too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SetFileError(f"cannot read: {exc}") from None
    return parse_set(text)


def jupiter_set(number: int) -> AppSet:
    """The shipped Jupiter set ``number`` (1–10) of [PERSCHED] Table 2."""
    if number not in JUPITER_SETS:
        raise SetFileError(f"set: must be 1 to 10, got {number}")
    ref = resources.files("burstctl.policies.persched") / "sets" / f"set{number:02d}.json"
    return parse_set(ref.read_text(encoding="utf-8"))


def _keys(data: dict[str, Any], expected: tuple[str, ...], prefix: str) -> None:
    for key in data:
        if key not in expected:
            raise SetFileError(f"{prefix}{key}: unknown key (expected {', '.join(expected)})")
    for key in expected:
        if key not in data:
            raise SetFileError(f"{prefix}{key}: missing")


def _positive(data: dict[str, Any], key: str, prefix: str) -> float:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SetFileError(f"{prefix}{key}: must be a number, got {_kind(value)}")
    if not math.isfinite(value) or value <= 0:
        raise SetFileError(f"{prefix}{key}: must be > 0, got {value}")
    return float(value)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"a string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return repr(value)
