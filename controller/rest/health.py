"""``/healthz``, ``/readyz`` and ``/metrics``: is the replica alive, is it serving, how is it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from burstctl.controller.metrics import Metrics
from burstctl.controller.rest.auth import Access
from burstctl.controller.rest.models import ErrorOut, as_json


def health_router(ready: Callable[[], str | None]) -> APIRouter:
    """The health checks, open to all; ``ready()`` is the gRPC address once the replica
    serves it with its state loaded, None before."""
    router = APIRouter()

    @router.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @router.get(
        "/readyz",
        tags=["health"],
        responses={503: {"model": ErrorOut, "description": "Not ready yet"}},
    )
    async def readyz() -> dict[str, Any]:
        """gRPC is serving and the state is loaded (503 otherwise)."""
        address = ready()
        if address is None:
            raise HTTPException(503, "not ready")
        return {"status": "ready", "grpc": address}

    return router


def metrics_router(scrape: Metrics, access: Access) -> APIRouter:
    router = APIRouter()

    @router.get(
        "/metrics",
        dependencies=access.reads,
        tags=["metrics"],
        response_class=PlainTextResponse,
        responses=as_json(access.read_errors),
    )
    async def metrics() -> PlainTextResponse:
        """Prometheus text format (controller/metrics.py lists the series): per-job series
        for the ``metrics_top_jobs`` jobs with the highest rate, aggregates over all;
        rendered in a worker thread, concurrent scrapes share one render."""
        return PlainTextResponse(await scrape.exposition(), media_type=CONTENT_TYPE_LATEST)

    return router
