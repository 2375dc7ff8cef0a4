"""Random bytes as the serialized request of every gRPC method of a live controller.

Each method of ``burstctl.v1.Controller`` and ``burstctl.v1.Peer`` is called on a raw
channel with identity serializers, so what hypothesis draws (``binary()``) goes on the
wire as it is. Whatever the bytes, the controller answers as the protocol documents:

- ``Controller/Session``: bytes that do not decode, or decode to anything but a valid
  Hello, end the stream with INVALID_ARGUMENT and a message (``message`` for undecodable
  bytes); after a valid Hello the same holds for the next message, and bytes that decode
  to a valid message leave the session alive (Goodbye then ends it with OK).
- ``Peer/Exchange``: INVALID_ARGUMENT naming the field, or a reply that does not accept
  the digest (this replica's only peer never answered, so no sender is known).
- ``Peer/Stream``: a ``rejected`` (or ``stale``/``duplicate``) reply per digest, and the
  stream goes on.

All along, an honest session keeps its allocation (renewed within its lease, rate > 0)
and the controller process stays up.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fuzz_support import (
    FUZZ_ENV,
    FUZZ_PROFILE,
    REJECTION_CODES,
    HonestSession,
    Model,
    apply,
    hello_problems,
)
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support import ControllerProcess
from support.grpc import hello

from burstctl.controller.peers import PEER_SERVICE_NAME
from burstctl.controller.servicer import SERVICE_NAME
from burstctl.proto.burstctl.v1 import controller_pb2 as pb
from burstctl.proto.burstctl.v1 import peer_pb2

pytestmark = pytest.mark.integration

SESSION = f"/{SERVICE_NAME}/Session"
EXCHANGE = f"/{PEER_SERVICE_NAME}/Exchange"
STREAM = f"/{PEER_SERVICE_NAME}/Stream"
NOT_ACCEPTED = {"rejected", "stale", "duplicate"}
TIMEOUT = 10.0

# The controller and the honest session live for the whole test, across examples: that
# one controller survives every input is the point.
GARBAGE = settings(
    settings.get_profile(FUZZ_PROFILE),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Short byte strings hit the decoder's corner cases (truncated varints, wrong wire types,
# unknown fields, a valid empty message); long ones its length checks.
garbage = st.one_of(st.binary(max_size=64), st.binary(min_size=1000, max_size=100_000))


@pytest.fixture
def fuzz_controller(tmp_path: Path) -> Iterator[ControllerProcess]:
    """Overrides conftest's: a controller that also serves the Peer service (one configured
    peer, which never answers: port 9 on loopback, discard, not listening). conftest's
    ``fuzz_channel`` and ``honest`` fixtures use this one."""
    proc = ControllerProcess(tmp_path / "state", ["--peers", "127.0.0.1:9"], env=FUZZ_ENV)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def session_call(
    channel: grpc.Channel, requests: list[bytes]
) -> tuple[list[bytes], grpc.RpcError | None]:
    """One Session stream with ``requests`` as raw bytes; its responses and its error."""
    call = channel.stream_stream(SESSION)(iter(requests), timeout=TIMEOUT)
    out: list[bytes] = []
    try:
        for raw in call:
            out.append(raw)
        return out, None
    except grpc.RpcError as exc:
        return out, exc


def decodes(data: bytes, message: type) -> object | None:
    try:
        return message.FromString(data)
    except DecodeError:
        return None


def alive(controller: ControllerProcess, honest: HonestSession) -> None:
    assert controller.proc is not None and controller.proc.poll() is None, controller.log[-20:]
    harm = honest.harm()
    assert harm is None, f"the honest session was harmed: {harm}"


def expect_rejected(err: grpc.RpcError | None, field: set[str]) -> None:
    assert err is not None, "the stream was not rejected"
    assert err.code() in REJECTION_CODES, (err.code(), err.details())
    assert err.details(), err.code()
    if err.code() is grpc.StatusCode.INVALID_ARGUMENT:
        assert any(f in err.details() for f in field), (err.details(), field)


@pytest.mark.timeout(120)
def test_session_first_message_garbage(
    fuzz_controller: ControllerProcess, fuzz_channel: grpc.Channel, honest: HonestSession
) -> None:
    @GARBAGE
    @given(data=garbage)
    @example(data=b"")  # decodes: an empty ClientMessage, not a Hello
    @example(data=b"\xff\xff\xff\xff")  # does not decode
    @example(
        data=hello("j1", client_id="fuzz").SerializeToString()
    )  # a valid Hello: the session opens
    def check(data: bytes) -> None:
        goodbye = pb.ClientMessage(goodbye=pb.Goodbye()).SerializeToString()
        responses, err = session_call(fuzz_channel, [data, goodbye])
        msg = decodes(data, pb.ClientMessage)
        if msg is None:
            expect_rejected(err, {"message"})
        elif problems := hello_problems(msg):  # type: ignore[arg-type]
            expect_rejected(err, problems)
        else:
            assert err is None or err.code() in REJECTION_CODES - {
                grpc.StatusCode.INVALID_ARGUMENT
            }, err
            if err is None:  # served: its first allocation came before the Goodbye's OK
                assert responses and pb.ServerMessage.FromString(responses[0]).allocation.epoch
        alive(fuzz_controller, honest)

    check()


@pytest.mark.timeout(120)
def test_session_later_message_garbage(
    fuzz_controller: ControllerProcess, fuzz_channel: grpc.Channel, honest: HonestSession
) -> None:
    @GARBAGE
    @given(data=garbage)
    @example(data=b"")  # an empty message: "body"
    @example(data=b"\x0a")  # a truncated field: does not decode
    @example(data=pb.ClientMessage(usage=pb.Usage(bytes=1)).SerializeToString())  # valid
    def check(data: bytes) -> None:
        goodbye = pb.ClientMessage(goodbye=pb.Goodbye()).SerializeToString()
        _, err = session_call(
            fuzz_channel, [hello("j1", client_id="fuzz").SerializeToString(), data, goodbye]
        )
        msg = decodes(data, pb.ClientMessage)
        if msg is None:
            expect_rejected(err, {"message"})
        else:
            model = Model(stream=None, greeted=True)  # type: ignore[arg-type]
            apply(model, msg)  # type: ignore[arg-type]
            if model.fate.broke:
                expect_rejected(err, model.fate.broke)
            else:
                assert err is None or err.code() in REJECTION_CODES - {
                    grpc.StatusCode.INVALID_ARGUMENT
                }, err
        alive(fuzz_controller, honest)

    check()


@pytest.mark.timeout(120)
def test_peer_exchange_garbage(
    fuzz_controller: ControllerProcess, fuzz_channel: grpc.Channel, honest: HonestSession
) -> None:
    exchange = fuzz_channel.unary_unary(EXCHANGE)

    @GARBAGE
    @given(data=garbage)
    @example(data=b"")  # decodes: an empty digest, no replica id
    @example(data=b"\x08\x80")  # a truncated varint
    @example(
        data=peer_pb2.Digest(replica_id="stranger", incarnation=1, capacity=1e6).SerializeToString()
    )
    def check(data: bytes) -> None:
        try:
            raw = exchange(data, timeout=TIMEOUT)
        except grpc.RpcError as err:
            assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
            assert err.details()
            if decodes(data, peer_pb2.Digest) is None:
                assert err.details().startswith("digest"), err.details()
        else:
            reply = peer_pb2.ExchangeReply.FromString(raw)
            assert reply.status in NOT_ACCEPTED, reply  # no peer ever answered: no sender known
            assert reply.reason, reply
        alive(fuzz_controller, honest)

    check()


@pytest.mark.timeout(120)
def test_peer_stream_garbage(
    fuzz_controller: ControllerProcess, fuzz_channel: grpc.Channel, honest: HonestSession
) -> None:
    stream = fuzz_channel.stream_stream(STREAM)

    @GARBAGE
    @given(digests=st.lists(garbage, min_size=1, max_size=4))
    def check(digests: list[bytes]) -> None:
        call = stream(iter(digests), timeout=TIMEOUT)
        replies = [peer_pb2.ExchangeReply.FromString(raw) for raw in call]
        assert call.code() is grpc.StatusCode.OK, call.details()
        # Every digest was answered (none is accepted) and the stream went on to the end.
        assert len(replies) == len(digests), replies
        for reply, data in zip(replies, digests, strict=True):
            assert reply.status in NOT_ACCEPTED and reply.reason, reply
            if decodes(data, peer_pb2.Digest) is None:
                assert reply.status == "rejected" and reply.field == "digest", reply
        alive(fuzz_controller, honest)

    check()
