"""The REST admin API: FastAPI on the controller's own event loop (docs/rest.md).

One router per resource, each built by a function that receives the parts it reads or
changes: ``health`` (``/healthz``, ``/readyz``, ``/metrics``), ``policy``
(``/v1/policies``, ``/v1/policy``), ``replicas``, ``jobs`` (the job table and the
registrations), ``schedules``, ``placement`` and ``capacity`` (the burst buffer).
``build_app`` puts them together with the error handlers and the dashboard;
``server.HttpServer`` runs the app with uvicorn. No globals: a policy switch is one
synchronous call on the loop the scheduler runs on, so no decision ever sees half of it.
Who may call which route: ``auth.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from burstctl.controller.buffer import BufferBooks
from burstctl.controller.config import ControllerConfig
from burstctl.controller.dashboard import mount_dashboard
from burstctl.controller.jobs import JobTable
from burstctl.controller.metrics import Metrics
from burstctl.controller.peers import PeerSync
from burstctl.controller.placement import PlacementInputs
from burstctl.controller.registrations import Registrations
from burstctl.controller.rest.auth import Access
from burstctl.controller.rest.capacity import capacity_router
from burstctl.controller.rest.health import health_router, metrics_router
from burstctl.controller.rest.jobs import jobs_router
from burstctl.controller.rest.placement import placement_router
from burstctl.controller.rest.policy import policy_router
from burstctl.controller.rest.replicas import replicas_router
from burstctl.controller.rest.rules import rules_router
from burstctl.controller.rest.schedules import schedules_router
from burstctl.controller.rulebook import RuleBook
from burstctl.controller.scheduler import Scheduler
from burstctl.controller.state import PolicySlot

log = logging.getLogger(__name__)


def build_app(
    config: ControllerConfig,
    token: str,
    *,
    ready: Callable[[], str | None],
    slot: PolicySlot,
    table: JobTable,
    registrations: Registrations,
    rules: RuleBook,
    placement: PlacementInputs,
    books: BufferBooks,
    scheduler: Scheduler,
    peers: PeerSync | None,
    metrics: Metrics,
) -> FastAPI:
    """The admin app of one replica: each router gets the parts it serves (module
    docstring); ``ready()`` is the gRPC address once the replica serves, else None."""
    app = FastAPI(
        title="burstctl controller",
        version="1",
        summary="Switch policies, see jobs and replicas of one burstctl controller replica.",
    )
    access = Access.build(token, config.protect_reads)
    for router in (
        health_router(ready),
        policy_router(slot, access),
        replicas_router(config.replica_id, config.capacity, slot, peers, access),
        jobs_router(
            config.replica_id,
            config.capacity,
            config.node_bandwidth,
            table=table,
            registrations=registrations,
            rules=rules,
            membership=peers.membership if peers is not None else None,
            access=access,
        ),
        rules_router(rules, table, peers.membership if peers is not None else None, access),
        schedules_router(table, access),
        placement_router(placement, table, config.placement_compute_nodes, access),
        capacity_router(books, scheduler, table, access),
        metrics_router(metrics, access),
    ):
        app.include_router(router)

    @app.exception_handler(OSError)
    async def not_durable(request: Request, exc: OSError) -> JSONResponse:
        # The state directory could not be written: the change was not applied.
        log.error("%s %s: cannot persist state: %s", request.method, request.url.path, exc)
        return JSONResponse(
            {"detail": f"cannot persist the state, nothing changed: {exc}"}, status_code=503
        )

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError) -> JSONResponse:
        # A check deeper down that the body validation did not catch: the documented shape
        # of a 422 (a list of errors), naming the body since no field is known.
        return JSONResponse(
            {"detail": [{"loc": ["body"], "msg": str(exc), "type": "value_error"}]},
            status_code=422,
        )

    mount_dashboard(app)
    return app
