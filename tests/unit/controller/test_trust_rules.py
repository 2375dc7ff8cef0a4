"""controller/trust.py without a network: the credentials of a call and the rules of a Hello."""

from __future__ import annotations

import grpc
import pytest

from burstctl.controller.config import ConfigError, load_config
from burstctl.controller.jobs import JobTable
from burstctl.controller.records import JobMeta
from burstctl.controller.trust import ClientTrust, Gate, Refused, UnregisteredLimits, admit

SESSION = "/burstctl.v1.Controller/Session"
PEER = "/burstctl.v1.Peer/Stream"
HEALTH = "/grpc.health.v1.Health/Check"
LIMITS = UnregisteredLimits(max_nodes=64, max_priority=1.0)


def table() -> JobTable:
    return JobTable(lambda: 0.0, heartbeat_timeout=3.0, job_retention=10.0, demand_headroom=1.1)


def meta(job: str = "j", user: str = "ann", nodes: int = 1, priority: float = 1.0) -> JobMeta:
    return JobMeta(job_id=job, user=user, group="g", nodes=nodes, priority=priority)


def test_the_secret_is_checked_on_every_call_but_health() -> None:
    gate = Gate(secret="s3cret", mutual_tls=False, client_trust=ClientTrust.VOUCHED)
    right = [("authorization", "Bearer s3cret")]
    assert gate.vouched(right) and gate.vouched([("authorization", b"Bearer s3cret")])
    for method in (SESSION, PEER):
        gate.check_call(method, right)
        for metadata in ([], [("authorization", "Bearer s3creT")], [("authorization", "s3cret")]):
            with pytest.raises(Refused) as info:
                gate.check_call(method, metadata)
            assert info.value.code is grpc.StatusCode.UNAUTHENTICATED
    gate.check_call(HEALTH, [])


def test_without_credentials_client_trust_decides_and_peers_need_them() -> None:
    for trust in (ClientTrust.OPEN, ClientTrust.CONFINED):
        gate = Gate(secret="s", mutual_tls=False, client_trust=trust)
        gate.check_call(SESSION, [])
        with pytest.raises(Refused):
            gate.check_call(PEER, [])
    nothing = Gate(secret=None, mutual_tls=False, client_trust=ClientTrust.OPEN)
    nothing.check_call(PEER, [])  # no credential configured: the loopback default
    assert not nothing.vouched([("authorization", "Bearer anything")])


def test_admit_rules() -> None:
    t = table()
    t.register(meta("777", "root", nodes=64))

    def refused(claim: JobMeta, **kw: object) -> Refused:
        with pytest.raises(Refused) as info:
            admit(t, claim, vouched=True, client_trust=ClientTrust.OPEN, limits=LIMITS, **kw)  # type: ignore[arg-type]
        assert info.value.code is grpc.StatusCode.PERMISSION_DENIED
        return info.value

    assert refused(meta("777", "nobody")).field == "hello.user"
    assert refused(meta("user:root", "nobody")).field == "hello.job_id"
    got = admit(t, meta("777", "root"), vouched=True, client_trust=ClientTrust.OPEN, limits=LIMITS)
    assert got.nodes == 64
    greedy = meta("free", "ann", nodes=1 << 20, priority=1e9)
    got = admit(t, greedy, vouched=True, client_trust=ClientTrust.OPEN, limits=LIMITS)
    assert (got.nodes, got.priority) == (64, 1.0)
    t.open_session(got, "c", "h")
    assert refused(meta("free", "bob")).field == "hello.user"
    confined = admit(
        t, meta("777", "root", 64), vouched=False, client_trust=ClientTrust.CONFINED, limits=LIMITS
    )
    assert confined == meta("user:root", "root", 1, 1.0)


def test_the_trust_block_of_the_configuration() -> None:
    assert load_config().effective_client_trust == "open"
    assert load_config(grpc_secret_file="/s").effective_client_trust == "vouched"
    assert load_config(grpc_secret_file="/s", client_trust="confined").effective_client_trust == (
        "confined"
    )
    for bad, word in (
        ({"grpc_tls_cert": "/c"}, "grpc_tls_key"),
        ({"grpc_tls_client_ca": "/ca"}, "grpc_tls_cert"),
        ({"client_trust": "vouched"}, "grpc_secret_file"),
        ({"client_trust": "trusting"}, "client_trust"),
        ({"max_unregistered_nodes": 0}, "max_unregistered_nodes"),
    ):
        with pytest.raises(ConfigError, match=word):
            load_config(**bad)
