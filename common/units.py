"""Parsing and printing of byte rates such as ``"400MiB/s"`` and sizes such as ``"128KiB"``.

Shared by the controller configuration, the client fallback spec and the CLI.
Sizes are parsed by pydantic's ``ByteSize`` (``KB`` = 1000, ``KiB`` = 1024);
this module only adds the mandatory-or-optional ``/s`` suffix and the checks a
rate needs (finite, non-negative).
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BeforeValidator, ByteSize, PlainSerializer, TypeAdapter, ValidationError

_BYTE_SIZE = TypeAdapter(ByteSize)
_UNITS = ("B/s", "KiB/s", "MiB/s", "GiB/s", "KB/s", "MB/s", "GB/s")


def parse_rate(value: str | float | int) -> float:
    """Returns bytes per second from ``"40MiB/s"``, ``"1.5 GB/s"``, ``"1000"`` or a number."""
    if isinstance(value, bool):
        raise ValueError(f"not a rate: {value!r}")
    if isinstance(value, int | float):
        rate = float(value)
    else:
        text = value.strip()
        if text.lower().endswith("/s"):
            text = text[:-2].strip()
        try:
            rate = float(_BYTE_SIZE.validate_python(text))
        except ValidationError:
            raise ValueError(
                f"not a rate: {value!r} (use a number of bytes/s or units {', '.join(_UNITS)})"
            ) from None
    if not math.isfinite(rate) or rate < 0:
        raise ValueError(f"a rate must be finite and >= 0, got {value!r}")
    return rate


def parse_size(value: str | int) -> int:
    """Returns a whole number of bytes from ``"128KiB"``, ``"1MB"``, ``"4096"`` or an int."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        size = value
    else:
        try:
            size = int(_BYTE_SIZE.validate_python(value.strip()))
        except ValidationError:
            raise ValueError(
                f"not a size: {value!r} (use a number of bytes or units B, KiB, MiB, GiB, KB, MB)"
            ) from None
    if size < 0:
        raise ValueError(f"a size must be >= 0, got {value!r}")
    return size


def format_rate(rate: float) -> str:
    """Prints a rate with binary units, e.g. ``"40.00 MiB/s"``."""
    for unit, scale in (("GiB/s", 1 << 30), ("MiB/s", 1 << 20), ("KiB/s", 1 << 10)):
        if rate >= scale:
            return f"{rate / scale:.2f} {unit}"
    return f"{rate:.0f} B/s"


def _validate_rate(value: object) -> float:
    if isinstance(value, str | int | float):
        return parse_rate(value)
    raise ValueError(f"not a rate: {value!r}")


# A pydantic field type: accepts "400MiB/s" or a number, stores bytes/s as float.
Rate = Annotated[
    float, BeforeValidator(_validate_rate), PlainSerializer(format_rate, when_used="json")
]
