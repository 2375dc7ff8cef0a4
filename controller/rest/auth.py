"""Who may call the REST API: the admin bearer token and which routes need it.

Mutations need ``Authorization: Bearer <token>`` (401 without, 403 with a wrong one);
reads too when ``protect_reads`` is set. The token comes from ``BURSTCTL_ADMIN_TOKEN``,
else ``admin_token_file``, else ``<state_dir>/admin-token``, created with mode 0600 on
first start. ``Access`` holds the dependencies each kind of route declares, and the
statuses the schema documents for them.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from burstctl.controller.config import ControllerConfig
from burstctl.controller.rest.models import NOT_DURABLE, TOKEN_ERRORS

log = logging.getLogger(__name__)

TOKEN_ENV = "BURSTCTL_ADMIN_TOKEN"
TOKEN_FILE = "admin-token"

# Module level: FastAPI resolves the (string) annotations of the routes' dependencies here.
_BEARER = HTTPBearer(auto_error=False)
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


class TokenError(RuntimeError):
    pass


def admin_token(config: ControllerConfig) -> str:
    """The bearer token for mutations (module docstring); creates the default file."""
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return env
    if config.admin_token_file is not None:
        try:
            token = config.admin_token_file.read_text().strip()
        except OSError as exc:
            raise TokenError(f"cannot read admin token file: {exc}") from None
        if not token:
            raise TokenError(f"admin token file {config.admin_token_file} is empty")
        return token
    path = config.state_dir / TOKEN_FILE
    config.state_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        token = path.read_text().strip()
        if not token:
            raise TokenError(f"admin token file {path} is empty") from None
        return token
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    log.info("created admin token %s (mode 0600)", path)
    return token


@dataclass(frozen=True, slots=True)
class Access:
    """The token check of each kind of route: ``reads`` and ``mutations`` are the route
    dependencies, ``read_errors`` and ``change_errors`` the statuses their schema adds."""

    reads: list[Any]
    mutations: list[Any]
    read_errors: dict[int | str, dict[str, Any]]
    change_errors: dict[int | str, dict[str, Any]]

    @classmethod
    def build(cls, token: str, protect_reads: bool) -> Access:
        def require_token(creds: BearerCredentials) -> None:
            if creds is None or creds.scheme.lower() != "bearer":
                raise HTTPException(
                    401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"}
                )
            if not secrets.compare_digest(creds.credentials.encode(), token.encode()):
                raise HTTPException(403, "wrong bearer token")

        # The schema declares the bearer scheme (and its 401/403) only where the token is
        # required: on mutations always, on reads only with ``protect_reads`` (the config is
        # frozen, so deciding here is deciding for every request).
        checked = [Depends(require_token)]
        return cls(
            reads=checked if protect_reads else [],
            mutations=checked,
            read_errors=TOKEN_ERRORS if protect_reads else {},
            change_errors={**TOKEN_ERRORS, **NOT_DURABLE},
        )
