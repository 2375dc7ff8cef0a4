"""``controller.state``: the state file and the one owner of the active policy."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from burstctl.controller.state import PolicySlot, ReplicaState, StateStore
from burstctl.policies.io_sets import Set10
from burstctl.policies.registry import PolicyParamsError, UnknownPolicyError, default_registry

REGISTRY = default_registry()


def slot_in(path: Path, policy: str = "fair-share", replica_id: str = "r1") -> PolicySlot:
    return PolicySlot(REGISTRY, StateStore(path), (policy, {}), replica_id=replica_id)


def counting(slot: PolicySlot) -> list[int]:
    calls: list[int] = []
    slot.changed.connect(lambda: calls.append(1))
    return calls


def test_a_switch_is_validated_persisted_applied_and_announced(tmp_path: Path) -> None:
    slot = slot_in(tmp_path)
    calls = counting(slot)
    active = slot.switch("periodic-greedy-yield", {"delta": 2.0})
    assert (active.name, active.params, active.version, active.replica_id) == (
        "periodic-greedy-yield",
        {"delta": 2.0},
        1,
        "r1",
    )
    assert slot.policy.period(None) == 2.0  # type: ignore[arg-type]
    assert calls == [1] and slot.switches == 1
    saved = json.loads((tmp_path / "state.json").read_text())
    assert saved["policy"] == {
        "name": "periodic-greedy-yield",
        "params": {"delta": 2.0},
        "version": 1,
        "origin": "r1",
    }
    assert saved["configured"] == {"name": "fair-share", "params": {}}
    for bad, error in (("nope", UnknownPolicyError), ("fcfs", PolicyParamsError)):
        with pytest.raises(error):
            slot.switch(bad, {"x": 1} if bad == "fcfs" else None)
    assert (slot.name, slot.version, calls) == ("periodic-greedy-yield", 1, [1])


def test_a_switch_that_cannot_be_persisted_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")  # the state directory cannot be made under a file
    slot = PolicySlot(
        REGISTRY, StateStore(tmp_path / "file" / "state"), ("fair-share", {}), replica_id="r1"
    )
    calls = counting(slot)
    with pytest.raises(OSError):
        slot.switch("greedy-yield")
    assert (slot.name, slot.version, slot.switches, calls) == ("fair-share", 0, 0, [])
    with pytest.raises(OSError):
        slot.adopt("fcfs", {}, 3, "r9")
    assert (slot.name, slot.version, calls) == ("fair-share", 0, [])


def test_the_state_store_keeps_the_old_file_when_a_write_fails(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.update(configured={"name": "fcfs", "params": {}})
    before = (tmp_path / "state.json").read_text()
    with pytest.raises(ValueError):
        store.update(jobs=[object()])  # not a job: refused before anything is written
    assert (tmp_path / "state.json").read_text() == before
    assert store.state.jobs == [] and list(tmp_path.iterdir()) == [tmp_path / "state.json"]


def test_a_peers_newer_version_is_adopted_an_older_one_ignored(tmp_path: Path) -> None:
    slot = slot_in(tmp_path, replica_id="r1")
    calls = counting(slot)
    assert not slot.adopt("fcfs", {}, 0, "r0")  # same version, lower id: ours wins
    assert slot.name == "fair-share" and calls == []
    assert slot.adopt("fcfs", {}, 0, "r2")  # same version, higher id: theirs wins
    assert (slot.name, slot.version, calls) == ("fcfs", 0, [1])
    assert not slot.adopt("fcfs", {}, 0, "r2")  # the same again: nothing new, no signal
    assert not slot.adopt("fcfs", {}, 0, "r3")  # same policy, same version: nothing to do
    assert calls == [1]
    assert slot.adopt("greedy-yield", {}, 3, "r0")
    assert (slot.name, slot.version) == ("greedy-yield", 3)
    assert not slot.adopt("fcfs", {}, 2, "r9")  # older
    # an operator's switch goes above every version seen, also from peers not adopted
    slot.adopt("greedy-yield", {}, 7, "r0")
    assert slot.switch("fcfs").version == 8


def test_the_one_instance_keeps_its_state_across_version_bumps(tmp_path: Path) -> None:
    slot = slot_in(tmp_path, "set-10", replica_id="r1")
    policy = slot.policy
    assert isinstance(policy, Set10)
    slot.adopt("set-10", {}, 4, "r0")  # only the version moves: the same live instance
    assert slot.policy is policy and slot.version == 4


def test_restart_with_the_same_configuration_keeps_the_switch(tmp_path: Path) -> None:
    first = slot_in(tmp_path)
    first.switch("fcfs")
    again = slot_in(tmp_path)
    again.resume(StateStore(tmp_path).load())
    assert (again.name, again.version, again.switches) == ("fcfs", 1, 0)


def test_an_edited_configured_policy_wins_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    slot_in(tmp_path).switch("fcfs")
    edited = slot_in(tmp_path, "greedy-yield")
    calls = counting(edited)
    with caplog.at_level(logging.WARNING):
        edited.resume(StateStore(tmp_path).load())
    assert (edited.name, edited.version) == ("greedy-yield", 2)  # above the saved version
    assert "configured policy changed from fair-share" in caplog.text
    assert "greedy-yield" in caplog.text and "fcfs" in caplog.text
    assert calls == [1]
    saved = ReplicaState.model_validate_json((tmp_path / "state.json").read_text())
    assert saved.policy is not None and saved.policy.name == "greedy-yield"
    assert saved.configured is not None and saved.configured.name == "greedy-yield"
    # and the next restart with the edited configuration keeps it, silently
    caplog.clear()
    later = slot_in(tmp_path, "greedy-yield")
    later.resume(StateStore(tmp_path).load())
    assert (later.name, later.version) == ("greedy-yield", 2)
    assert "configured policy changed" not in caplog.text


def test_state_saved_by_an_older_burstctl_resumes_its_policy(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(
        json.dumps({"policy": {"name": "fcfs", "params": {}, "version": 5}, "jobs": []})
    )
    slot = slot_in(tmp_path, "greedy-yield")
    slot.resume(StateStore(tmp_path).load())
    assert (slot.name, slot.version) == ("fcfs", 5)


def test_an_unusable_saved_policy_keeps_the_configured_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "state.json").write_text(
        json.dumps(
            {
                "policy": {"name": "gone-policy", "params": {}, "version": 5},
                "configured": {"name": "fair-share", "params": {}},
            }
        )
    )
    slot = slot_in(tmp_path)
    slot.resume(StateStore(tmp_path).load())
    assert (slot.name, slot.version) == ("fair-share", 0)
    assert "saved policy 'gone-policy' is unusable" in caplog.text


def test_a_bad_configured_policy_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(UnknownPolicyError):
        slot_in(tmp_path, "no-such-policy")


def test_the_origin_of_a_version_decides_ties_and_survives_a_restart(tmp_path: Path) -> None:
    slot = slot_in(tmp_path, replica_id="r1")
    assert slot.adopt("job-fair", {}, 4, "r3")
    assert slot.active().origin == "r3"
    assert not slot.adopt("user-fair", {}, 4, "r2")  # (4, r2) < (4, r3): r3's is elected
    assert slot.name == "job-fair"
    again = slot_in(tmp_path, replica_id="r1")
    again.resume(StateStore(tmp_path).load())
    assert (again.name, again.version, again.origin) == ("job-fair", 4, "r3")
    assert not again.adopt("user-fair", {}, 4, "r2")


def test_an_unreadable_state_file_is_kept_aside_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{not json")
    (tmp_path / "state.json.unreadable-1").write_text("an older one")
    store = StateStore(tmp_path)
    assert store.load() == ReplicaState()  # started without it
    assert (tmp_path / "state.json.unreadable-2").read_text() == "{not json"
    assert (tmp_path / "state.json.unreadable-1").read_text() == "an older one"
    assert not (tmp_path / "state.json").exists()
    slot = PolicySlot(REGISTRY, store, ("fair-share", {}), replica_id="r1")
    slot.switch("fcfs")
    assert ReplicaState.model_validate_json((tmp_path / "state.json").read_text()).policy
    slot.switch("greedy-yield")  # later writes replace the new file as usual
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "state.json",
        "state.json.unreadable-1",
        "state.json.unreadable-2",
    ]


def test_every_policy_the_slot_builds_is_given_its_offload_and_a_landing_asks_a_decision(
    tmp_path: Path,
) -> None:
    """The slot's offload reaches each policy it builds (configured, switched, adopted);
    once the work's result landed in the policy, ``worked`` fires (a decision follows)."""
    ran: list[object] = []

    def offload(work, done) -> None:  # type: ignore[no-untyped-def]
        ran.append(work)
        done(work())

    slot = PolicySlot(
        REGISTRY, StateStore(tmp_path), ("persched", {}), replica_id="r1", offload=offload
    )
    worked: list[int] = []
    slot.worked.connect(lambda: worked.append(1))
    given = []
    for build in (
        lambda: slot.policy,
        lambda: (slot.switch("persched", {"reserve": 0.2}), slot.policy)[1],
        lambda: (slot.adopt("persched", {"reserve": 0.3}, 99, "r2"), slot.policy)[1],
    ):
        policy = build()
        seen: list[object] = []
        policy._offload(lambda: 7, seen.append)  # type: ignore[attr-defined]
        given.append(seen)
    assert given == [[7], [7], [7]] and len(ran) == 3 and worked == [1, 1, 1]
    unwired = slot_in(tmp_path / "b", "persched")
    assert unwired.policy._offload is None  # type: ignore[attr-defined]  # in the decision
