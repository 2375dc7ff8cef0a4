"""Which addresses a session opens its streams on (placement advice, docs/client.md)."""

from __future__ import annotations

import pytest

from burstctl.client.options import resolve_targets
from burstctl.client.session import _shares


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("BURSTCTL_CONTROLLERS", "BURSTCTL_FOLLOW_ADVICE", "BURSTCTL_REPLICAS"):
        monkeypatch.delenv(var, raising=False)


def test_without_advice_the_first_controller() -> None:
    assert resolve_targets("a:1", None, None) == ["a:1"]
    assert resolve_targets(["a:1", "b:2"], None, False) == ["a:1"]


def test_controllers_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BURSTCTL_CONTROLLERS", " b:2, a:1 ,")
    assert resolve_targets(None, None, None) == ["b:2"]
    with pytest.raises(ValueError, match="BURSTCTL_CONTROLLERS"):
        monkeypatch.delenv("BURSTCTL_CONTROLLERS")
        resolve_targets(None, None, None)


def test_advice_from_the_argument_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_targets("a:1", ["r2:2", "r3:3", "r2:2"], None) == ["r2:2", "r3:3"]
    monkeypatch.setenv("BURSTCTL_REPLICAS", "r3:3,r1:1")
    assert resolve_targets("a:1", None, None) == ["a:1"]  # written, not followed
    assert resolve_targets("a:1", None, True) == ["r3:3", "r1:1"]
    monkeypatch.setenv("BURSTCTL_FOLLOW_ADVICE", "1")
    assert resolve_targets("a:1", None, None) == ["r3:3", "r1:1"]
    assert resolve_targets("a:1", None, False) == ["a:1"]
    monkeypatch.setenv("BURSTCTL_REPLICAS", "")
    assert resolve_targets("a:1", None, None) == ["a:1"]  # no advice: the controller


def test_bad_addresses_are_refused() -> None:
    with pytest.raises(ValueError, match="replicas"):
        resolve_targets("a:1", [3], True)  # type: ignore[list-item]


def test_acquires_split_evenly() -> None:
    assert _shares(10, 3) == [4, 3, 3]
    assert _shares(2, 3) == [1, 1, 0]
    assert sum(_shares(1 << 20, 7)) == 1 << 20
