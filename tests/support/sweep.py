"""Seed sweeps sized by what they prove: the first seeds in ``make test``, the rest behind
the ``sweep`` marker (``make test-all``, ``bench/sweeps.py``)."""

from __future__ import annotations

from typing import Any

import pytest


def seeds(quick: int, total: int) -> list[Any]:
    """``range(total)`` as pytest parameters, those from ``quick`` on marked ``sweep``."""
    return [*range(quick), *(pytest.param(s, marks=pytest.mark.sweep) for s in range(quick, total))]
