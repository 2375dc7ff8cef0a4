"""What the REST routers share: the error body, identifiers, the documented statuses."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BaseModel, Field

from burstctl.common.limits import MAX_TEXT, identifier_problem


class ErrorOut(BaseModel):
    """Any error but a validation 422 (FastAPI's shape: ``HTTPException``'s detail)."""

    detail: str = Field(description="what went wrong")


def _identifier(value: str) -> str:
    problem = identifier_problem(value)
    if problem:
        raise ValueError(problem)
    return value


# the limits a client's Hello and a peer's digest have (common/limits.py)
Identifier = Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_identifier)]


# The statuses routes answer besides their success and FastAPI's own 422, for the schema
# (`responses=`): the token check on mutations (and on reads with ``protect_reads``), a
# state that cannot be written on mutations, an unknown job.
TOKEN_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {
        "model": ErrorOut,
        "description": "No bearer token",
        "headers": {"WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}},
    },
    403: {"model": ErrorOut, "description": "Wrong bearer token"},
}
NOT_DURABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorOut, "description": "The state cannot be written: nothing changed"},
}


def as_json(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """``responses`` for a route whose response class is not JSON (``/metrics``): FastAPI
    would document a ``model`` in the route's media type, so the schema is given inline."""
    out: dict[int | str, dict[str, Any]] = {}
    for status, response in responses.items():
        response = dict(response)
        model = response.pop("model")
        response["content"] = {"application/json": {"schema": model.model_json_schema()}}
        out[status] = response
    return out


def not_found(what: str) -> dict[int | str, dict[str, Any]]:
    return {404: {"model": ErrorOut, "description": what}}


def invalid(loc: list[str | int], msg: str, value: Any) -> RequestValidationError:
    return RequestValidationError([{"type": "value_error", "loc": loc, "msg": msg, "input": value}])
