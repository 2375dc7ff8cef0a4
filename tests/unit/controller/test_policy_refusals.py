"""A peer's policy is a registry name too (issue 15, finding 2): a digest naming an import
path or parameters out of range is refused at the door (``Membership``), and
``PolicySlot.adopt`` refuses it too, changing nothing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from digests import digest

from burstctl.controller.membership import Membership, Status
from burstctl.controller.state import PolicySlot, StateStore
from burstctl.policies.registry import PolicyParamsError, UnknownPolicyError, default_registry

REGISTRY = default_registry()

NOT_NAMES = ["burstctl.policies.base:Policy", "burstctl.policies.fcfs:Fcfs", "this:x", "..:x", ":x"]
OUT_OF_RANGE: list[tuple[str, dict[str, Any]]] = [
    ("periodic-greedy-yield", {"delta": 1e-300}),
    ("periodic-greedy-yield", {"delta": 1e12}),
    ("set-10", {"known_omega": {"a": 1e-300}}),
]


@pytest.mark.parametrize(("name", "params"), [*((n, {}) for n in NOT_NAMES), *OUT_OF_RANGE])
def test_a_digest_whose_policy_is_no_registry_policy_is_rejected(
    name: str, params: dict[str, Any]
) -> None:
    had_this = "this" in sys.modules
    m = Membership("R1", registry=REGISTRY)
    out = m.receive(digest("R2", policy=name, policy_params=params, policy_version=99), 0.0)
    assert out.status is Status.REJECTED and out.field == "policy"
    assert m.live_peers() == []
    assert m.elected(digest("R1")).replica_id == "R1"  # it never wins the election
    assert ("this" in sys.modules) == had_this


@pytest.mark.parametrize(
    ("name", "params", "error"),
    [
        *((n, {}, UnknownPolicyError) for n in NOT_NAMES),
        *((n, p, PolicyParamsError) for n, p in OUT_OF_RANGE),
    ],
)
def test_adopt_refuses_what_the_registry_cannot_build_and_changes_nothing(
    tmp_path: Path, name: str, params: dict[str, Any], error: type[Exception]
) -> None:
    had_this = "this" in sys.modules
    slot = PolicySlot(REGISTRY, StateStore(tmp_path), ("fair-share", {}), replica_id="r1")
    calls: list[int] = []
    slot.changed.connect(lambda: calls.append(1))
    with pytest.raises(error):
        slot.adopt(name, params, 9, "r2")
    assert (slot.name, slot.version, slot.origin, calls) == ("fair-share", 0, "r1", [])
    assert not (tmp_path / "state.json").exists()
    assert ("this" in sys.modules) == had_this
    # the refused version was not taken for one a peer uses: the next switch is 1
    assert slot.switch("fcfs").version == 1
