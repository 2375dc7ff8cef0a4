"""``/v1/policies`` and ``/v1/policy``: the registry, the active policy, a switch."""

from __future__ import annotations

import inspect
import logging
import sys
from typing import Any

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field

from burstctl.common.limits import MAX_TEXT
from burstctl.controller.rest.auth import Access
from burstctl.controller.rest.models import invalid
from burstctl.controller.state import ActivePolicy, PolicySlot
from burstctl.policies.registry import PolicyParamsError, UnknownPolicyError

log = logging.getLogger(__name__)

# Which paper a built-in policy comes from, by module (GET /v1/policies).
_FAMILIES = {
    "fcfs": "bandwidth-sharing",
    "fair_share": "bandwidth-sharing",
    "greedy": "bandwidth-sharing",
    "io_sets": "bandwidth-sharing",
    "best_next_event": "bandwidth-sharing",
    "statistical_tokens": "statistical-tokens",
}


class PolicyInfo(BaseModel):
    name: str
    family: str
    description: str
    params_schema: dict[str, Any] = Field(description="JSON schema of the parameters")


class PolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(
        min_length=1,
        max_length=MAX_TEXT,
        description="a registered name (GET /v1/policies) or a sharing spec; never an import path",
    )
    params: dict[str, Any] = Field(default_factory=dict)


def policy_router(slot: PolicySlot, access: Access) -> APIRouter:
    """The routes of ``slot``, the one owner of the active policy: a switch is one
    synchronous call on the loop the scheduler runs on, so no decision sees half of it."""
    router = APIRouter()

    @router.get(
        "/v1/policies", dependencies=access.reads, tags=["policy"], responses=access.read_errors
    )
    async def list_policies() -> list[PolicyInfo]:
        """The registry: every name a switch accepts (sharing specs are also accepted)."""
        out = []
        registry = slot.registry
        for name in registry.names():
            try:
                cls = registry.get(name)
            except UnknownPolicyError as exc:  # a third-party entry point that does not load
                log.warning("%s", exc)
                continue
            module = cls.__module__.rsplit(".", 1)[-1]
            # Its own docstring, else its module's: inherited ones describe the base class.
            own = cls.__dict__.get("__doc__") or sys.modules[cls.__module__].__doc__ or name
            doc = inspect.cleandoc(own).splitlines()[0]
            if cls.name != name:  # a ThemisIO alias: say which sharing spec it stands for
                doc = f"{doc} Spec: {cls.name}."
            out.append(
                PolicyInfo(
                    name=name,
                    family=_FAMILIES.get(module, "external"),
                    description=doc,
                    params_schema=cls.Params.model_json_schema(),
                )
            )
        return out

    @router.get(
        "/v1/policy", dependencies=access.reads, tags=["policy"], responses=access.read_errors
    )
    async def get_policy() -> ActivePolicy:
        """The active policy of this replica."""
        return slot.active()

    @router.put(
        "/v1/policy",
        dependencies=access.mutations,
        tags=["policy"],
        responses=access.change_errors,
    )
    async def put_policy(body: PolicyIn) -> ActivePolicy:
        """Switch the policy: validated, applied at once, persisted, sent to the peers
        at once."""
        try:
            return slot.switch(body.name, body.params)
        except UnknownPolicyError as exc:
            raise invalid(["body", "name"], str(exc), body.name) from None
        except PolicyParamsError as exc:
            raise RequestValidationError(
                [
                    {"type": "value_error", "loc": ["body", "params", *loc], "msg": msg}
                    for loc, msg in exc.errors
                ]
            ) from None

    return router
