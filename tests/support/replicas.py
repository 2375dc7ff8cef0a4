"""Two controller replicas in this process, each the other's peer on a real loopback gRPC
server, whose exchanges the test makes one at a time (``Replica.exchange``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
from support import async_wait_until

from burstctl.controller.jobs import JobTable
from burstctl.controller.peers import PeerServicer, PeerSync
from burstctl.controller.records import JobMeta, OpKind
from burstctl.controller.state import PolicySlot, StateStore
from burstctl.policies.registry import default_registry


@dataclass
class Replica:
    jobs: JobTable
    sync: PeerSync
    servicer: PeerServicer

    async def exchange(self, peer: Replica) -> None:
        """One exchange of this replica, done once ``peer`` has taken the digest."""
        received = peer.servicer.received
        await self.sync.exchange_once()
        await async_wait_until(
            lambda: peer.servicer.received == received + 1, 5.0, message="the digest"
        )


@contextlib.asynccontextmanager
async def replica_pair(
    state_dir: Path, metas: Mapping[str, JobMeta], policy: str = "size-fair"
) -> AsyncIterator[dict[str, Replica]]:
    """Two replicas (the keys of ``metas``): B_r = 100, b = 10, λ = 30 s (the test
    exchanges), each with one session of its job in ``metas`` and an open operation."""
    registry = default_registry()
    replicas: dict[str, Replica] = {}
    servers = [grpc.aio.server() for _ in metas]
    ports = [server.add_insecure_port("127.0.0.1:0") for server in servers]
    try:
        for i, (rid, meta) in enumerate(metas.items()):
            jobs = JobTable(
                time.monotonic, heartbeat_timeout=30.0, job_retention=60.0, demand_headroom=1.1
            )
            session = jobs.open_session(meta, "c", "h")
            jobs.post(session, 1, OpKind.WRITE, 0)
            slot = PolicySlot(registry, StateStore(state_dir / rid), (policy, {}), replica_id=rid)
            sync = PeerSync(
                jobs,
                slot,
                replica_id=rid,
                addresses=[f"127.0.0.1:{ports[1 - i]}"],
                interval=30.0,
                missed=3,
                capacity=100.0,
                node_bandwidth=10.0,
            )
            servicer = PeerServicer(sync.membership, slot, rid)
            servers[i].add_generic_rpc_handlers((servicer.rpc_handlers(),))
            await servers[i].start()
            replicas[rid] = Replica(jobs, sync, servicer)
        yield replicas
    finally:
        for replica in replicas.values():
            await replica.sync.close()
        for server in servers:
            await server.stop(None)
