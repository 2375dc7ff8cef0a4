"""The trust model of docs/security.md against real controllers on loopback ports.

Who may open a session for which job (issue 15, finding 3), the clamping of what an
unregistered job's sessions claim, and the gRPC credentials: a shared secret, TLS and mutual
TLS with certificates made here by the ``openssl`` command.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import httpx
import pytest
from support import async_wait_until
from support.grpc import RawSession, hello, post
from test_rest import auth

from burstctl.client import JobInfo, Session
from burstctl.common.channels import ChannelSecurity
from burstctl.controller.app import Replica
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration
Make = Callable[..., Awaitable[Replica]]
MiB = 1 << 20


async def register(replica: Replica, job: str, user: str, nodes: int) -> None:
    body = {"job_id": job, "user": user, "group": "g", "nodes": nodes}
    async with httpx.AsyncClient(base_url=replica.http_url, headers=auth(replica)) as http:
        r = await http.post("/v1/jobs", json=body)
        assert r.status_code in (200, 201), r.text


# ---------------------------------------------------------------------------- who may join


async def test_a_registered_job_refuses_another_users_session(replica: Replica) -> None:
    # Issue 15, finding 3: job 777 registered to root; a session for 777 vouched (here: the
    # default open trust) as nobody used to get the job and its share.
    await register(replica, "777", "root", 64)
    async with grpc.aio.insecure_channel(replica.grpc_address) as ch:
        intruder = RawSession(ch)
        await intruder.send(hello("777", user="nobody"))
        err = await intruder.status()
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "hello.user" in (err.details() or "")
        assert "registered to another user" in (err.details() or "")
        assert "777" not in replica.table.jobs  # nothing was opened for it

        owner = RawSession(ch)
        await owner.send(hello("777", user="root"))
        await owner.send(post(1))
        await owner.rate_becomes(lambda r: r > 0)
        job = replica.table.jobs["777"]
        assert (job.meta.user, job.meta.nodes) == ("root", 64)
        assert [s.claim.user for s in job.sessions.values() if s.claim] == ["root"]
        owner.call.cancel()
    assert replica.servicer.denied == 1


async def test_a_registration_ends_another_users_sessions_of_the_job(replica: Replica) -> None:
    async with grpc.aio.insecure_channel(replica.grpc_address) as ch:
        early = RawSession(ch)
        await early.send(hello("778", user="nobody"))
        await early.send(post(1))
        await early.rate_becomes(lambda r: r > 0)
        await register(replica, "778", "root", 8)
        err = await early.status()
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        job = replica.table.jobs["778"]
        assert not job.sessions and job.meta.user == "root"


async def test_nobody_joins_another_users_default_job(replica: Replica) -> None:
    async with grpc.aio.insecure_channel(replica.grpc_address) as ch:
        s = RawSession(ch)
        await s.send(hello("user:root", user="nobody"))
        err = await s.status()
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "hello.job_id" in (err.details() or "")


async def test_an_unregistered_job_belongs_to_its_first_user(replica: Replica) -> None:
    async with grpc.aio.insecure_channel(replica.grpc_address) as ch:
        first = RawSession(ch)
        await first.send(hello("free", user="ann"))
        await first.send(post(1))
        await first.rate_becomes(lambda r: r > 0)
        other = RawSession(ch)
        await other.send(hello("free", user="bob"))
        err = await other.status()
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        same = RawSession(ch)  # the same user may open more sessions of it
        await same.send(hello("free", user="ann"))
        await same.allocation()
        assert len(replica.table.jobs["free"].sessions) == 2
        first.call.cancel()
        same.call.cancel()


async def test_a_greedy_claim_is_clamped_and_does_not_outlive_its_session(
    replica: Replica,
) -> None:
    # Issue 15, finding 3: a Hello claiming nodes=1048576 for an unregistered job was kept
    # for the job_retention (300 s) and bound later honest sessions of the job.
    async with grpc.aio.insecure_channel(replica.grpc_address) as ch:
        greedy = RawSession(ch)
        await greedy.send(hello("j", user="ann", nodes=1 << 20, priority=1e9))
        await greedy.allocation()
        meta = replica.table.jobs["j"].meta
        limit = replica.config.max_unregistered_nodes
        assert (meta.nodes, meta.priority) == (limit, replica.config.max_unregistered_priority)
        await greedy.send(pb.ClientMessage(goodbye=pb.Goodbye()))
        await async_wait_until(
            lambda: not replica.table.jobs["j"].sessions, 5, message="greedy session closed"
        )
        honest = RawSession(ch)
        await honest.send(hello("j", user="ann", nodes=2))
        await honest.allocation()
        assert replica.table.jobs["j"].meta.nodes == 2
        honest.call.cancel()


async def test_confined_callers_get_only_their_own_default_job(replica_factory: Make) -> None:
    replica = await replica_factory(client_trust="confined")
    await register(replica, "777", "root", 64)
    async with grpc.aio.insecure_channel(replica.grpc_address) as ch:
        s = RawSession(ch)
        await s.send(hello("777", user="root", nodes=64))
        await s.allocation()
        assert "777" not in replica.table.jobs or not replica.table.jobs["777"].sessions
        meta = replica.table.jobs["user:root"].meta
        assert (meta.user, meta.nodes, meta.priority) == ("root", 1, 1.0)
        s.call.cancel()


# ---------------------------------------------------------------------------- credentials


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def _issue(ca: Path, ca_key: Path, out: Path, name: str, tmp: Path) -> tuple[Path, Path]:
    key, csr, cert, ext = out / f"{name}.key", tmp / f"{name}.csr", out / f"{name}.pem", tmp / name
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
             "-subj", f"/CN={name}")  # fmt: skip
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
             "-out", cert, "-days", "2", "-extfile", ext)  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server and a client certificate signed by it, and a stranger CA's client."""
    d = tmp_path_factory.mktemp("pki")
    files: dict[str, Path] = {}
    for ca_name in ("ca", "other-ca"):
        key, cert = d / f"{ca_name}.key", d / f"{ca_name}.pem"
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                 "-days", "2", "-subj", f"/CN={ca_name}")  # fmt: skip
        files[ca_name], files[f"{ca_name}.key"] = cert, key
    files["server"], files["server.key"] = _issue(files["ca"], files["ca.key"], d, "server", d)
    files["client"], files["client.key"] = _issue(files["ca"], files["ca.key"], d, "client", d)
    files["stranger"], files["stranger.key"] = _issue(
        files["other-ca"], files["other-ca.key"], d, "stranger", d
    )
    return files


async def _session_status(
    target: str, security: ChannelSecurity, job: str = "j", user: str = "ann"
) -> grpc.StatusCode:
    """OK once an allocation arrives, else the code the stream ended with."""
    async with security.open(target) as ch:
        s = RawSession(ch)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await s.send(hello(job, user=user))  # an allocation answers the Hello alone
        first = asyncio.ensure_future(s.inbox.get())
        done, _ = await asyncio.wait({first, s.reader}, timeout=10, return_when="FIRST_COMPLETED")
        if first in done:
            assert first.result().WhichOneof("body") == "allocation"
            s.call.cancel()
            return grpc.StatusCode.OK
        first.cancel()
        assert s.reader in done, "neither an allocation nor an end within 10 s"
        exc = s.reader.exception()
        assert isinstance(exc, grpc.aio.AioRpcError), exc
        return exc.code()


async def test_a_shared_secret_is_needed_and_checked(replica_factory: Make, tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("s3cret-token\n")
    replica = await replica_factory(grpc_secret_file=secret_file)
    target = replica.grpc_address
    right = ChannelSecurity.load(secret_file=secret_file)
    assert await _session_status(target, right) is grpc.StatusCode.OK
    assert await _session_status(target, ChannelSecurity()) is grpc.StatusCode.UNAUTHENTICATED
    wrong = ChannelSecurity(secret="s3cret-tokem")
    assert await _session_status(target, wrong) is grpc.StatusCode.UNAUTHENTICATED
    assert replica.gate is not None and replica.gate.refused == 2


async def test_the_client_session_carries_the_secret(replica_factory: Make, tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("another-secret")
    replica = await replica_factory(grpc_secret_file=secret_file)
    security = ChannelSecurity.load(secret_file=secret_file)
    job = JobInfo("sj", "ann", "g")
    s = await asyncio.to_thread(Session, replica.grpc_address, job, security=security)
    try:
        assert await asyncio.to_thread(s.wait_attached, 5.0)
        assert s.refused is None
    finally:
        await asyncio.to_thread(s.close)
    bare = await asyncio.to_thread(
        Session, replica.grpc_address, job, fallback="fixed:1MiB/s", attach_timeout=30.0
    )
    try:
        # Refused at once: the fallback applies without waiting out attach_timeout.
        assert not await asyncio.to_thread(bare.wait_attached, 10.0)
        assert bare.refused is not None and "secret" in bare.refused
        assert bare.rate == 1 * MiB
    finally:
        await asyncio.to_thread(bare.close)


async def test_mutual_tls(replica_factory: Make, pki: dict[str, Path]) -> None:
    replica = await replica_factory(
        grpc_tls_cert=pki["server"],
        grpc_tls_key=pki["server.key"],
        grpc_tls_client_ca=pki["ca"],
    )
    target = replica.grpc_address
    good = ChannelSecurity.load(tls_ca=pki["ca"], tls_cert=pki["client"], tls_key=pki["client.key"])
    assert await _session_status(target, good) is grpc.StatusCode.OK
    # No client certificate, one from another CA, or no TLS at all: no session.
    no_cert = ChannelSecurity.load(tls_ca=pki["ca"])
    stranger = ChannelSecurity.load(
        tls_ca=pki["ca"], tls_cert=pki["stranger"], tls_key=pki["stranger.key"]
    )
    for security in (no_cert, stranger, ChannelSecurity()):
        async with security.open(target) as ch:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(ch.channel_ready(), 1.0)
        assert await _session_status(target, security) is not grpc.StatusCode.OK
    # Vouched by its certificate, a session still may not join another user's job.
    await register(replica, "777", "root", 64)
    assert await _session_status(target, good, "777", "nobody") is (
        grpc.StatusCode.PERMISSION_DENIED
    )


async def test_tls_with_a_secret_and_replicas_that_use_both(
    replica_factory: Make, pki: dict[str, Path], tmp_path: Path
) -> None:
    from test_replicas import cluster

    secret_file = tmp_path / "secret"
    secret_file.write_text("peer-secret")
    tls = {
        "grpc_tls_cert": pki["server"],
        "grpc_tls_key": pki["server.key"],
        "grpc_tls_ca": pki["ca"],
        "grpc_secret_file": secret_file,
    }
    r1, r2 = await cluster(replica_factory, [20, 40], **tls)
    await async_wait_until(
        lambda: (
            r1.peer_sync is not None
            and r2.peer_sync is not None
            and r1.peer_sync.membership.live_peers() == ["r2"]
            and r2.peer_sync.membership.live_peers() == ["r1"]
        ),
        10,
        message="the replicas exchange digests over TLS with the secret",
    )
    target = r1.grpc_address
    good = ChannelSecurity.load(tls_ca=pki["ca"], secret_file=secret_file)
    assert await _session_status(target, good) is grpc.StatusCode.OK
    no_secret = ChannelSecurity.load(tls_ca=pki["ca"])
    assert await _session_status(target, no_secret) is grpc.StatusCode.UNAUTHENTICATED


async def test_replicas_over_mutual_tls(replica_factory: Make, pki: dict[str, Path]) -> None:
    from test_replicas import cluster

    mtls = {
        "grpc_tls_cert": pki["server"],
        "grpc_tls_key": pki["server.key"],
        "grpc_tls_client_ca": pki["ca"],
    }
    r1, r2 = await cluster(replica_factory, [20, 40], **mtls)
    await async_wait_until(
        lambda: (
            r1.peer_sync is not None
            and r2.peer_sync is not None
            and r1.peer_sync.membership.live_peers() == ["r2"]
            and r2.peer_sync.membership.live_peers() == ["r1"]
        ),
        10,
        message="the replicas exchange digests over mutual TLS",
    )
