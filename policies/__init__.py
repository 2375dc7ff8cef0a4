"""Pure bandwidth-sharing policies: no I/O, no asyncio, no grpc; deterministic given a seed."""

from burstctl.policies.base import Policy, PolicyParams
from burstctl.policies.registry import PolicyRegistry, UnknownPolicyError, default_registry
from burstctl.policies.view import FRESH_YIELD, JobId, JobView, SystemView, job_cap

__all__ = [
    "FRESH_YIELD",
    "JobId",
    "JobView",
    "Policy",
    "PolicyParams",
    "PolicyRegistry",
    "SystemView",
    "UnknownPolicyError",
    "default_registry",
    "job_cap",
]
