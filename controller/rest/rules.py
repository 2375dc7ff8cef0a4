"""``/v1/rules``: the operator rules (limits, reservations, weights, metadata ops/s).

``GET /v1/rules`` lists the rules in force in the order they bind jobs, with what each
binds now on this replica; ``POST`` adds one (409 when its name is taken or the
reservations would not fit, naming the sum: controller/rulebook.py), ``PUT
/v1/rules/{name}`` adds or replaces one, ``DELETE`` removes one. Changes are
token-protected, saved before they count and reach every replica through the catalog.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Response
from pydantic import BaseModel, ConfigDict, Field

from burstctl.common.limits import MAX_RATE, MAX_TEXT
from burstctl.controller.jobs import JobTable
from burstctl.controller.membership import Membership
from burstctl.controller.rest.auth import Access
from burstctl.controller.rest.models import ErrorOut, Identifier, not_found
from burstctl.controller.rule_status import RuleStatus
from burstctl.controller.rulebook import Overcommitted, RuleBook, cluster_capacity
from burstctl.controller.rules import (
    DEFAULT_RANK,
    MAX_METADATA_OPS,
    MAX_WEIGHT,
    Rule,
)

Pattern = Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
Rate = Annotated[float, Field(ge=0, le=MAX_RATE, allow_inf_nan=False)]


class MatchIn(BaseModel):
    """Which jobs a rule binds: each key an exact name or a shell-style pattern (``dd*``);
    all given must hold; at least one."""

    model_config = ConfigDict(extra="forbid")
    job: Pattern | None = None
    user: Pattern | None = None
    group: Pattern | None = None
    app: Pattern | None = None


class RuleBody(BaseModel):
    """What a rule sets (0 or absent: none)."""

    model_config = ConfigDict(extra="forbid")
    match: MatchIn
    rank: int = Field(DEFAULT_RANK, ge=-(2**31), lt=2**31, description="first match binds")
    limit: Rate = Field(0.0, description="bytes/s: the bound jobs' total, all replicas")
    reservation: Rate = Field(0.0, description="bytes/s: the least they get while demanding")
    weight: float = Field(1.0, gt=0, le=MAX_WEIGHT, allow_inf_nan=False)
    metadata_ops: float = Field(
        0.0, ge=0, le=MAX_METADATA_OPS, allow_inf_nan=False, description="per bound job, ops/s"
    )

    def rule(self, name: str) -> Rule:
        match = {k: v for k, v in self.match.model_dump().items() if v}
        return Rule(
            name,
            rank=self.rank,
            limit=self.limit,
            reservation=self.reservation,
            weight=self.weight,
            metadata_ops=self.metadata_ops,
            **match,
        )


class RuleIn(RuleBody):
    name: Identifier


class RuleOut(BaseModel):
    name: str
    rank: int
    match: dict[str, str]
    limit: float
    reservation: float
    weight: float
    metadata_ops: float
    jobs: list[str] = Field(description="the jobs of this replica it binds now")
    rate: float = Field(description="bytes/s allotted to them on this replica now")
    demand: float = Field(description="bytes/s those of them in I/O want here")
    limited: bool = Field(description="its limit holds them back now")
    reservation_met: bool | None = Field(description="null: no reservation")


class RulesOut(BaseModel):
    rules: list[RuleOut]
    overcommitted: float = Field(
        description="Σ of the reservations when it passes the capacity of the replicas in "
        "the view (they are then scaled down to it), else 0"
    )


def rules_router(
    rules: RuleBook, table: JobTable, membership: Membership | None, access: Access
) -> APIRouter:
    router = APIRouter()
    conflict: dict[int | str, dict[str, Any]] = {
        409: {"model": ErrorOut, "description": "The reservations would not fit, or no room"}
    }

    def bound_jobs() -> dict[str, list[str]]:
        """Rule name → the jobs of the table it binds, in one pass over the table."""
        out: dict[str, list[str]] = {}
        for job_id in sorted(table.jobs):
            rule = rules.rule_of(job_id)
            if rule is not None:
                out.setdefault(rule.name, []).append(job_id)
        return out

    def out(rule: Rule, bound_by: dict[str, list[str]] | None = None) -> RuleOut:
        bound = (bound_by if bound_by is not None else bound_jobs()).get(rule.name, [])
        rate = sum(s.rate or 0.0 for j in bound for s in table.jobs[j].sessions.values())
        status = rules.status().get(rule.name, RuleStatus(rule))
        return RuleOut(
            name=rule.name,
            rank=rule.rank,
            match=rule.match(),
            limit=rule.limit,
            reservation=rule.reservation,
            weight=rule.weight,
            metadata_ops=rule.metadata_ops,
            jobs=bound,
            rate=rate,
            demand=status.demand,
            limited=status.limited,
            reservation_met=status.reservation_met,
        )

    def put(rule: Rule) -> bool:
        peers = membership.digests() if membership is not None else []
        capacity = cluster_capacity(rules.capacity, [d.capacity for d in peers])
        elsewhere = set(membership.holders(set(table.jobs))) if membership is not None else set()
        try:
            return rules.put(rule, capacity, elsewhere)
        except Overcommitted as exc:
            raise HTTPException(409, str(exc)) from None

    @router.get(
        "/v1/rules", dependencies=access.reads, tags=["rules"], responses=access.read_errors
    )
    async def list_rules() -> RulesOut:
        """The rules in force, in the order they bind jobs."""
        bound_by = bound_jobs()
        return RulesOut(
            rules=[out(r, bound_by) for r in rules.rules()], overcommitted=rules.overcommitted()
        )

    @router.get(
        "/v1/rules/{name}",
        dependencies=access.reads,
        tags=["rules"],
        responses={**access.read_errors, **not_found("No such rule")},
    )
    async def get_rule(name: str) -> RuleOut:
        rule = rules.get(name)
        if rule is None:
            raise HTTPException(404, f"no rule {name!r}")
        return out(rule)

    @router.post(
        "/v1/rules",
        dependencies=access.mutations,
        tags=["rules"],
        status_code=201,
        responses={**conflict, **access.change_errors},
    )
    async def add_rule(body: RuleIn) -> RuleOut:
        """Add a rule; 409 when the name is taken (PUT replaces) or its reservation does
        not fit."""
        if rules.get(body.name) is not None:
            raise HTTPException(409, f"name: a rule {body.name!r} exists; PUT replaces it")
        rule = body.rule(body.name)
        put(rule)
        return out(rule)

    @router.put(
        "/v1/rules/{name}",
        dependencies=access.mutations,
        tags=["rules"],
        responses={201: {"description": "A new rule"}, **conflict, **access.change_errors},
    )
    async def put_rule(name: Identifier, body: RuleBody, response: Response) -> RuleOut:
        """Add or replace rule ``name``: 201 when new, 200 when replaced."""
        rule = body.rule(name)
        if put(rule):
            response.status_code = 201
        return out(rule)

    @router.delete(
        "/v1/rules/{name}",
        dependencies=access.mutations,
        tags=["rules"],
        status_code=204,
        responses={**not_found("No such rule"), **access.change_errors},
    )
    async def remove_rule(name: str) -> Response:
        if not rules.remove(name):
            raise HTTPException(404, f"no rule {name!r}")
        return Response(status_code=204)

    return router
