"""The live dashboard: ``GET /`` and its static files under ``/static/`` (docs/dashboard.md).

Owns only the serving of the page; the page itself (``static/index.html``,
``dashboard.js``, ``dashboard.css``) is plain JavaScript that polls the REST API
(``/v1/jobs``, ``/v1/policy``, ``/v1/schedules``, ``/v1/capacity``, ``/v1/policies``) once a
second and switches the
policy with ``PUT /v1/policy``, so it needs nothing of the ``Replica`` and sees
exactly what any other API client sees, ``protect_reads`` included. The chart
library is vendored under ``static/vendor/`` (see its README): controllers run on
machines without internet access, so nothing comes from a CDN.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

_PACKAGE = "burstctl.controller"
_STATIC = "static"


def mount_dashboard(app: FastAPI) -> None:
    """Adds ``GET /`` (the page) and ``/static/`` (its scripts, styles and vendored library)."""
    # packages=: resolved through importlib, so a wheel and an editable install both work.
    static = StaticFiles(packages=[(_PACKAGE, _STATIC)], follow_symlink=False)
    index = static.lookup_path("index.html")[0]
    if not index:
        raise RuntimeError(f"dashboard page missing: package data {_PACKAGE}/{_STATIC}/index.html")

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        """The dashboard page; it holds no data, so it is open even with ``protect_reads``."""
        # no-cache: a restarted controller with a newer page is picked up on reload.
        return FileResponse(index, media_type="text/html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", static, name="static")
