"""``/v1/replicas``: this replica and the peers it has heard from (docs/replicas.md)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from burstctl.controller.peers import PeerSync
from burstctl.controller.rest.auth import Access
from burstctl.controller.state import PolicySlot


class PeerOut(BaseModel):
    replica_id: str
    live: bool
    last_exchange_age_s: float
    capacity: float
    policy: str
    policy_version: int
    jobs: int


class ReplicasOut(BaseModel):
    replica_id: str
    capacity: float
    policy: str
    policy_version: int
    sync_interval_s: float | None
    peers: list[PeerOut]


def replicas_router(
    replica_id: str, capacity: float, slot: PolicySlot, peers: PeerSync | None, access: Access
) -> APIRouter:
    """The route of replica ``replica_id`` (bandwidth ``capacity``); ``peers``: its digest
    exchange, None without peers."""
    router = APIRouter()

    @router.get(
        "/v1/replicas", dependencies=access.reads, tags=["replicas"], responses=access.read_errors
    )
    async def replicas() -> ReplicasOut:
        """This replica and the peers it has heard from."""
        stats = peers.stats() if peers is not None else {"peers": [], "sync_interval_s": None}
        return ReplicasOut(
            replica_id=replica_id,
            capacity=capacity,
            policy=slot.name,
            policy_version=slot.version,
            sync_interval_s=stats["sync_interval_s"],
            peers=[PeerOut(**p) for p in stats["peers"]],
        )

    return router
