"""``HttpServer``: uvicorn serving the REST app on the controller's own event loop.

The controller binds the socket itself, so ``127.0.0.1:0`` works and a taken port fails at
start with a clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from burstctl.controller.config import split_host_port

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    # The controller's CLI owns SIGINT/SIGTERM; uvicorn must not capture them.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """uvicorn serving ``app`` on ``listen`` in the running loop; ``port`` once started."""

    def __init__(self, app: FastAPI, listen: str, log_level: str) -> None:
        self.listen = listen
        # log_config=None: uvicorn's records go through the controller's logging setup.
        self._config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            log_level=log_level.lower(),
            access_log=log_level.upper() == "DEBUG",
            timeout_graceful_shutdown=1,
        )
        self._server = _Server(self._config)
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self.port: int | None = None

    async def start(self) -> None:
        host, port = split_host_port(self.listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP given, not 0: asyncio sets TCP_NODELAY only on sockets whose proto
        # says TCP, and without it every keep-alive answer (written in two sends) waits
        # ~40 ms for the client's delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            sock.close()
            raise OSError(f"cannot listen on {self.listen} (REST): {exc.strerror}") from None
        sock.listen(128)
        sock.setblocking(False)
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        # Connections wait in the backlog until uvicorn accepts them: ready as of now.
        self._task = asyncio.create_task(self._server.serve([sock]), name="controller-http")

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        try:
            await self._task
        except Exception:
            log.exception("REST server failed")
        self._task = None
        if self._sock is not None:
            self._sock.close()
