"""The gRPC server of one replica: its services on one port, behind the gate.

``GrpcServer`` serves the ``Controller`` service (the clients' ``Session`` streams), the
``Peer`` service when the replica has peers, and the standard health service, on
``grpc_listen``, with the TLS credentials and the gate of ``controller/trust.py``. A port
that is taken fails ``start`` with an ``OSError`` naming the address; ``stop`` tells the
health service first, then drains the calls within the grace time.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from burstctl.controller.config import split_host_port
from burstctl.controller.trust import Credentials


class GrpcServer:
    """The services given by ``handlers`` (``health_names``: the names the health service
    reports), on ``listen``; ``port`` once started."""

    def __init__(
        self,
        listen: str,
        credentials: Credentials,
        handlers: Sequence[grpc.GenericRpcHandler],
        *,
        health_names: Sequence[str] = (),
        max_message_bytes: int,
    ) -> None:
        self.listen = listen
        self._credentials = credentials
        self._handlers = list(handlers)
        self._health_names = ("", *health_names)  # "": the server as a whole
        self._max_message_bytes = max_message_bytes
        self.health = health_aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self.port: int | None = None

    @property
    def address(self) -> str:
        """The address it serves on (the listen address with its port once started)."""
        host, _ = split_host_port(self.listen)
        return f"{host}:{self.port}"

    @property
    def advertised_address(self) -> str:
        """The address clients reach it at: ``address``, the host name in place of a
        wildcard."""
        host, _ = split_host_port(self.listen)
        if host in ("0.0.0.0", "[::]", "::"):
            host = socket.getfqdn()
        return f"{host}:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server(
            interceptors=[self._credentials.gate.interceptor()],
            options=[
                ("grpc.so_reuseport", 0),  # fail loudly if the port is taken
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
                # a larger message is refused by gRPC with RESOURCE_EXHAUSTED (config.py)
                ("grpc.max_receive_message_length", self._max_message_bytes),
            ],
        )
        for handler in self._handlers:
            server.add_generic_rpc_handlers((handler,))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        tls = self._credentials.server
        try:
            if tls is None:
                self.port = server.add_insecure_port(self.listen)
            else:
                self.port = server.add_secure_port(self.listen, tls)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {self.listen}: {exc}") from None
        await server.start()
        self._server = server
        for name in self._health_names:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace)
