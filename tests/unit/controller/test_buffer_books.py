"""The burst buffer's books (controller/buffer.py, docs/capacity.md).

The invariant, drawn by hypothesis over random sequences of writes, drains, stale and skipped
reports, grants delivered late, broken and clean stream ends and reconnections: what the
clients can really occupy — Σ true resident + Σ unused space of the limits they hold — never
exceeds the books' ``used``, and ``used`` never exceeds S.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.clock import FakeClock

from burstctl.controller.buffer import BufferBooks

MiB = 1 << 20
S = 2 * MiB
# Sized by the hypothesis profile (tests/conftest.py): `ci` for make test, `thorough` for
# make test-all.
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Client:
    """A mount's true state, and what the controller has not heard of yet."""

    sid: int
    resident: int = 0
    pending: int = 0
    added: int = 0
    limit: int = 0  # the limit the client holds (lags the books' one)
    open: bool = True
    reports: deque[tuple[int, int, int, bool]] = field(default_factory=deque)
    grants: deque[int] = field(default_factory=deque)


# Writes, grants and their delivery weigh more: the buffer must fill for the bound to bite.
KINDS = (
    ["write"] * 4 + ["grant", "limit"] * 3 + ["snap", "deliver"] * 2 + ["drain", "close", "open"]
)
ACTION = st.tuples(
    st.sampled_from(KINDS),
    st.integers(0, 1),  # which client
    st.one_of(st.integers(0, S // 2), st.sampled_from([S // 8, S // 2])),  # bytes
    st.booleans(),  # clean close / waiting / skip a report
)


def _occupancy(clients: list[Client]) -> int:
    return sum(c.resident + (max(0, c.limit - c.added) if c.open else 0) for c in clients)


@SETTINGS
@given(st.lists(ACTION, min_size=40, max_size=160))
def test_used_bounds_what_clients_can_occupy_and_never_exceeds_s(actions: list) -> None:
    books = BufferBooks(S, clock=FakeClock(0.0), min_chunk=64 * 1024)
    clients = [Client(sid=i + 1) for i in range(2)]
    next_sid = 10
    for c in clients:
        books.open(c.sid, f"job-{c.sid % 2}", f"client-{c.sid}", f"host-{c.sid}", 0, 0, 0, "")
    for kind, i, n, flag in actions:
        c = clients[i]
        if kind == "write" and c.open:
            n = min(n, c.limit - c.added)  # a write takes what it may (it waits for more)
        if kind == "write" and c.open and n > 0:
            c.added += n
            c.resident += n
            c.pending += n
        elif kind == "drain":
            k = min(n, c.resident)
            c.resident -= k
            c.pending = min(c.pending, c.resident)
        elif kind == "snap" and c.open:
            c.reports.append((c.resident, c.pending, c.added, flag))
        elif kind == "deliver" and c.reports:
            if flag and len(c.reports) > 1:
                c.reports.popleft()  # reports are ordered, but one may be superseded
            resident, pending, added, waiting = c.reports.popleft()
            assert books.added_problem(f"client-{c.sid}", added) is None
            # the session's rate, for its chunk: n bytes/s (so chunks up to S / 2)
            books.report(c.sid, resident, pending, added, "", waiting, float(n))
        elif kind == "grant":
            for sid, limit in books.grant().items():
                owner = next(x for x in clients if x.sid == sid)
                owner.grants.append(limit)
        elif kind == "limit" and c.grants:
            while c.grants:  # allocations are ordered on the stream; the newest wins
                c.limit = c.grants.popleft()
        elif kind == "close" and c.open:
            if flag:  # Goodbye: the last report first
                books.report(c.sid, c.resident, c.pending, c.added, "", False, 0.0)
            books.close(c.sid, clean=flag)
            c.open = False
            c.reports.clear()
            c.grants.clear()
        elif kind == "open" and not c.open:
            books.close(c.sid)  # idempotent for a closed one
            c.sid, next_sid = next_sid, next_sid + 1
            c.open = True
            c.limit = c.added  # a new stream starts with no unused reservation
            books.open(
                c.sid, f"job-{(i + 1) % 2}", f"client-{i + 1}", f"host-{i + 1}",
                c.resident, c.pending, c.added, "",
            )  # fmt: skip
        assert books.used == books.recount()
        assert _occupancy(clients) <= books.used <= S, (kind, i, n, flag)


def test_grants_are_shared_in_proportion_to_rates_when_space_is_short() -> None:
    books = BufferBooks(4 * MiB, clock=FakeClock(0.0), min_chunk=MiB, horizon=1.0)
    books.open(1, "a", "ca", "h1", 0, 0, 0, "")
    books.open(2, "b", "cb", "h2", 0, 0, 0, "")
    # rates 3 MiB/s and 1 MiB/s: chunks of 3 and 1 MiB fit (4 MiB): both in full
    books.report(1, 0, 0, 0, "", True, 3.0 * MiB)
    books.report(2, 0, 0, 0, "", True, 1.0 * MiB)
    assert books.grant() == {1: 3 * MiB, 2: 1 * MiB}
    # Now both fill up and want again; 0 free: nothing.
    books.report(1, 3 * MiB, 3 * MiB, 3 * MiB, "", True, 3.0 * MiB)
    books.report(2, 1 * MiB, 1 * MiB, 1 * MiB, "", True, 1.0 * MiB)
    assert books.grant() == {}
    # 2 MiB drain away (1 each): free 2 MiB shared 3:1 of the wanted 3 and 1 MiB chunks.
    books.report(1, 2 * MiB, 2 * MiB, 3 * MiB, "", True, 3.0 * MiB)
    books.report(2, 0, 0, 1 * MiB, "", True, 1.0 * MiB)
    limits = books.grant()
    grant_a = limits[1] - 3 * MiB
    grant_b = limits[2] - 1 * MiB
    assert grant_a + grant_b == 2 * MiB
    assert abs(grant_a - 3 * grant_b) <= 2  # proportional to the rates (rounding)
    assert books.used == 4 * MiB


def test_equal_shares_when_rates_are_zero_and_release_on_goodbye() -> None:
    books = BufferBooks(3 * MiB, clock=FakeClock(0.0), min_chunk=2 * MiB)
    for sid in (1, 2, 3):
        books.open(sid, f"j{sid}", f"c{sid}", "h", 0, 0, 0, "")
        books.report(sid, 0, 0, 0, "", True, 0.0)
    limits = books.grant()
    assert sorted(limits.values()) == [MiB, MiB, MiB]
    assert books.free == 0
    books.report(1, 0, 0, 0, "", False, 0.0)
    books.close(1)  # goodbye: its unused MiB is released at once
    assert books.free == MiB
    assert books.grant()  # and goes to the others who still want
    assert books.free == 0


def test_a_broken_stream_parks_its_reservation_and_a_new_hello_replaces_it() -> None:
    clock = FakeClock(0.0)
    books = BufferBooks(8 * MiB, clock=clock, retention=10.0)
    books.open(1, "j", "c1", "node7", 0, 0, 0, "")
    books.report(1, 0, 0, 0, "", True, 0.0)
    books.grant()
    books.report(1, MiB, MiB, MiB, "", False, 0.0)
    reserved = books.jobs()["j"].reserved
    books.close(1, clean=False)
    assert books.used == reserved  # resident + unused: it may have written since
    # The mount restarts (new client id, same host): its Hello says what it holds now.
    books.open(2, "j", "c2", "node7", 3 * MiB, MiB, 0, "")
    assert books.used == 3 * MiB and books.jobs()["j"].resident == 3 * MiB
    books.close(2)
    assert books.jobs()["j"].resident == 3 * MiB  # parked: still on the buffer
    clock.now = 11.0
    books.expire()
    assert books.used == 0 and "j" not in books.jobs()


def test_a_parked_resident_stays_until_claimed_or_released_by_default() -> None:
    """Its bytes are on the buffer until its mount says otherwise: dropping it on a timer
    would let the books grant space that is not there."""
    clock = FakeClock(0.0)
    books = BufferBooks(8 * MiB, clock=clock)  # the default: no retention
    for sid, host in ((1, "node7"), (2, "node8")):
        books.open(sid, "j", f"c{sid}", host, 2 * MiB, 0, 2 * MiB, "")
        books.close(sid)
    clock.now = 1e9
    books.expire()
    assert books.used == 4 * MiB and books.jobs()["j"].resident == 4 * MiB
    assert books.release("j", "node7") == 1  # an operator: node7 is gone for good
    assert books.used == 2 * MiB == books.recount()
    assert books.release("j") == 1 and books.release("j") == 0
    assert books.used == 0 and "j" not in books.jobs()


def test_added_must_not_decrease_within_a_client() -> None:
    books = BufferBooks(8 * MiB, clock=FakeClock(0.0))
    books.open(1, "j", "c1", "h", 0, 0, 5, "")
    assert books.added_problem("c1", 4) is not None
    assert books.added_problem("c1", 5) is None
    assert books.added_problem("other", 0) is None


def test_a_waiting_writer_larger_than_a_chunk_gets_through() -> None:
    books = BufferBooks(64 * MiB, clock=FakeClock(0.0), min_chunk=MiB)
    books.open(1, "j", "c1", "h", 0, 0, 0, "")
    limit = 0
    for _ in range(4):  # a 6 MiB write waits: the grant doubles until it fits
        books.report(1, 0, 0, 0, "", True, 0.0)
        limit = books.grant().get(1, limit)
    assert limit >= 6 * MiB


def test_no_capacity_grants_nothing_and_still_books_residents() -> None:
    books = BufferBooks(None, clock=FakeClock(0.0))
    books.open(1, "j", "c1", "h", 2 * MiB, MiB, 2 * MiB, "EACCES")
    books.report(1, 2 * MiB, MiB, 2 * MiB, "EACCES", True, 0.0)
    assert books.grant() == {} and books.limit_of(1) is None and books.view() is None
    assert books.jobs()["j"].drain_error == "EACCES"


def test_changed_fires_on_steps_of_the_fill_only() -> None:
    books = BufferBooks(100 * MiB, clock=FakeClock(0.0))
    fired: list[int] = []
    books.changed.connect(lambda: fired.append(books.used))
    books.open(1, "j", "c1", "h", 0, 0, 0, "")
    books.report(1, MiB, 0, MiB, "", False, 0.0)  # 1 % of S: no step
    assert fired == []
    books.report(1, 6 * MiB, 0, 6 * MiB, "", False, 0.0)  # crosses 5 %
    assert len(fired) == 1
    books.report(1, 6 * MiB, 6 * MiB, 6 * MiB, "", False, 0.0)  # the job's pending: a step
    assert len(fired) == 2
