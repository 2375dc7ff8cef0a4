"""What every policy needs across replicas: periods and buffers in the merged view, PerSched's
pattern shared (its origin, each replica's part), the blend with a part of a pattern, and the
policy instance that decides the merged view (docs/replicas.md, "What each policy needs")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from digests import digest, job
from support import views

from burstctl.controller.digest import BufferHeader, PatternOrigin, same_columns
from burstctl.controller.merge import merge
from burstctl.controller.patterns import NO_PART, GlobalPattern, fractions, key_name, peak_rate
from burstctl.controller.state import PolicySlot, StateStore
from burstctl.policies.decision import Share, decide
from burstctl.policies.registry import default_registry
from burstctl.policies.schedule import Schedule, Window
from burstctl.policies.view import Periodic, SystemView

MiB = 1 << 20


def test_the_merged_view_has_every_jobs_period_declared_first_learned_summed() -> None:
    r1 = digest("r1", (job("d", period_w=0.5, period_vol=8.0), job("l", period_w=1.0,
                period_vol=3.0, period_learned=True), job("x")))  # fmt: skip
    r2 = digest("r2", (job("d", period_w=0.7, period_vol=9.0), job("l", period_w=2.0,
                period_vol=4.0, period_learned=True), job("m", period_w=1.0, period_vol=2.0,
                period_learned=True)))  # fmt: skip
    r3 = digest("r3", (job("m", period_w=3.0, period_vol=5.0),))
    periodic = merge([r1, r2, r3]).view.periodic
    # declared: the lowest replica id's, the job's own volume
    assert periodic["d"] == Periodic(8, 0.5, 8.0)
    # learned: w from the lowest replica id, the bytes of an iteration summed over replicas
    assert periodic["l"] == Periodic(8, 1.0, 7.0, learned=True)
    # a declared period wins over a learned one whichever replica has which
    assert periodic["m"] == Periodic(8, 3.0, 5.0)
    assert "x" not in periodic
    # a learned period counts once every replica the job is on learned it
    r4 = digest("r4", (job("l"),))
    assert "l" not in merge([r1, r2, r4]).view.periodic
    assert merge([r1, r2, r4]).view.periodic["d"] == Periodic(8, 0.5, 8.0)


def test_the_merged_view_has_the_buffers_summed_and_none_without_one() -> None:
    r1 = digest("r1", (job("a", resident=5.0, pending=2.0),), buffer=BufferHeader(100, 30, 10))
    r2 = digest("r2", (job("a", resident=1.0), job("b", resident=4.0, pending=4.0)),
                buffer=BufferHeader(50, 20, 5))  # fmt: skip
    r3 = digest("r3", (job("c"),))  # no buffer
    buffer = merge([r1, r2, r3]).view.buffer
    assert buffer is not None
    assert (buffer.size, buffer.used, buffer.drain_bandwidth) == (150.0, 50.0, 15.0)
    assert dict(buffer.resident) == {"a": 6.0, "b": 4.0}
    assert dict(buffer.pending) == {"a": 2.0, "b": 4.0}
    assert merge([r3]).view.buffer is None


def test_the_merged_views_seed_changes_with_the_exchange_the_same_everywhere() -> None:
    a = [digest("r1", (job("a"),), sequence=4), digest("r2", (job("b"),), sequence=9)]
    b = [a[0], dataclasses.replace(a[1], sequence=10)]
    assert merge(a).view.seed == merge(list(a)).view.seed
    assert merge(a).view.seed != merge(b).view.seed


def schedule(*windows: tuple[float, float, float], period: float = 1.0) -> Schedule:
    return Schedule(period, tuple(Window(*w) for w in windows))


def test_peak_rate_sums_overlapping_windows_with_wrapping_ones() -> None:
    a = schedule((0.0, 0.5, 4.0))
    b = schedule((0.4, 0.6, 2.0))
    c = schedule((0.9, 1.2, 1.0))  # wraps to [0, 0.2)
    assert peak_rate([a, b]) == 6.0
    assert peak_rate([a, c]) == 5.0  # c's wrap overlaps a at the period's start
    assert peak_rate([schedule((0.0, 0.5, 4.0)), schedule((0.5, 1.0, 4.0))]) == 4.0  # touching
    assert peak_rate([]) == 0.0


def test_a_jobs_parts_follow_the_mean_volume_of_its_operations_on_each_replica() -> None:
    r1 = digest("r1", (job("p", mean_volume=3.0), job("q", mean_volume=5.0)))
    r2 = digest("r2", (job("p", mean_volume=1.0), job("q")))  # q: none completed on r2 yet
    jobs = {"p": 1, "q": 1}
    assert fractions([r1, r2], "r1", jobs) == {"p": 0.75, "q": 0.5}
    assert fractions([r1, r2], "r2", jobs) == {"p": 0.25, "q": 0.5}


def test_the_coordinator_announces_an_origin_the_others_read_on_their_own_clock() -> None:
    key = ((("p", 1, 0.5, 1e6),), 100.0, 10.0)
    pattern = {"p": schedule((0.0, 0.5, 8.0))}
    r1 = digest("r1", (job("p", mean_volume=1.0),), sent_at=50.0)
    r2 = digest("r2", (job("p", mean_volume=1.0),), sent_at=700.0)
    coordinator = GlobalPattern("r1")
    part = coordinator.part(key, pattern, [r1, r2], {"r2": 40.0}, 42.0, 100.0)
    assert coordinator.announce() == PatternOrigin(key_name(key), 42.0)
    assert part.schedules["p"].origin == 42.0
    assert part.schedules["p"].windows == (Window(0.0, 0.5, 4.0),)  # half of p's bytes here
    assert part.peak == 4.0
    # the same key later: the origin stands
    assert coordinator.part(key, pattern, [r1, r2], {}, 99.0, 100.0).schedules["p"].origin == 42.0
    other = GlobalPattern("r2")
    # r1's digest without the announcement: no windows out of step
    assert other.part(key, pattern, [r1, r2], {"r1": 1000.0}, 1001.0, 100.0) is NO_PART
    announced = dataclasses.replace(r1, pattern=coordinator.announce())
    part2 = other.part(key, pattern, [announced, r2], {"r1": 1000.0}, 1001.0, 100.0)
    # accepted at 1000 on r2's clock, sent 8 s after the origin on r1's: 992 on r2's
    assert part2.schedules["p"].origin == 992.0
    assert other.announce() == PatternOrigin()
    # a part that would pass the capacity at its peak is scaled down to it
    squeezed = coordinator.part(key, pattern, [r1, r2], {}, 99.0, 3.0)
    assert squeezed.peak == 3.0 and squeezed.schedules["p"].peak_rate() == 3.0
    # no pattern: nothing, and nothing announced
    assert coordinator.part(None, {}, [r1, r2], {}, 99.0, 100.0) is NO_PART
    assert coordinator.announce() == PatternOrigin()


def test_blend_with_a_part_of_a_pattern_keeps_the_windows_peak_free() -> None:
    """The scheduled job gets its schedule at its mean rate; the others are not topped up
    into what its windows take at their peak."""
    policy = default_registry().create("fair-share", {})
    view = SystemView(0.0, 10.0, 10.0, {j.job_id: j for j in (
        views.job("p", 10.0, 10.0, index=0), views.job("o", 10.0, 10.0, index=1))})  # fmt: skip
    part = schedule((0.0, 0.5, 6.0))  # mean 3, peak 6
    share = Share({"o": 2.0}, {"o": 10.0}, schedules={"p": part}, reserved=6.0)
    decision = decide(policy, view, share)
    assert decision.schedules == {"p": part}
    assert decision.rates == pytest.approx({"p": 3.0, "o": 4.0})  # o: 10 − the peak 6
    # a job that started since the exchange (n, not in the share) gets room beside the peak
    view3 = SystemView(0.0, 10.0, 10.0, {j.job_id: j for j in (
        views.job("p", 10.0, 10.0, index=0), views.job("o", 10.0, 10.0, index=1),
        views.job("n", 10.0, 10.0, index=2))})  # fmt: skip
    crowded = Share({"o": 4.0}, {"o": 4.0}, schedules={"p": part}, reserved=6.0)
    rates = decide(policy, view3, crowded).rates
    assert rates["o"] + rates["n"] == pytest.approx(4.0)  # 10 − the peak 6
    assert rates["p"] == pytest.approx(3.0)
    plain = decide(policy, view, Share({"o": 2.0, "p": 3.0}, {"o": 10.0, "p": 10.0}))
    assert plain.rates == pytest.approx({"p": 5.5, "o": 4.5})  # both topped up by 2.5


def test_a_policy_that_defers_on_purpose_is_not_topped_up_between_exchanges() -> None:
    dpsac = default_registry().create("dpsac", {})
    view = SystemView(0.0, 10.0, 10.0, {"a": views.job("a", 10.0, 10.0)})
    assert decide(dpsac, view, Share({"a": 2.0}, {"a": 10.0})).rates == {"a": 2.0}
    fair = default_registry().create("fair-share", {})
    assert decide(fair, view, Share({"a": 2.0}, {"a": 10.0})).rates == {"a": 10.0}


@pytest.mark.parametrize(("name", "twin"), [("persched", True), ("dpsac", True), ("set-10", False)])
def test_a_policy_that_keeps_state_decides_the_merged_view_with_an_instance_of_its_own(
    tmp_path: Path, name: str, twin: bool
) -> None:
    slot = PolicySlot(default_registry(), StateStore(tmp_path), (name, {}), replica_id="r1")
    merged = slot.merged
    assert (merged is not slot.policy) is twin
    assert type(merged) is type(slot.policy) and merged.params == slot.policy.params
    assert slot.merged is merged  # made once per active instance
    slot.switch("fair-share")
    assert slot.merged is slot.policy


def test_a_buffer_or_a_pattern_that_moved_keeps_the_share_of_a_policy_that_reads_neither() -> None:
    a = digest("r1", (job("a", resident=1.0),), buffer=BufferHeader(100, 10, 5))
    b = dataclasses.replace(a, buffer=BufferHeader(100, 60, 5), pattern=PatternOrigin("k", 0.0))
    assert same_columns(a, b, {"job_id", "open_op", "nodes", "demand"})


def test_an_origin_once_agreed_stands_while_the_coordinator_announces_another_pattern() -> None:
    key = ((("p", 1, 0.5, 1e6),), 100.0, 10.0)
    pattern = {"p": schedule((0.0, 0.5, 8.0))}
    r1 = digest("r1", (job("p", mean_volume=1.0),), sent_at=50.0, pattern=PatternOrigin(
        key_name(key), 42.0))  # fmt: skip
    r2 = digest("r2", (job("p", mean_volume=1.0),), sent_at=700.0)
    other = GlobalPattern("r2")
    assert other.part(key, pattern, [r1, r2], {"r1": 1000.0}, 1001.0, 100.0).schedules
    # r1 now announces nothing (its view lost a peer): r2 keeps the origin it agreed on
    silent = dataclasses.replace(r1, pattern=PatternOrigin())
    kept = other.part(key, pattern, [silent, r2], {"r1": 1010.0}, 1011.0, 100.0)
    assert kept.schedules["p"].origin == 992.0
    # alone (r1 gone from its view), r2 coordinates with the same origin
    assert other.part(key, pattern, [r2], {}, 1020.0, 100.0).schedules["p"].origin == 992.0
    assert other.announce() == PatternOrigin(key_name(key), 992.0)


def test_the_origin_is_read_from_the_least_delayed_of_the_coordinators_digests() -> None:
    """A digest taken 30 ms late (a loaded replica) sets the windows 30 ms late until a
    timely one comes; a better reading by less than ORIGIN_STEP moves nothing."""
    key = ((("p", 1, 0.5, 1e6),), 100.0, 10.0)
    pattern = {"p": schedule((0.0, 0.5, 8.0))}
    announced = PatternOrigin(key_name(key), 42.0)
    r2 = digest("r2", (job("p", mean_volume=1.0),), sent_at=700.0)
    other = GlobalPattern("r2")

    def part_at(sent: float, heard: float) -> float:
        r1 = digest("r1", (job("p", mean_volume=1.0),), sent_at=sent, pattern=announced)
        got = other.part(key, pattern, [r1, r2], {"r1": heard}, heard, 100.0)
        return got.schedules["p"].origin

    # clocks 950 s apart; the first digest took 30 ms, the second 0.1 ms
    assert part_at(50.0, 1000.030) == pytest.approx(992.030)
    assert part_at(50.2, 1000.2001) == pytest.approx(992.0001)
    assert part_at(50.4, 1000.4002) == pytest.approx(992.0001)  # a slower one: the least
    assert part_at(50.6, 1000.6) == pytest.approx(992.0001)  # 0.1 ms better: kept as it was
    # the coordinator restarted (a new clock): its earlier samples no longer count
    r1 = digest("r1", (job("p", mean_volume=1.0),), sent_at=5.0, incarnation=2,
                pattern=PatternOrigin(key_name(key), 4.0))  # fmt: skip
    assert other.part(key, pattern, [r1, r2], {"r1": 2000.5}, 2000.5, 100.0).schedules[
        "p"
    ].origin == pytest.approx(1999.5)
