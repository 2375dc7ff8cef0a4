"""Who may open a session for which job: the trust model of docs/security.md, enforced.

Two questions, answered for every ``Session`` stream:

1. **Is the caller a trusted node component?** A caller is *vouched* when its channel carries
   the shared secret (``authorization: Bearer <secret>`` metadata, compared in constant time)
   or a client certificate verified against ``grpc_tls_client_ca`` (mutual TLS: the TLS
   handshake refuses any other). A wrong secret is refused on every RPC (``UNAUTHENTICATED``),
   whatever the method. A caller without credentials is treated by ``client_trust``:
   ``open`` (as if vouched: the single-node default when no credential is configured),
   ``confined`` (its session is confined to the default job ``user:<user>`` of the user it
   names, 1 node, priority 1) or ``vouched`` (refused, ``UNAUTHENTICATED``). Peer RPCs always
   need credentials once any is configured.
2. **May this user join this job?** (`admit`, for every Hello, vouched or not)

   - a job registered (``POST /v1/jobs``) to user A is joined only by sessions for user A;
     any other user is refused with ``PERMISSION_DENIED``; A's sessions get the registered
     metadata whatever they claim;
   - a default job ``user:<name>`` is joined only by sessions for ``<name>``;
   - an unregistered job belongs to the user of its first session for as long as it is in
     the job table (active, or retained after its last session); another user is refused;
     the nodes and priority a session claims are clamped to ``max_unregistered_nodes`` and
     ``max_unregistered_priority`` (the job table then takes the smallest claim of the job's
     live sessions, so a claim never outlives its session: ``JobTable.open_session``).

``load_credentials`` reads what the configuration names (the secret, the certificates) when
the replica is built, before anything listens: the gate the servicer and the gRPC server
check calls with, the server's TLS credentials, and what the peer exchange presents.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import grpc

from burstctl.common.channels import SECRET_KEY, SECRET_SCHEME, ChannelSecurity, read_secret
from burstctl.controller.config import ControllerConfig
from burstctl.controller.jobs import JobTable
from burstctl.controller.records import JobMeta

log = logging.getLogger(__name__)

DEFAULT_JOB_PREFIX = "user:"
_HEALTH_PREFIX = "/grpc.health.v1.Health/"
_PEER_PREFIX = "/burstctl.v1.Peer/"
# Seconds a refused streaming call waits for the caller's first message before it ends.
_DRAIN_FIRST = 1.0


class ClientTrust(enum.Enum):
    """How a ``Session`` caller without credentials is treated."""

    OPEN = "open"  # as if a trusted shim vouched for the Hello's user
    CONFINED = "confined"  # confined to the default job of the user it names
    VOUCHED = "vouched"  # refused: only credentialed callers open sessions


class Refused(Exception):
    """A session that may not be opened; ``code`` and the message go to the caller."""

    def __init__(self, code: grpc.StatusCode, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.code = code
        self.field = field_name


@dataclass(frozen=True, slots=True)
class UnregisteredLimits:
    """What an unregistered job's sessions may claim."""

    max_nodes: int
    max_priority: float


class Gate:
    """Checks the credentials of each call (see the module docstring)."""

    def __init__(self, *, secret: str | None, mutual_tls: bool, client_trust: ClientTrust) -> None:
        self._secret = None if secret is None else (SECRET_SCHEME + secret).encode()
        self.mutual_tls = mutual_tls
        self.client_trust = client_trust
        self.refused = 0  # calls refused with UNAUTHENTICATED

    @property
    def credentials_configured(self) -> bool:
        return self._secret is not None or self.mutual_tls

    def vouched(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
        """Whether the caller presented credentials; `Refused` (UNAUTHENTICATED) for a wrong
        secret. Under mutual TLS every caller that got this far presented a verified
        certificate."""
        presented = [v for k, v in (metadata or ()) if k == SECRET_KEY]
        if presented:
            if self._secret is None:
                return self.mutual_tls  # a secret nobody asked for proves nothing
            value = presented[-1]
            given = value if isinstance(value, bytes) else value.encode("utf-8", "replace")
            if not hmac.compare_digest(given, self._secret):
                raise Refused(grpc.StatusCode.UNAUTHENTICATED, "authorization", "wrong secret")
            return True
        return self.mutual_tls

    def check_call(self, method: str, metadata: Iterable[tuple[str, str | bytes]] | None) -> None:
        """Refuses (UNAUTHENTICATED) a call this caller may not make at all."""
        if method.startswith(_HEALTH_PREFIX):
            return  # reveals nothing; probes carry no credentials
        if self.vouched(metadata):
            return
        if method.startswith(_PEER_PREFIX):
            if self.credentials_configured:
                raise Refused(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "authorization",
                    "peer calls need the shared secret or a client certificate",
                )
        elif self.client_trust is ClientTrust.VOUCHED:
            raise Refused(
                grpc.StatusCode.UNAUTHENTICATED,
                "authorization",
                "sessions need the shared secret or a client certificate (client_trust=vouched)",
            )

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        return _GateInterceptor(self)


class _GateInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, gate: Gate) -> None:
        self._gate = gate

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        try:
            self._gate.check_call(method, handler_call_details.invocation_metadata)  # type: ignore[attr-defined]
        except Refused as exc:
            self._gate.refused += 1
            log.warning("call %s refused: %s", method, exc)
            handler = await continuation(handler_call_details)
            return _refusing(handler, exc)
        return await continuation(handler_call_details)


def _refusing(handler: grpc.RpcMethodHandler | None, exc: Refused) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that ends the call with ``exc``."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(exc.code, str(exc))

    async def refuse_stream(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> None:
        # Read the first message before ending the call: a client whose first write is still
        # in flight when the status arrives may see its own INTERNAL instead of this status.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_DRAIN_FIRST):
                await anext(aiter(requests))
        await context.abort(exc.code, str(exc))

    if handler is None or (not handler.request_streaming and not handler.response_streaming):
        return grpc.unary_unary_rpc_method_handler(refuse)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse_stream)
    return grpc.unary_stream_rpc_method_handler(refuse)


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a replica's gRPC channels check and prove (docs/security.md)."""

    gate: Gate  # checks every call, and who may open which session
    server: grpc.ServerCredentials | None  # the server's TLS; None: plaintext
    peers: ChannelSecurity  # what the peer exchange opens its channels with


def load_credentials(config: ControllerConfig) -> Credentials:
    """Reads the secret and the certificates the configuration names; OSError naming the
    file when one cannot be used."""
    try:
        secret = read_secret(config.grpc_secret_file) if config.grpc_secret_file else None
        mutual = config.grpc_tls_client_ca is not None
        gate = Gate(
            secret=secret,
            mutual_tls=mutual,
            client_trust=ClientTrust(config.effective_client_trust),
        )
        if config.grpc_tls_cert is None or config.grpc_tls_key is None:
            return Credentials(gate, None, ChannelSecurity(secret=secret))
        peers = ChannelSecurity.load(
            tls_ca=config.grpc_tls_ca or config.grpc_tls_client_ca,
            tls_cert=config.grpc_tls_cert if mutual else None,
            tls_key=config.grpc_tls_key if mutual else None,
            secret=secret,
        )
        cert, key = config.grpc_tls_cert.read_bytes(), config.grpc_tls_key.read_bytes()
        client_ca = config.grpc_tls_client_ca.read_bytes() if config.grpc_tls_client_ca else None
    except (OSError, ValueError) as exc:
        raise OSError(f"gRPC credentials: {exc}") from None
    server = grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=mutual
    )
    return Credentials(gate, server, peers)


def admit(
    table: JobTable,
    claim: JobMeta,
    *,
    vouched: bool,
    client_trust: ClientTrust,
    limits: UnregisteredLimits,
) -> JobMeta:
    """The metadata a session with this Hello opens with; `Refused` if it may not open.

    ``vouched``: a trusted component vouches for ``claim.user`` (or ``client_trust`` is
    ``open``, which takes every caller at its word).
    """
    if not vouched:
        if client_trust is ClientTrust.VOUCHED:
            raise Refused(
                grpc.StatusCode.UNAUTHENTICATED,
                "authorization",
                "sessions need the shared secret or a client certificate",
            )
        if client_trust is ClientTrust.CONFINED:
            own = DEFAULT_JOB_PREFIX + claim.user
            if claim.job_id != own:
                log.info(
                    "unvouched session for job %s of user %s confined to %s",
                    claim.job_id,
                    claim.user,
                    own,
                )
            claim = JobMeta(job_id=own, user=claim.user, group=claim.group, nodes=1, priority=1.0)
    job_id = claim.job_id
    if job_id.startswith(DEFAULT_JOB_PREFIX) and job_id != DEFAULT_JOB_PREFIX + claim.user:
        raise Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            "hello.job_id",
            f"{job_id!r} is the default job of another user; user {claim.user!r} may not join it",
        )
    registered = table.registered.get(job_id)
    if registered is not None:
        if registered.user != claim.user:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                "hello.user",
                f"job {job_id!r} is registered to another user; "
                f"user {claim.user!r} may not join it",
            )
        return registered
    known = table.jobs.get(job_id)
    if known is not None and known.meta.user != claim.user:
        raise Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            "hello.user",
            f"job {job_id!r} belongs to another user (its first session's); "
            f"user {claim.user!r} may not join it",
        )
    if claim.nodes > limits.max_nodes or claim.priority > limits.max_priority:
        clamped = replace(
            claim,
            nodes=min(claim.nodes, limits.max_nodes),
            priority=min(claim.priority, limits.max_priority),
        )
        log.info(
            "session of unregistered job %s claims %d nodes, priority %g; clamped to %d, %g",
            job_id,
            claim.nodes,
            claim.priority,
            clamped.nodes,
            clamped.priority,
        )
        claim = clamped
    return claim
