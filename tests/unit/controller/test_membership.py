"""Which peers are in the global view: sequences and incarnations, impostors, policies
that cannot be built, expiry and rejoin, and the policy election."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from digests import C, digest, exchange, job

from burstctl.controller.digest import Digest
from burstctl.controller.membership import Membership, Status
from burstctl.controller.split import Edge
from burstctl.policies.registry import default_registry

REGISTRY = default_registry()


def figure5() -> tuple[Digest, Digest]:
    r1 = digest("R1", (job("J1", nodes=16), job("J2", nodes=8)))
    r2 = digest("R2", (job("J1", nodes=16), job("J3", nodes=8)))
    return r1, r2


def rates(membership: Membership, me: Digest) -> dict[Edge, float]:
    return exchange(membership, me)[1]


def per_job(x: dict[Edge, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (j, _), rate in x.items():
        out[j] = out.get(j, 0.0) + rate
    return out


# -- sequences and incarnations -------------------------------------------------------


def test_stale_and_duplicate_sequences_are_ignored() -> None:
    m = Membership("R1")
    assert m.receive(digest("R2", sequence=5, capacity=10.0), 0.0).status is Status.ACCEPTED
    assert m.receive(digest("R2", sequence=5, capacity=10.0), 1.0).status is Status.DUPLICATE
    assert m.receive(digest("R2", sequence=4, capacity=99.0), 1.0).status is Status.STALE
    conflicting = m.receive(digest("R2", sequence=5, capacity=99.0), 1.0)
    assert conflicting.status is Status.REJECTED and conflicting.field == "sequence"
    (held,) = m.digests()
    assert held.sequence == 5 and held.capacity == 10.0
    assert m.receive(digest("R2", sequence=6, capacity=20.0), 2.0).accepted
    assert m.digests()[0].capacity == 20.0


def test_restart_with_a_new_incarnation_is_accepted_despite_sequence_reset() -> None:
    m = Membership("R1")
    assert m.receive(digest("R2", incarnation=100, sequence=900), 0.0).accepted
    assert m.receive(digest("R2", incarnation=200, sequence=0, capacity=7.0), 1.0).accepted
    assert m.digests()[0].capacity == 7.0
    # the old run's late digests are now stale history, not news
    late = m.receive(digest("R2", incarnation=100, sequence=901), 2.0)
    assert late.status is Status.REJECTED and late.field == "incarnation"


def test_impostor_with_a_lower_incarnation_is_rejected_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = Membership("R1")
    assert m.receive(digest("R2", incarnation=50, sequence=3), 0.0).accepted
    with caplog.at_level(logging.WARNING):
        out = m.receive(digest("R2", incarnation=49, sequence=1000, capacity=1e12), 1.0)
    assert out.status is Status.REJECTED and out.field == "incarnation"
    assert "impostor" in out.reason and "R2" in caplog.text
    assert m.digests()[0].capacity == C


def test_a_peer_cannot_claim_this_replicas_id_or_an_unconfigured_one() -> None:
    m = Membership("R1", peers=["R2"])
    assert m.receive(digest("R1"), 0.0).status is Status.REJECTED
    assert m.receive(digest("R3"), 0.0).status is Status.REJECTED
    assert m.receive(digest("R2"), 0.0).accepted
    assert m.live_peers() == ["R2"]


def test_a_policy_the_registry_cannot_build_is_rejected_at_the_door() -> None:
    m = Membership("R1", registry=REGISTRY)
    out = m.receive(digest("R2", policy="no-such-policy", policy_version=99), 0.0)
    assert out.status is Status.REJECTED and out.field == "policy"
    out = m.receive(digest("R2", policy="size-fair", policy_params={"bogus": 1}), 0.0)
    assert out.status is Status.REJECTED and out.field == "policy"
    assert m.live_peers() == []
    assert m.elected(digest("R1")).replica_id == "R1"  # so it never wins the election


def test_this_replicas_own_digest_must_be_its_own_and_valid() -> None:
    m = Membership("R1")
    with pytest.raises(ValueError, match="R2"):
        m.digests(digest("R2"))
    with pytest.raises(ValueError, match="capacity"):
        m.digests(digest("R1", capacity=-1.0))
    assert m.digests(digest("R1")) == [digest("R1")]


# -- expiry and rejoin -----------------------------------------------------------


def test_a_peer_missing_k_exchanges_leaves_and_rejoins() -> None:
    lam, k = 0.5, 3
    r1, r2 = figure5()
    m = Membership("R1")
    assert m.receive(r2, now=0.0).accepted
    assert m.expire(now=k * lam, interval=lam, missed=k) == []  # exactly k·λ: still live
    assert m.live_peers() == ["R2"]
    assert m.expire(now=k * lam + 0.01, interval=lam, missed=k) == ["R2"]
    assert m.live_peers() == []
    assert m.digests(r1) == [r1]
    (state,) = m.peer_states(now=2.0)
    assert (state.replica_id, state.live, state.sequence, state.jobs) == ("R2", False, 1, 2)
    assert state.heard_age == 2.0
    # R1 falls back to its local decision: 2/3 vs 1/3 of its own capacity
    assert rates(m, r1) == pytest.approx({("J1", "R1"): 2 * C / 3, ("J2", "R1"): C / 3})
    # the same old digest again does not revive it; a newer one does
    assert m.receive(r2, now=2.0).status is Status.DUPLICATE
    assert m.live_peers() == []
    assert m.receive(dataclasses.replace(r2, sequence=2), now=2.0).accepted
    assert m.live_peers() == ["R2"]
    assert per_job(rates(m, r1)) == pytest.approx({"J1": C, "J2": C / 2, "J3": C / 2})
    assert m.expire(now=2.0 + k * lam, interval=lam, missed=k) == []


def test_expire_checks_its_parameters() -> None:
    m = Membership("R1")
    with pytest.raises(ValueError, match="interval"):
        m.expire(0.0, 0.0, 3)
    with pytest.raises(ValueError, match="missed"):
        m.expire(0.0, 1.0, 0)


# -- the policy election -------------------------------------------------------------


def test_highest_policy_version_wins_ties_by_replica_id() -> None:
    me = digest("R2", policy="job-fair", policy_version=3)
    m = Membership("R2")
    assert m.elected(me) is me  # alone: its own policy
    m.receive(digest("R1", policy="size-fair", policy_version=4), 0.0)
    assert m.elected(me).policy == "size-fair"
    m.receive(digest("R3", policy="user-fair", policy_version=4), 0.0)
    elected = m.elected(me)
    assert (elected.policy, elected.policy_version, elected.replica_id) == ("user-fair", 4, "R3")
    # and the winner drives the targets: job-fair would give 1/2, 1/2
    lone = digest("R2", (job("A", nodes=3), job("B", nodes=1)), policy="job-fair")
    solo = Membership("R2")
    solo.receive(digest("R1", policy="size-fair", policy_version=1), 0.0)
    targets, _ = exchange(solo, lone)
    assert targets == pytest.approx({"A": 2 * C * 0.75, "B": 2 * C * 0.25})


def test_an_expired_peer_does_not_vote() -> None:
    me = digest("R1", policy="job-fair", policy_version=1)
    m = Membership("R1")
    m.receive(digest("R2", policy="user-fair", policy_version=2), 0.0)
    assert m.elected(me).replica_id == "R2"
    m.expire(now=10.0, interval=1.0, missed=3)
    assert m.elected(me) is me


def test_a_switch_reaches_every_replica_with_the_next_exchange() -> None:
    r1, r2 = figure5()
    m1, m2 = Membership("R1"), Membership("R2")
    r1 = dataclasses.replace(r1, sequence=2, policy="job-fair", policy_version=1)
    m1.receive(r2, 0.0)
    m2.receive(r1, 0.0)
    assert m1.elected(r1) == m2.elected(r2) == r1
    assert exchange(m1, r1) == exchange(m2, r2)
    targets, _ = exchange(m1, r1)
    assert targets == pytest.approx({"J1": 2 * C / 3, "J2": 2 * C / 3, "J3": 2 * C / 3})
