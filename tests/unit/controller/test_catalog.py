"""The replicated catalog (controller/catalog.py): merge, tombstones, checks, wire, state."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import time
from pathlib import Path

import pytest

from burstctl.controller import catalog as cat
from burstctl.controller.catalog import (
    PROFILE,
    REGISTRATION,
    RETIRED,
    TOMBSTONE_SECONDS,
    Catalog,
    CatalogRecord,
    records_problem,
)
from burstctl.controller.delta import advance, apply
from burstctl.controller.digest import Digest, DigestError, validate
from burstctl.controller.digest_wire import from_proto, to_proto
from burstctl.controller.jobs import JobTable
from burstctl.controller.profiles import ProfileStore
from burstctl.controller.registrations import Registrations
from burstctl.controller.rules import Rule
from burstctl.controller.state import StateStore


def reg(key: str, version: int, origin: str, user: str = "ann", **more: object) -> CatalogRecord:
    return CatalogRecord(
        REGISTRATION, key, version, origin, 1000.0, nodes=4, user=user, group="g", **more
    )


def tomb(key: str, version: int, origin: str, at: float = 1000.0) -> CatalogRecord:
    return CatalogRecord(RETIRED, key, version, origin, at)


def prof(app: str, version: int, origin: str, nodes: int = 2) -> CatalogRecord:
    return CatalogRecord(
        PROFILE,
        app,
        version,
        origin,
        1000.0,
        nodes=nodes,
        volume_per_phase=float(version),
        phases=version,
        bandwidth=((1, 5.0), (2, 9.0)),
    )


def catalog(replica: str = "r1", now: float = 2000.0) -> Catalog:
    return Catalog(replica, ProfileStore(None), wall_clock=lambda: now)


def held(c: Catalog) -> set[tuple[object, ...]]:
    return {(r.identity, r.order, r.user) for r in c.records()}


def test_the_highest_version_then_origin_wins_in_any_order() -> None:
    records = [
        reg("j1", 1, "r1", user="ann"),
        reg("j1", 2, "r1", user="bob"),
        reg("j1", 2, "r3", user="cid"),  # concurrent with (2, r1): the higher origin wins
        tomb("j2", 3, "r2"),
        reg("j2", 2, "r1"),
        prof("app", 1, "r1"),
        prof("app", 4, "r2"),
        prof("app", 2, "r1", nodes=8),
    ]
    outcomes = set()
    rng = random.Random(7)
    for _ in range(40):
        order = records[:]
        rng.shuffle(order)
        c = catalog()
        for chunk in (order[:3], order[3:], order[1:4]):  # again: idempotent
            c.receive(chunk)
        outcomes.add(frozenset(held(c)))
    assert len(outcomes) == 1
    c = catalog()
    c.receive(records)
    assert c.registrations["j1"].user == "cid" and c.registrations["j2"].kind == RETIRED
    assert c.profiles.get(("app", 2)).version == 4  # type: ignore[union-attr]
    assert c.profiles.get(("app", 8)).version == 2  # type: ignore[union-attr]
    assert c.clock == 4


def test_a_local_change_outranks_everything_seen_and_peers_adopt_it() -> None:
    r1, r2 = catalog("r1"), catalog("r2")
    r2.receive([reg("j1", 9, "r3")])
    change = r2.stamp(RETIRED, "j1")
    assert change.order == (10, "r2")
    r2.put(change)
    adopted: list[tuple[CatalogRecord, CatalogRecord | None]] = []
    r1.adopted.connect(lambda record, previous: adopted.append((record, previous)))
    assert r1.receive(r2.records()) == 1
    assert adopted == [(change, None)]
    assert r1.receive(r2.records()) == 0  # nothing new: nothing adopted again
    assert r1.receive([reg("j1", 9, "r3")]) == 0  # an older one loses


def test_a_registration_after_a_forgotten_retirement_still_wins() -> None:
    c = catalog(now=1000.0 + TOMBSTONE_SECONDS + 1)
    c.resume([tomb("j1", 5, "r2", at=1000.0)], clock=5)
    assert "j1" not in c.registrations  # expired: dropped at load
    record = c.stamp(REGISTRATION, "j1", nodes=1, user="ann", group="g")
    assert record.version == 6  # the clock remembers: a peer's tombstone (5) loses to it
    fresh = catalog(now=1000.0 + 10)
    fresh.receive([tomb("j1", 5, "r2", at=1000.0), record])
    assert fresh.registrations["j1"] == record
    stale = catalog(now=1000.0 + TOMBSTONE_SECONDS + 1)
    assert stale.receive([tomb("j9", 5, "r2", at=1000.0)]) == 0  # an expired one is not taken


def test_the_bound_drops_the_oldest_tombstones_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cat, "MAX_REGISTRATIONS", 3)
    c = catalog()
    c.receive([tomb("a", 1, "r1", at=10.0), tomb("b", 2, "r1", at=5.0), reg("c", 3, "r1")])
    assert c.full() is False
    c.put(reg("d", 4, "r1"))
    assert sorted(c.registrations) == ["a", "c", "d"]  # b, the oldest tombstone, made room
    c.put(reg("e", 5, "r1"))
    assert sorted(c.registrations) == ["c", "d", "e"] and c.full()
    assert c.receive([reg("f", 6, "r2")]) == 0  # full of live registrations: not taken


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (dataclasses.replace(reg("j", 1, "r1"), user=""), "catalog[2].user"),
        (dataclasses.replace(reg("j", 1, "r1"), group="a\nb"), "catalog[2].group"),
        (dataclasses.replace(reg("j", 1, "r1"), nodes=0), "catalog[2].nodes"),
        (dataclasses.replace(reg("j", 1, "r1"), priority=math.nan), "catalog[2].priority"),
        (dataclasses.replace(reg("j", 1, "r1"), w=5.0), "catalog[2].vol_io"),
        (dataclasses.replace(reg("j", 1, "r1"), app="x" * 300), "catalog[2].app"),
        (reg("j", 0, "r1"), "catalog[2].version"),
        (reg("", 1, "r1"), "catalog[2].key"),
        (reg("j", 1, ""), "catalog[2].origin"),
        (dataclasses.replace(reg("j", 1, "r1"), changed_at=math.inf), "catalog[2].changed_at"),
        (dataclasses.replace(reg("j", 1, "r1"), kind=""), "catalog[2].body"),
        (
            dataclasses.replace(prof("p", 1, "r1"), compute_seconds=-1.0),
            "catalog[2].compute_seconds",
        ),
        (dataclasses.replace(prof("p", 1, "r1"), phases=-1), "catalog[2].phases"),
        (
            dataclasses.replace(prof("p", 1, "r1"), bandwidth=((1, 1.0), (1, 2.0))),
            "catalog[2].bandwidth_replicas[1]",
        ),
        (
            dataclasses.replace(prof("p", 1, "r1"), bandwidth=((1, 1.0), (2, math.nan))),
            "catalog[2].bandwidth[1]",
        ),
        (reg("a", 1, "r1"), "catalog[2].key"),  # a second record of job a
    ],
)
def test_a_malformed_record_is_named_on_the_wire(record: CatalogRecord, field: str) -> None:
    records = (reg("a", 1, "r1"), prof("p", 1, "r1", nodes=9), record)
    assert records_problem(records) is not None
    assert records_problem(records)[0] == field  # type: ignore[index]
    digest = Digest("r1", 1, 1, 1e6, 1e5, "fair-share", catalog=records)
    with pytest.raises(DigestError) as caught:
        from_proto(to_proto(digest))
    assert caught.value.field == field


def test_too_many_records_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cat, "MAX_RECORDS", 2)
    records = tuple(reg(f"j{i}", 1, "r1") for i in range(3))
    with pytest.raises(DigestError) as caught:
        from_proto(to_proto(Digest("r1", 1, 1, 1e6, 1e5, "fair-share", catalog=records)))
    assert caught.value.field == "catalog"


def test_full_and_delta_digests_carry_the_catalog() -> None:
    c = catalog()
    c.put(reg("j1", 1, "r1"))
    c.receive([prof("app", 2, "r2")])
    base = Digest("r1", 1, 1, 1e6, 1e5, "fair-share", sent_at=1.0, catalog=c.records())
    wire = from_proto(to_proto(base))
    assert wire.catalog == base.catalog
    receiver = catalog("r2")
    receiver.receive(wire.catalog)
    assert held(receiver) == held(c)

    # Nothing changed: the delta carries no record, and the same tuple is sent.
    same = dataclasses.replace(base, sequence=2, sent_at=2.0, catalog=c.records())
    assert same.catalog is base.catalog
    view, delta = advance(base, same)
    assert delta is not None and delta.catalog == ()
    # A retirement and a new registration: only they travel.
    c.put(c.stamp(RETIRED, "j1"))
    c.put(c.stamp(REGISTRATION, "j2", nodes=2, user="bob", group="g"))
    built = dataclasses.replace(base, sequence=3, sent_at=3.0, catalog=c.records())
    view, delta = advance(view, built)
    assert delta is not None
    assert sorted(r.key for r in delta.catalog) == ["j1", "j2"]
    decoded = from_proto(to_proto(delta))
    validate(decoded)
    rebuilt = apply(from_proto(to_proto(base)), decoded)
    assert set(rebuilt.catalog) == set(built.catalog)
    receiver.receive(decoded.catalog)
    assert held(receiver) == held(c)


def test_the_order_of_exchanges_does_not_matter_between_three_replicas() -> None:
    replicas = {rid: catalog(rid) for rid in ("r1", "r2", "r3")}
    rng = random.Random(3)
    for step in range(60):
        rid = rng.choice(sorted(replicas))
        c = replicas[rid]
        job = f"j{rng.randrange(4)}"
        if rng.random() < 0.3:
            c.put(c.stamp(RETIRED, job))
        else:
            c.put(c.stamp(REGISTRATION, job, nodes=1 + step, user=rid, group="g"))
        a, b = rng.sample(sorted(replicas), 2)
        replicas[b].receive(replicas[a].records())
    for a, b in itertools.permutations(sorted(replicas), 2):
        replicas[b].receive(replicas[a].records())
    assert len({frozenset(held(c)) for c in replicas.values()}) == 1


def test_registrations_with_their_catalog_records_survive_a_restart(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    c = catalog()
    c.put(reg("j1", 3, "r2"))
    c.put(tomb("j2", 4, "r1", at=1990.0))
    store.update(
        jobs=[
            {
                "job_id": r.key,
                "user": r.user,
                "group": r.group,
                "nodes": r.nodes,
                "version": r.version,
                "origin": r.origin,
                "changed_at": r.changed_at,
                "retired": r.kind == RETIRED,
            }
            for r in c.records()
        ],
        catalog_clock=7,
    )
    state = StateStore(tmp_path).load()
    assert [(j.job_id, j.version, j.origin, j.retired) for j in state.jobs] == [
        ("j1", 3, "r2", False),
        ("j2", 4, "r1", True),
    ]
    assert state.catalog_clock == 7


def test_a_state_of_an_older_burstctl_resumes_at_version_one(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(
        '{"jobs": [{"job_id": "j1", "user": "ann", "group": "g", "nodes": 2}]}'
    )
    state = StateStore(tmp_path).load()
    assert (state.jobs[0].version, state.jobs[0].retired, state.catalog_clock) == (0, False, 0)


def test_profiles_are_stamped_persisted_and_older_peers_lose(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    c = Catalog("r1", store, wall_clock=lambda: 50.0)
    store.observe(("app", 2), 100.0, 1.0, None, 1, c.next_stamp())
    assert [(r.key, r.order) for r in c.records()] == [("app", (1, "r1"))]
    assert c.receive([prof("app", 1, "r0")]) == 0  # (1, r0) < (1, r1)
    assert c.receive([prof("app", 3, "r0")]) == 1
    store.save()
    again = ProfileStore(tmp_path)
    again.load()
    loaded = again.get(("app", 2))
    assert loaded is not None and (loaded.version, loaded.origin) == (3, "r0")
    assert loaded.bandwidth == {1: 5.0, 2: 9.0}


class CountingStore(StateStore):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.saves = 0

    def update(self, **parts: object) -> None:
        self.saves += 1
        super().update(**parts)


class NoSessions:
    """The servicer's one part registrations use: no session of these jobs is open here."""

    def end_foreign_sessions(self, meta: object) -> int:
        return 0


def test_a_peers_records_are_applied_one_by_one_and_saved_once(tmp_path: Path) -> None:
    """A replica joining a cluster takes every registration in one digest: one state.json
    write for all of them, not one each (each write holds them all)."""
    store = CountingStore(tmp_path)
    c = catalog()
    table = JobTable(
        time.monotonic, heartbeat_timeout=30.0, job_retention=60.0, demand_headroom=1.1
    )
    Registrations(table, store, NoSessions(), c)  # type: ignore[arg-type]
    assert c.receive([reg(f"j{i:03d}", i + 1, "r2") for i in range(200)]) == 200
    assert store.saves == 1
    assert len(table.registered) == 200
    assert len(StateStore(tmp_path).load().jobs) == 200
    assert c.receive([reg("j000", 1, "r2")]) == 0 and store.saves == 1  # nothing new


# -- operator rules as catalog records ------------------------------------------------


def rule(name: str, version: int, origin: str, limit: float = 1e6) -> CatalogRecord:
    body = Rule(name, user="u*", limit=limit, metadata_ops=50.0)
    return CatalogRecord(cat.RULE, name, version, origin, 1000.0, rule=body)


def test_rule_records_merge_on_their_own_identity_and_survive_the_wire() -> None:
    a = catalog("r1")
    seen: list[int] = []
    a.rules_adopted.connect(lambda: seen.append(1))
    # a rule and a job may share a name: different identities
    taken = a.receive([rule("x", 3, "r2"), reg("x", 2, "r2")])
    assert taken == 2 and seen == [1]
    assert a.registrations["x"].kind == REGISTRATION and a.rules["x"].kind == cat.RULE
    assert a.receive([rule("x", 2, "r3", limit=5.0)]) == 0  # older: kept
    removed = CatalogRecord(cat.RULE_REMOVED, "x", 4, "r2", 1000.0)
    assert a.receive([removed]) == 1 and a.rule_set() == []
    assert len(seen) == 2
    wired = cat.from_wire(cat.to_wire([rule("y", 7, "r1"), removed]))
    assert wired == (rule("y", 7, "r1"), removed)
    assert records_problem(wired) is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (Rule("y"), "catalog[0].rule.match"),
        (Rule("y", user="u"), "catalog[0].rule.limit"),  # sets nothing
        (Rule("y", user="u", weight=0.0), "catalog[0].rule.weight"),
        (Rule("y", user="u", limit=-1.0), "catalog[0].rule.limit"),
        (Rule("z", user="u", limit=1.0), "catalog[0].rule.name"),  # not the key
    ],
)
def test_a_malformed_rule_record_is_named(body: Rule, field: str) -> None:
    record = CatalogRecord(cat.RULE, "y", 1, "r1", 1000.0, rule=body)
    problem = records_problem([record])
    assert problem is not None and problem[0] == field


def test_rules_are_bounded_and_their_tombstones_expire() -> None:
    a = catalog("r1", now=1000.0 + TOMBSTONE_SECONDS + 1)
    removed = CatalogRecord(cat.RULE_REMOVED, "old", 1, "r2", 1000.0)
    assert a.receive([removed]) == 0  # expired on arrival
    many = [rule(f"r{i}", i + 1, "r2") for i in range(cat.MAX_RULES + 5)]
    a.receive(many)
    assert len(a.rule_set()) == cat.MAX_RULES and a.rules_full()
