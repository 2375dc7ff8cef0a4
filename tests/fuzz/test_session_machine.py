"""The Session protocol as a hypothesis state machine against a live controller process.

Interleaved raw sessions send random valid and invalid messages (Hello variants, OpPosted
of good and bad kinds, volumes and ids, OpCompleted of open and unknown ids, Usage with
negative, NaN and infinite values, Batches that are oversize, nested or hold a Hello,
Goodbye, messages before Hello, floods of unknown completions). A model of each session
says what the controller must do; an honest session runs alongside all along.

Invariants (after every step; the RSS and the honest session's harm are sampled then and
asserted once the run is over, as they depend on state that outlives an example; how a
session ended is checked as it ends):

- the controller process is alive and its RSS stays within ``RSS_BOUND`` of its level once
  the honest session was attached;
- the honest session is never harmed: its stream goes on, each allocation is renewed
  within its lease, its rate stays > 0 while its operation is open;
- a session the model says is valid ends with OK on Goodbye (or is refused for a limit with
  RESOURCE_EXHAUSTED / FAILED_PRECONDITION and a message); one the model says broke the
  protocol ends with INVALID_ARGUMENT naming a field it broke (or one of the other two
  rejection codes), never anything else and never without a message;
- every Error notice is a rejection code or NOT_FOUND for an unknown completion, with a
  message.

``BURSTCTL_FUZZ_PROFILE=long`` runs many more examples (bench/fuzz_long.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from fuzz_support import (
    FUZZ_PROFILE,
    MAX_BATCH,
    MAX_NODES,
    MAX_OP_VOLUME,
    MAX_PRIORITY,
    MAX_TEXT,
    NOTICE_CODES,
    REJECTION_CODES,
    HonestSession,
    Model,
    RawStream,
    apply,
    hello_problems,
    rss,
)
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support import ControllerProcess
from support.grpc import hello

from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration

MiB = 1 << 20
RSS_BOUND = 50 * MiB  # issue 15: within 50 MiB of the idle level
MAX_LIVE = 4  # interleaved fuzz sessions at a time
# Unknown completions per flood step; bench/fuzz_long.py floods more (issue 15 finding 1
# is test_unknown_completion_flood_keeps_memory_bounded below).
FLOOD = (50, 500)

# ---------------------------------------------------------------------------- strategies
# Each kind of message comes as a well-formed one and as a wide one (any value of each
# field, the edges first). Well-formed ones are drawn far more often, so that sessions live
# for many steps and the controller's state (open operations, jobs, allocations) grows;
# each broken message then usually breaks one field, whose name the rejection must carry.

INT64 = st.integers(-(2**63), 2**63 - 1)
UINT64 = st.integers(0, 2**64 - 1)
GOODBYE = pb.ClientMessage(goodbye=pb.Goodbye())
EMPTY = pb.ClientMessage()


@st.composite
def weighted(draw: st.DrawFn, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
    """``good`` four times in five (``one_of`` would flatten ``bad``'s branches into its own
    and weigh them one by one)."""
    return draw(good if draw(st.sampled_from([True, True, True, True, False])) else bad)


texts = st.one_of(
    st.sampled_from(["", "j\x00", "j\n", "x" * (MAX_TEXT + 1), "é" * MAX_TEXT, "j1"]),
    st.text(max_size=8),
)
good_hellos = st.builds(
    lambda job, nodes, prio: hello(job, nodes, priority=prio, client_id="fuzz"),
    st.sampled_from(["j1", "j2", "j3"]),
    st.integers(1, 8),
    st.sampled_from([0.0, 1.0, 2.5]),
)
bad_hellos = st.builds(
    lambda job, user, group, nodes, prio, client, host: hello(
        job, nodes, user=user, group=group, client_id=client, priority=prio, host=host
    ),
    texts,
    weighted(st.just("alice"), texts),
    weighted(st.just("g"), texts),
    st.one_of(
        st.sampled_from([0, 1, MAX_NODES, MAX_NODES + 1, -1]), st.integers(-(2**31), 2**31 - 1)
    ),
    st.one_of(st.sampled_from([0.0, -1.0, math.nan, math.inf, MAX_PRIORITY * 2]), st.floats()),
    st.sampled_from(["", "c", "x" * (MAX_TEXT + 1)]),
    st.sampled_from(["", "h", "x" * (MAX_TEXT + 1)]),
)
hellos = st.one_of(good_hellos, bad_hellos)


def _post(i: int, k: int, v: int) -> pb.ClientMessage:
    return pb.ClientMessage(op_posted=pb.OpPosted(op_id=i, kind=k, volume=v))


good_posts = st.builds(
    _post,
    st.integers(1, 40),
    st.sampled_from([pb.OP_KIND_READ, pb.OP_KIND_WRITE, pb.OP_KIND_METADATA]),
    st.one_of(st.integers(0, 64 * MiB), st.just(MAX_OP_VOLUME)),
)
bad_posts = st.builds(
    _post,
    st.one_of(st.integers(0, 6), UINT64),
    st.sampled_from([0, 1, 2, 3, 4, 42, -1, 2**31 - 1]),
    st.one_of(
        st.sampled_from([0, MAX_OP_VOLUME, MAX_OP_VOLUME + 1, -1, 2**63 - 1, -(2**63)]), INT64
    ),
)


def _complete(i: int) -> pb.ClientMessage:
    return pb.ClientMessage(op_completed=pb.OpCompleted(op_id=i))


good_completions = st.builds(_complete, st.integers(1, 40))  # open or not: both are valid
bad_completions = st.builds(_complete, st.one_of(st.just(0), UINT64))


def _usage(b: int, o: int, w: float, i: float, x: bool) -> pb.ClientMessage:
    return pb.ClientMessage(
        usage=pb.Usage(bytes=b, ops=o, wait_seconds=w, interval_seconds=i, waiting=x)
    )


good_usages = st.builds(
    _usage,
    st.integers(0, 10 * MiB),
    st.integers(0, 100),
    st.floats(0, 10),
    st.floats(0, 10),
    st.booleans(),
)
counts = st.one_of(st.sampled_from([-1, 2**63 - 1, -(2**63)]), INT64)
seconds = st.one_of(
    st.sampled_from([0.0, -0.0, -1e-300, math.nan, math.inf, -math.inf, 1e308]), st.floats()
)
bad_usages = st.builds(
    _usage,
    weighted(st.just(0), counts),
    weighted(st.just(0), counts),
    weighted(st.just(0.0), seconds),
    weighted(st.just(0.1), seconds),
    st.booleans(),
)
good_singles = st.one_of(good_posts, good_completions, good_usages)
bad_singles = st.one_of(
    bad_posts, bad_completions, bad_usages, hellos, st.just(EMPTY), st.just(GOODBYE)
)


def _batch(messages: list[pb.ClientMessage]) -> pb.ClientMessage:
    return pb.ClientMessage(batch=pb.Batch(messages=messages))


good_batches = st.builds(_batch, st.lists(good_singles, max_size=8))
bad_batches = st.one_of(
    st.builds(
        _batch,
        st.lists(
            weighted(good_singles, st.one_of(bad_singles, good_batches)), min_size=1, max_size=8
        ),
    ),
    # oversize: one more than a Batch may hold, every message valid on its own
    st.just(_batch([pb.ClientMessage(usage=pb.Usage()) for _ in range(MAX_BATCH + 1)])),
)
any_message = weighted(st.one_of(good_singles, good_batches), st.one_of(bad_singles, bad_batches))
first_messages = weighted(good_hellos, st.one_of(bad_hellos, any_message))


def check_notices(stream: RawStream) -> None:
    for notice in stream.notices():
        assert notice.code in NOTICE_CODES, notice
        assert notice.message, notice
        if notice.code == "NOT_FOUND":
            assert notice.field.endswith("op_completed.op_id"), notice


def check_end(model: Model, timeout: float = 15.0) -> None:
    """The session's stream ended as its model says it must."""
    s = model.stream
    if not model.fate.over:  # still valid: leave on purpose
        s.send(GOODBYE)
        model.fate.ended_ok = True
    s.done_writing()
    code, details = s.wait_end(timeout)
    check_notices(s)
    if model.fate.broke:
        assert code in REJECTION_CODES, (code, details, model.fate.broke)
        assert details, code
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            assert any(f in details for f in model.fate.broke), (details, model.fate.broke)
    else:  # a limit may refuse a valid session, but only with a rejection code and a message
        assert code is grpc.StatusCode.OK or (
            code in REJECTION_CODES - {grpc.StatusCode.INVALID_ARGUMENT} and details
        ), (code, details)


# ---------------------------------------------------------------------------- the machine


def session_machine(
    controller: ControllerProcess,
    channel: grpc.Channel,
    honest: HonestSession,
    peak_rss: list[int],
    harms: list[str],
    flood: tuple[int, int],
) -> type[RuleBasedStateMachine]:
    assert controller.proc is not None
    pid = controller.proc.pid
    peak = peak_rss

    class SessionMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.sessions: list[Model] = []

        def live(self) -> list[Model]:
            return [m for m in self.sessions if not m.fate.over]

        def send(self, model: Model, msg: pb.ClientMessage) -> None:
            model.stream.send(msg)
            model.sent += 1
            if not model.greeted:
                bad = hello_problems(msg)
                model.greeted = True
                if bad:
                    model.fate.broke = bad
            else:
                apply(model, msg)

        @precondition(lambda self: len(self.live()) < MAX_LIVE)
        @rule(first=first_messages)
        def open_session(self, first: pb.ClientMessage) -> None:
            model = Model(RawStream(channel))
            self.sessions.append(model)
            self.send(model, first)

        @precondition(lambda self: self.live())
        @rule(data=st.data(), msg=any_message)
        def message(self, data: st.DataObject, msg: pb.ClientMessage) -> None:
            self.send(data.draw(st.sampled_from(self.live())), msg)

        @precondition(lambda self: any(m.greeted for m in self.live()))
        @rule(data=st.data())
        def post_and_complete(self, data: st.DataObject) -> None:
            """A valid operation's life, so that complete-of-known-id is exercised."""
            model = data.draw(st.sampled_from([m for m in self.live() if m.greeted]))
            free = next(i for i in range(1, 1 << 20) if i not in model.ops)
            self.send(model, pb.ClientMessage(op_posted=pb.OpPosted(op_id=free, kind=1)))
            if data.draw(st.booleans()):
                self.send(model, pb.ClientMessage(op_completed=pb.OpCompleted(op_id=free)))

        @precondition(lambda self: any(m.greeted for m in self.live()))
        @rule(data=st.data(), n=st.integers(*flood))
        def flood_unknown_completions(self, data: st.DataObject, n: int) -> None:
            """Completions of operations never posted: each is a NOT_FOUND notice."""
            model = data.draw(st.sampled_from([m for m in self.live() if m.greeted]))
            unknown = max(model.ops, default=0) + 1_000_000
            for start in range(0, n, MAX_BATCH):
                msgs = [
                    pb.ClientMessage(op_completed=pb.OpCompleted(op_id=unknown))
                    for _ in range(min(MAX_BATCH, n - start))
                ]
                self.send(model, pb.ClientMessage(batch=pb.Batch(messages=msgs)))

        @precondition(lambda self: self.sessions)
        @rule(data=st.data())
        def settle(self, data: st.DataObject) -> None:
            """Ends one session (Goodbye if it is still valid) and checks how it ended."""
            model = data.draw(st.sampled_from(self.sessions))
            self.sessions.remove(model)
            check_end(model)

        @invariant()
        def controller_alive(self) -> None:
            assert controller.proc is not None and controller.proc.poll() is None, "".join(
                controller.log[-40:]
            )

        @invariant()
        def memory_sampled(self) -> None:
            # Asserted once the run is over (run_machine): RSS is external state that grows
            # over examples, so hypothesis could not shrink a failure to one example.
            peak[0] = max(peak[0], rss(pid))

        @invariant()
        def honest_sampled(self) -> None:
            # Asserted once the run is over, like the RSS: the first harm seen is kept.
            if harms or (harm := honest.harm()) is None:
                return
            harms.append(harm)

        def teardown(self) -> None:
            try:
                for model in self.sessions:
                    check_end(model)
            finally:
                for model in self.sessions:
                    model.stream.cancel()

    return SessionMachine


@dataclass
class MachineRun:
    """What one run of the machine saw (asserted by the test, printed by bench/fuzz_long.py)."""

    rss_growth: int  # bytes, peak RSS over the run minus RSS before it
    harms: list[str]  # the first harm to the honest session, if any
    error: BaseException | None  # what hypothesis reported (its shrunk failure)


def run_machine(
    controller: ControllerProcess,
    channel: grpc.Channel,
    honest: HonestSession,
    profile: str,
    flood: tuple[int, int] = FLOOD,
) -> MachineRun:
    """Runs the machine with ``profile`` against ``controller``."""
    assert controller.proc is not None
    baseline = rss(controller.proc.pid)
    peak = [baseline]
    harms: list[str] = []
    machine = session_machine(controller, channel, honest, peak, harms, flood)
    error = None
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                settings.get_profile(profile),
                stateful_step_count=50,
                # No shrinking: replaying steps against a controller whose state outlives
                # each example is slow and not always faithful; the failing run's steps are
                # printed as they were.
                phases=(Phase.explicit, Phase.reuse, Phase.generate),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            ),
        )
    except Exception as exc:  # reported with the other figures
        error = exc
    return MachineRun(peak[0] - baseline, harms, error)


@pytest.mark.timeout(180)
def test_session_protocol_state_machine(
    fuzz_controller: ControllerProcess, fuzz_channel: grpc.Channel, honest: HonestSession
) -> None:
    run = run_machine(fuzz_controller, fuzz_channel, honest, FUZZ_PROFILE)
    if run.error is not None:
        raise run.error
    assert not run.harms, f"the honest session was harmed: {run.harms[0]}"
    assert run.rss_growth < RSS_BOUND, f"controller RSS grew by {run.rss_growth / MiB:.1f} MiB"
    assert honest.harm() is None


@pytest.mark.timeout(120)
def test_unknown_completion_flood_keeps_memory_bounded(
    fuzz_controller: ControllerProcess, fuzz_channel: grpc.Channel, honest: HonestSession
) -> None:
    """300k completions of an operation never posted, read by the client as they come:
    the controller's RSS stays within 50 MiB of its level before, the honest session is
    not harmed, and every notice is NOT_FOUND naming the field."""
    assert fuzz_controller.proc is not None
    pid = fuzz_controller.proc.pid
    baseline = peak = rss(pid)
    flood = RawStream(fuzz_channel)
    flood.send(hello("flood", client_id="fuzz"))
    unknown = pb.ClientMessage(op_completed=pb.OpCompleted(op_id=12345))
    for _ in range(300):
        flood.send(pb.ClientMessage(batch=pb.Batch(messages=[unknown] * MAX_BATCH)))
        peak = max(peak, rss(pid))
    flood.send(GOODBYE)
    flood.done_writing()
    while not flood.ended.wait(0.05):  # sampling the RSS until the stream ends
        peak = max(peak, rss(pid))
    assert flood.code is grpc.StatusCode.OK, flood.details
    check_notices(flood)
    assert honest.harm() is None, honest.harm()
    assert peak - baseline < RSS_BOUND, f"controller RSS grew by {(peak - baseline) / MiB:.0f} MiB"
