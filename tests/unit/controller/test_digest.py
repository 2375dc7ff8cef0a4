"""A replica's digest: its one check (every bad field named), its columns, the wire,
and the digest built from a job table."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from digests import FULL_DIGEST, FULL_ROWS, digest, job

from burstctl.controller.digest import (
    NO_BUFFER,
    NO_PATTERN,
    BufferHeader,
    Digest,
    DigestError,
    DigestJobs,
    JobDigest,
    PatternOrigin,
    validate,
)
from burstctl.controller.digest_wire import from_proto, to_proto
from burstctl.controller.jobs import JobTable
from burstctl.controller.local_digest import build_digest
from burstctl.controller.membership import Membership, Status
from burstctl.controller.records import JobMeta, OpKind
from burstctl.proto.burstctl.v1 import peer_pb2 as pb


def error_of(d: Digest) -> str | None:
    try:
        validate(d)
    except DigestError as exc:
        return str(exc)
    return None


# -- every bad field is named ------------------------------------------------------

GOOD = digest("R2", (job("J1"), job("J2", demand=0.0)))

BAD_DIGESTS: list[tuple[str, dict[str, Any]]] = [
    ("replica_id", {"replica_id": ""}),
    ("replica_id", {"replica_id": 7}),
    ("replica_id", {"replica_id": "a\nb"}),
    ("replica_id", {"replica_id": "x" * 257}),
    ("incarnation", {"incarnation": -1}),
    ("incarnation", {"incarnation": 1.5}),
    ("sequence", {"sequence": True}),
    ("sequence", {"sequence": 2**64}),
    ("capacity", {"capacity": math.nan}),
    ("capacity", {"capacity": math.inf}),
    ("capacity", {"capacity": -1.0}),
    ("capacity", {"capacity": 1e30}),
    ("capacity", {"capacity": "100"}),
    ("node_bandwidth", {"node_bandwidth": 0.0}),
    ("policy", {"policy": ""}),
    ("policy", {"policy": None}),
    ("policy_params", {"policy_params": [1, 2]}),
    ("policy_params", {"policy_params": {1: 2}}),
    ("policy_params", {"policy_params": {"x": math.nan}}),
    ("policy_params", {"policy_params": {"x": object()}}),
    ("policy_version", {"policy_version": -3}),
    ("jobs[1].job_id", {"jobs": (job("J1"), job("J1"))}),
    ("buffer.size", {"buffer": BufferHeader(-1.0, 0.0, 0.0)}),
    ("buffer.used", {"buffer": BufferHeader(10.0, math.nan, 0.0)}),
    ("buffer.drain_bandwidth", {"buffer": BufferHeader(10.0, 0.0, math.inf)}),
    ("pattern.key", {"pattern": PatternOrigin("a\nb", 0.0)}),
    ("pattern.origin", {"pattern": PatternOrigin("k", math.nan)}),
    ("pattern.origin", {"pattern": PatternOrigin("k", 1e9)}),  # after sent_at
]

# Values of the right type out of range: refused by validate(), named by job and field.
BAD_JOBS: list[tuple[str, dict[str, Any]]] = [
    ("job_id", {"job_id": ""}),
    ("user", {"user": None}),
    ("group", {"group": 3}),
    ("nodes", {"nodes": 0}),
    ("nodes", {"nodes": 10**9}),
    ("priority", {"priority": 0.0}),
    ("priority", {"priority": -1.0}),
    ("priority", {"priority": math.nan}),
    ("demand", {"demand": -1.0}),
    ("demand", {"demand": math.inf}),
    ("demand", {"demand": 1e30}),
    ("demand", {"demand": 5.0, "open_op": False}),
    ("usage_bytes", {"usage_bytes": -1.0}),
    ("usage_bytes", {"usage_bytes": math.nan}),
    ("progress", {"progress": -0.5}),
    ("transferred", {"transferred": -1.0}),
    ("released_at", {"released_at": 3.0}),
    ("released_at", {"released_at": -math.inf}),
    ("posted_at", {"posted_at": 1.0}),
    ("remaining", {"remaining": -1.0}),
    ("period_w", {"period_w": 0.0, "period_vol": 1.0}),
    ("period_w", {"period_w": 1e6, "period_vol": 1.0}),
    ("period_vol", {"period_w": 1.0, "period_vol": -1.0}),
    ("period_vol", {"period_w": 1.0}),  # a period has both
    ("period_vol", {"period_vol": 5.0}),
    ("period_learned", {"period_learned": True}),  # a learned period without one
    ("resident", {"resident": -1.0}),
    ("pending", {"pending": math.inf}),
    ("mean_volume", {"mean_volume": math.nan}),
]

# Values of the wrong type: no DigestJobs (so no Digest) can hold them.
BAD_TYPES: list[Any] = [
    ("nodes", {"nodes": 2.0}),
    pytest.param("nodes", {"nodes": True}, id="nodes-bool"),  # numpy would make it 1
    pytest.param("priority", {"priority": True}, id="priority-bool"),
    ("nodes", {"nodes": "8"}),
    ("priority", {"priority": "1"}),
    ("demand", {"demand": None}),
    ("open_op", {"open_op": 1}),
    ("period_learned", {"period_learned": 1}),
    ("resident", {"resident": "1"}),
]


@pytest.mark.parametrize(("field", "change"), BAD_DIGESTS, ids=[f for f, _ in BAD_DIGESTS])
def test_every_bad_digest_field_is_named(field: str, change: dict[str, Any]) -> None:
    bad = dataclasses.replace(GOOD, **change)
    with pytest.raises(DigestError) as exc:
        validate(bad)
    assert exc.value.field == field
    assert str(exc.value).startswith(f"{field}: ")
    membership = Membership("R1")
    out = membership.receive(bad, 0.0)
    assert out.status is Status.REJECTED and out.field == field
    assert membership.live_peers() == []


@pytest.mark.parametrize(("field", "change"), BAD_JOBS, ids=[f for f, _ in BAD_JOBS])
def test_every_bad_job_field_is_named(field: str, change: dict[str, Any]) -> None:
    bad = dataclasses.replace(
        GOOD, jobs=(GOOD.jobs[0], dataclasses.replace(GOOD.jobs[1], **change))
    )
    with pytest.raises(DigestError) as exc:
        validate(bad)
    assert exc.value.field == f"jobs[1].{field}"
    membership = Membership("R1")
    assert membership.receive(GOOD, 0.0).accepted
    out = membership.receive(dataclasses.replace(bad, sequence=2), 1.0)
    assert out.status is Status.REJECTED and out.field == f"jobs[1].{field}"
    assert membership.digests() == [GOOD]  # no effect on the global view


@pytest.mark.parametrize(("field", "change"), BAD_TYPES)
def test_a_column_of_the_wrong_type_is_refused_at_construction(
    field: str, change: dict[str, Any]
) -> None:
    rows = (GOOD.jobs[0], dataclasses.replace(GOOD.jobs[1], **change))
    with pytest.raises(DigestError) as exc:
        DigestJobs.from_rows(rows)
    assert exc.value.field == f"jobs.{field}"
    with pytest.raises(DigestError) as exc:
        dataclasses.replace(GOOD, jobs=rows)
    assert exc.value.field == f"jobs.{field}"


def test_not_a_digest_is_rejected() -> None:
    with pytest.raises(DigestError) as exc:
        validate("R2")  # type: ignore[arg-type]
    assert exc.value.field == "digest"
    out = Membership("R1").receive("R2", 0.0)  # type: ignore[arg-type]
    assert out.status is Status.REJECTED and out.field == "digest"


def test_good_digest_validates() -> None:
    validate(GOOD)


def test_rows_given_in_any_sequence_are_kept_as_columns() -> None:
    as_list = dataclasses.replace(GOOD, jobs=list(GOOD.jobs))
    assert isinstance(as_list.jobs, DigestJobs)
    assert as_list == GOOD
    validate(as_list)


def test_the_limits_are_those_of_every_door() -> None:
    # identifiers 1..256 printable characters, p_i ≤ 2^20, priority ≤ 1e9
    validate(dataclasses.replace(GOOD, replica_id="r" * 256))
    at_limit = digest("R2", (job("J1", nodes=1 << 20, priority=1e9, user="u" * 256),))
    validate(at_limit)
    over: list[tuple[str, JobDigest]] = [
        ("nodes", job("J1", nodes=(1 << 20) + 1)),
        ("priority", job("J1", priority=math.nextafter(1e9, math.inf))),
        ("user", job("J1", user="u" * 257)),
    ]
    for field, row in over:
        with pytest.raises(DigestError) as exc:
            validate(digest("R2", (row,)))
        assert exc.value.field == f"jobs[0].{field}"


# -- the one check against a per-job reference -----------------------------------------

# Values each field can hold as a column (what can come off the wire): numbers of
# any sign and size, NaN and infinities, odd strings. posted_at and remaining have
# no NaN here: as a column NaN is their "absent" (None in a row).
COLUMN_VALUES: dict[str, list[Any]] = {
    "job_id": ["", "x" * 300, "x" * 256, "ok", "a\x00b", "J0", "J3"],
    "user": ["", "x" * 257, "bob", "a\nb"],
    "group": ["", "g2", "\x7f"],
    "nodes": [0, 1, 8, -3, 1 << 20, (1 << 20) + 1, 10**9, 2**40],
    "open_op": [True, False],
    **{
        name: [math.nan, math.inf, -math.inf, -1.0, 0.0, 1e30, 1.5, -0.5, 3.0]
        for name in ("priority", "demand", "usage_bytes", "progress", "transferred")
    },
    "released_at": [math.nan, math.inf, -math.inf, -1.0, 0.0, 2.0],
    "posted_at": [None, math.inf, -math.inf, -1.0, 0.0, 2.0],
    "remaining": [None, math.inf, -math.inf, -1.0, 0.0, 7.0],
}
COLUMN_VALUES["priority"] += [1e9, 2e9]
COLUMN_VALUES["demand"] += [1e15, 2e15]


def reference_identifier(value: object) -> str | None:
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if value == "":
        return "must not be empty"
    if len(value) > 256:
        return "longer than 256 characters"
    if not value.isprintable():
        return "must be printable characters only"
    return None


def _range(ok: Callable[[Any], bool], what: str) -> Callable[[Any], str | None]:
    return lambda v: None if ok(v) else f"{what}, got {v!r}"


# One job's fields in the order the first bad one is named; NaN fails every range.
REFERENCE_JOB_CHECKS: list[tuple[str, Callable[[Any], str | None]]] = [
    ("job_id", reference_identifier),
    ("user", reference_identifier),
    ("group", reference_identifier),
    ("nodes", _range(lambda v: 1 <= v <= 1 << 20, "must be an integer in [1, 1048576]")),
    ("priority", _range(lambda v: 0.0 < v <= 1e9, "must be in (0, 1e+09]")),
    ("demand", _range(lambda v: 0.0 <= v <= 1e15, "must be in [0, 1e+15] bytes/s")),
    ("usage_bytes", _range(lambda v: 0.0 <= v < math.inf, "must be finite and >= 0")),
    ("progress", _range(lambda v: 0.0 <= v < math.inf, "must be finite and >= 0")),
    ("transferred", _range(lambda v: 0.0 <= v < math.inf, "must be finite and >= 0")),
    (
        "released_at",
        _range(
            lambda v: -math.inf < v <= 0.0,
            "must be finite and <= sent_at (the send instant)",
        ),
    ),
    (
        "posted_at",
        _range(
            lambda v: v is None or -math.inf < v <= 0.0,
            "must be finite and <= sent_at (the send instant), or absent",
        ),
    ),
    (
        "remaining",
        _range(lambda v: v is None or 0.0 <= v < math.inf, "must be finite and >= 0, or absent"),
    ),
]


def reference_error(rows: list[JobDigest]) -> str | None:
    """The digest check spelled out job by job: the first job with a bad field (its
    first bad field) or a job id seen before, whichever comes first."""
    seen: set[str] = set()
    for i, row in enumerate(rows):
        for name, check in REFERENCE_JOB_CHECKS:
            problem = check(getattr(row, name))
            if problem:
                return f"jobs[{i}].{name}: {problem}"
        if row.demand > 0.0 and not row.open_op:
            return f"jobs[{i}].demand: demand > 0 without an open operation"
        if row.job_id in seen:
            return f"jobs[{i}].job_id: duplicate job id {row.job_id!r}"
        seen.add(row.job_id)
    return None


@pytest.mark.parametrize("seed", range(40))
def test_the_check_gives_the_per_job_references_verdict_and_message(seed: int) -> None:
    # validate() checks all jobs at once as arrays; it must accept exactly what the
    # job-by-job reference accepts and name the same first bad job and field, for a
    # digest built in process and for the same digest decoded from the wire.
    rng = random.Random(seed)
    failed = 0
    for _ in range(100):
        rows = [
            job(f"J{i}", nodes=rng.choice([1, 8]), demand=rng.choice([0.0, 5.0])) for i in range(5)
        ]
        for _ in range(rng.randint(0, 3)):
            i, name = rng.randrange(5), rng.choice(sorted(COLUMN_VALUES))
            rows[i] = dataclasses.replace(rows[i], **{name: rng.choice(COLUMN_VALUES[name])})
        expected = reference_error(rows)
        built = digest("R2", tuple(rows))
        assert error_of(built) == expected, rows
        try:
            from_proto(pb.Digest.FromString(to_proto(built).SerializeToString()))
            wire_error = None
        except DigestError as exc:
            wire_error = str(exc)
        assert wire_error == expected, rows
        failed += expected is not None
    assert 10 < failed < 100  # both verdicts were exercised


# -- columns ------------------------------------------------------------------------


def test_columns_of_different_lengths_are_rejected_by_name() -> None:
    good = DigestJobs.from_rows([job("J1"), job("J2")])
    fields = {name: getattr(good, name) for name in DigestJobs.__slots__}
    bad = digest("R2", DigestJobs(**{**fields, "remaining": good.remaining[:1]}))
    with pytest.raises(DigestError) as err:
        validate(bad)
    assert err.value.field == "jobs.remaining"
    membership = Membership("R1")
    assert membership.receive(bad, 0.0).status is Status.REJECTED
    assert membership.live_peers() == []


def test_columns_and_rows_of_one_digest_are_equal_and_read_only() -> None:
    rows = (job("J1", remaining=5.0), job("J2", demand=0.0, transferred=3.0))
    cols = DigestJobs.from_rows(rows)
    assert digest("R2", cols) == digest("R2", rows) and cols.rows() == rows
    assert tuple(cols) == rows and cols[1] == rows[1] and len(cols) == 2
    assert cols != DigestJobs.from_rows((rows[0], job("J2", demand=0.0)))
    with pytest.raises(ValueError, match="read-only"):
        cols.demand[0] = 1.0
    with pytest.raises(AttributeError):
        cols.demand = cols.progress  # type: ignore[misc]


def test_columns_are_copies_of_what_the_caller_passed() -> None:
    demand = [5.0, 0.0]
    cols = DigestJobs.from_rows([job("J1", demand=5.0), job("J2", demand=0.0)])
    fields = {name: getattr(cols, name) for name in DigestJobs.__slots__}
    copied = DigestJobs(**{**fields, "demand": demand})
    demand[0] = -1.0
    assert copied.demand.tolist() == [5.0, 0.0]


# -- the wire -------------------------------------------------------------------------

DIGEST = FULL_DIGEST
ROWS = FULL_ROWS


def test_round_trip_keeps_every_field_including_absent_optionals() -> None:
    wire = to_proto(DIGEST).SerializeToString()
    assert from_proto(pb.Digest.FromString(wire)) == DIGEST


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda m: m.jobs.nodes.__setitem__(1, 0), "jobs[1].nodes"),
        (lambda m: m.jobs.user.__setitem__(1, "a\x00b"), "jobs[1].user"),
        (lambda m: m.jobs.job_id.__setitem__(1, "a"), "jobs[1].job_id"),  # a duplicate
        (lambda m: m.jobs.posted_at.__setitem__(0, float("inf")), "jobs[0].posted_at"),
        (lambda m: m.jobs.progress.__setitem__(1, float("nan")), "jobs[1].progress"),
        (lambda m: m.jobs.demand.pop(), "jobs.demand"),  # columns of different lengths
        (lambda m: m.jobs.job_id.append("c"), "jobs.user"),
        (lambda m: setattr(m, "capacity", float("nan")), "capacity"),
        (lambda m: setattr(m, "policy_params_json", "{"), "policy_params_json"),
        (lambda m: setattr(m, "policy_params_json", "[1]"), "policy_params_json"),
        (lambda m: setattr(m, "sequence", -1), "sequence"),
        (
            lambda m: m.jobs.demand.__setitem__(1, 5.0),  # demand without an open operation
            "jobs[1].demand",
        ),
    ],
)
def test_malformed_proto_names_the_field(edit: Callable[[pb.Digest], object], field: str) -> None:
    msg = to_proto(DIGEST)
    edit(msg)
    with pytest.raises(DigestError) as err:
        from_proto(msg)
    assert err.value.field == field


def test_a_digest_of_the_previous_version_has_no_periods_and_no_buffer() -> None:
    msg = to_proto(DIGEST)
    for name in ("period_w", "period_vol", "period_learned", "resident", "pending"):
        msg.jobs.ClearField(name)
    msg.jobs.ClearField("mean_volume")
    msg.ClearField("buffer")
    msg.ClearField("pattern")
    got = from_proto(msg)
    assert got.buffer == NO_BUFFER and got.pattern == NO_PATTERN
    assert all(r.period_w is None and r.resident == 0.0 for r in got.jobs)
    assert got.jobs.job_id == DIGEST.jobs.job_id


def test_jobs_travel_as_columns_and_absent_values_as_nan() -> None:
    msg = to_proto(DIGEST)
    assert list(msg.jobs.job_id) == ["a", "b", "c"]
    assert list(msg.jobs.nodes) == [4, 1, 2]
    assert msg.jobs.posted_at[0] == -1.0 and math.isnan(msg.jobs.posted_at[1])
    assert msg.jobs.remaining[0] == 500.0 and math.isnan(msg.jobs.remaining[1])
    got = from_proto(pb.Digest.FromString(msg.SerializeToString()))
    assert isinstance(got.jobs, DigestJobs)
    assert got.jobs[1] == ROWS[1]  # NaN comes back as None
    assert tuple(got.jobs) == ROWS and got.jobs == DIGEST.jobs


# -- this replica's digest ---------------------------------------------------------------


def test_digest_of_the_job_table() -> None:
    now = [100.0]
    table = JobTable(lambda: now[0], heartbeat_timeout=3, job_retention=10, demand_headroom=1.1)
    s = table.open_session(JobMeta("j", "u", "g", 2, 1.0), "c", "h")
    table.open_session(JobMeta("idle", "u", "g", 1, 1.0), "c", "h")
    now[0] = 101.0
    table.post(s, 1, OpKind.WRITE, 1000)
    table.usage(s, 300, 1, 0.0, 0.25, False)
    now[0] = 102.0
    seen: dict[str, int] = {}

    def build(sequence: int) -> Digest:
        return build_digest(
            table,
            replica_id="r1",
            incarnation=1,
            sequence=sequence,
            capacity=100.0,
            node_bandwidth=10.0,
            policy=("fair-share", {}, 0, "r1"),
            usage_seen=seen,
            now=now[0],
        )

    d = build(1)
    validate(d)
    assert (d.sequence, d.policy, d.policy_version) == (1, "fair-share", 0)
    idle, j = d.jobs
    assert d.sent_at == 102.0  # times are instants on the sender's clock: 2 s and 1 s before
    assert (j.job_id, j.open_op, j.released_at, j.posted_at, j.remaining) == (
        "j",
        True,
        100.0,
        101.0,
        700.0,
    )
    assert j.usage_bytes == 300 and j.demand > 0
    assert (idle.open_op, idle.demand, idle.posted_at) == (False, 0.0, None)
    d2 = build(2)
    assert d2.jobs[1].usage_bytes == 0  # only what moved since the previous digest


def test_a_column_that_says_none_for_every_job_is_not_sent() -> None:
    plain = dataclasses.replace(DIGEST, jobs=tuple(dataclasses.replace(r, period_w=None,
        period_vol=None, period_learned=False, resident=0.0, pending=0.0, mean_volume=0.0)
        for r in ROWS))  # fmt: skip
    msg = to_proto(plain)
    for name in ("period_w", "period_vol", "period_learned", "resident", "pending"):
        assert len(getattr(msg.jobs, name)) == 0, name
    assert len(msg.jobs.mean_volume) == 0
    assert from_proto(pb.Digest.FromString(msg.SerializeToString())) == plain
    assert len(to_proto(DIGEST).jobs.period_w) == len(ROWS)  # one job has a period: all sent
