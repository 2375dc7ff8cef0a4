"""``burstctl policies|policy|jobs|job|top|placement ...``: admin commands over the REST API
(docs/rest.md); ``policies`` lists the registry of this installation (``rules``: cli/rules.py).

Every command takes ``--url`` (``BURSTCTL_URL``, default the controller's
default ``--http-listen``) and, for mutations, a bearer token: ``--token``
(``BURSTCTL_ADMIN_TOKEN``) or ``--token-file`` (``BURSTCTL_ADMIN_TOKEN_FILE``;
the controller writes ``<state-dir>/admin-token`` on first start).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import click

from burstctl.common.limits import ALLOCATOR_NAMES, PLACEMENT_NAMES

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_URL = "http://127.0.0.1:8080"
JOBS_PAGE = 1000  # jobs per GET /v1/jobs request (the controller's largest page)
TOP_ROWS = 100  # rows of `burstctl top`: the jobs with the highest rate


def _connection_options(f: F) -> F:
    f = click.option(
        "--token-file",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="BURSTCTL_ADMIN_TOKEN_FILE",
        help="File holding the bearer token, e.g. <state-dir>/admin-token.",
    )(f)
    f = click.option(
        "--token",
        envvar="BURSTCTL_ADMIN_TOKEN",
        metavar="TOKEN",
        help="Bearer token for changes [env BURSTCTL_ADMIN_TOKEN].",
    )(f)
    f = click.option(
        "--url",
        envvar="BURSTCTL_URL",
        default=DEFAULT_URL,
        show_default=True,
        help="The controller's REST address [env BURSTCTL_URL].",
    )(f)
    return f


class Api:
    """A thin client of ``/v1``; every failure becomes a ClickException with the reason."""

    def __init__(self, url: str, token: str | None, token_file: Path | None) -> None:
        self.url = url.rstrip("/")
        if token is None and token_file is not None:
            try:
                token = token_file.read_text().strip()
            except OSError as exc:
                raise click.ClickException(f"cannot read token file: {exc}") from None
        self.token = token or None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        import httpx

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            r = httpx.request(method, self.url + path, json=body, headers=headers, timeout=10)
        except httpx.HTTPError as exc:
            raise click.ClickException(
                f"cannot reach the controller at {self.url}: {exc}"
            ) from None
        if r.status_code == 401:
            raise click.ClickException(
                "the controller wants a bearer token: --token, BURSTCTL_ADMIN_TOKEN or"
                " --token-file (the controller writes <state-dir>/admin-token)"
            )
        if r.status_code == 403:
            raise click.ClickException("the controller rejected the token")
        if r.status_code == 422:
            raise click.ClickException(_validation_message(r.json()))
        if r.status_code == 404:
            raise click.ClickException(str(r.json().get("detail", "not found")))
        if r.status_code == 409:  # a conflict the controller explains
            raise click.ClickException(str(r.json().get("detail", "conflict")))
        if r.status_code >= 400:
            raise click.ClickException(f"{method} {path}: HTTP {r.status_code}: {r.text}")
        return r.json() if r.content else None


def _validation_message(body: Any) -> str:
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', []) if p != 'body')}: {d.get('msg')}"
            for d in detail
        )
    return str(detail)


def _parse_param(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"expected KEY=VALUE, got {text!r}", param_hint="--param")
    try:
        value = json.loads(raw)  # numbers, booleans, lists; anything else stays a string
    except json.JSONDecodeError:
        value = raw
    return key, value


@click.group()
def policy() -> None:
    """See and switch the controller's policy (REST API, docs/rest.md)."""


@policy.command("list")
@_connection_options
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def policy_list(url: str, token: str | None, token_file: Path | None, as_json: bool) -> None:
    """The policies the controller accepts."""
    rows = Api(url, token, token_file).request("GET", "/v1/policies")
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max((len(r["name"]) for r in rows), default=0)
    for r in rows:
        params = ", ".join(r["params_schema"].get("properties", {})) or "-"
        click.echo(f"{r['name']:<{width}}  {r['family']:<18}  params: {params}")


@policy.command("get")
@_connection_options
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def policy_get(url: str, token: str | None, token_file: Path | None, as_json: bool) -> None:
    """The active policy."""
    p = Api(url, token, token_file).request("GET", "/v1/policy")
    if as_json:
        click.echo(json.dumps(p, indent=2))
        return
    params = json.dumps(p["params"], sort_keys=True) if p["params"] else ""
    click.echo(f"{p['name']} {params}".rstrip())
    click.echo(f"version {p['version']} on replica {p['replica_id']} since {p['since']}")


@policy.command("set")
@click.argument("name")
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="A policy parameter; VALUE is read as JSON when it parses, else as a string.",
)
@_connection_options
def policy_set(
    name: str, params: tuple[str, ...], url: str, token: str | None, token_file: Path | None
) -> None:
    """Switch to policy NAME (a registered name or a sharing spec such as group>user>size)."""
    body = {"name": name, "params": dict(_parse_param(p) for p in params)}
    p = Api(url, token, token_file).request("PUT", "/v1/policy", body)
    click.echo(f"policy {p['name']} active (version {p['version']})")


def _rate(bps: float) -> str:
    return f"{bps / (1 << 20):.1f} MiB/s"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


JOB_COLUMNS = ("job", "user", "group", "nodes", "state", "rate", "read", "written", "yield")


def job_row(j: dict[str, Any]) -> tuple[str, ...]:
    state = "io" if j["in_io"] else "active" if j["active"] else "inactive"
    if j["registered"]:
        state += "*"
    y = j.get("yield")
    return (
        j["job_id"],
        j["user"],
        j["group"],
        str(j["nodes"]),
        state,
        _rate(j["rate"]),
        _size(j["bytes_read"]),
        _size(j["bytes_written"]),
        "-" if y is None else f"{y:.3f}",
    )


@click.command()
@_connection_options
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def jobs(url: str, token: str | None, token_file: Path | None, as_json: bool) -> None:
    """The jobs the controller knows (state * = registered metadata)."""
    api = Api(url, token, token_file)
    rows: list[Any] = []
    while True:  # GET /v1/jobs answers one bounded page at a time
        page = api.request("GET", f"/v1/jobs?limit={JOBS_PAGE}&offset={len(rows)}")
        rows += page
        if len(page) < JOBS_PAGE:
            break
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = [JOB_COLUMNS, *(job_row(j) for j in rows)]
    widths = [max(len(r[i]) for r in table) for i in range(len(JOB_COLUMNS))]
    for r in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


@click.group()
def job() -> None:
    """Register and retire jobs with authoritative metadata (Slurm prolog/epilog)."""


@job.command("register")
@click.argument("job_id")
@click.option("--user", required=True, help="Owner user name.")
@click.option("--group", required=True, help="Owner group (or account) name.")
@click.option("--nodes", type=int, required=True, help="p_i, compute nodes of the job.")
@click.option("--priority", type=float, default=1.0, show_default=True)
@click.option(
    "--app",
    default=None,
    help="Application name, the key of its profile for placement advice"
    " [default: the job id's prefix].",
)
@_connection_options
def job_register(
    job_id: str,
    user: str,
    group: str,
    nodes: int,
    priority: float,
    app: str | None,
    url: str,
    token: str | None,
    token_file: Path | None,
) -> None:
    """Register JOB_ID; its metadata wins over what its clients claim."""
    body: dict[str, Any] = {
        "job_id": job_id,
        "user": user,
        "group": group,
        "nodes": nodes,
        "priority": priority,
    }
    if app:
        body["app"] = app
    j = Api(url, token, token_file).request("POST", "/v1/jobs", body)
    click.echo(f"job {j['job_id']} registered ({j['user']}/{j['group']}, {j['nodes']} nodes)")


@job.command("retire")
@click.argument("job_id")
@_connection_options
def job_retire(job_id: str, url: str, token: str | None, token_file: Path | None) -> None:
    """Retire JOB_ID's registration (its open sessions keep going until they close)."""
    Api(url, token, token_file).request("DELETE", f"/v1/jobs/{quote(job_id, safe='')}")
    click.echo(f"job {job_id} retired")


@click.command()
@_connection_options
@click.option(
    "--allocator",
    type=click.Choice(ALLOCATOR_NAMES),
    default=None,
    help="Allocator to ask for [default: chosen by each job's information level].",
)
@click.option(
    "--placement",
    "placement_name",
    type=click.Choice(PLACEMENT_NAMES),
    default=None,
    help="Placement to ask for [default: chosen by information level].",
)
@click.option(
    "--job",
    "job_id",
    default=None,
    help="Advise this one job about to start (POST /v1/placement) instead of all"
    " (needs --user, --group, --nodes).",
)
@click.option("--user", default=None, help="With --job: its user.")
@click.option("--group", default=None, help="With --job: its group.")
@click.option("--nodes", type=int, default=None, help="With --job: its compute nodes (Q_j).")
@click.option("--app", default=None, help="With --job: its application name.")
@click.option(
    "--export",
    "as_export",
    is_flag=True,
    help="With --job: print `export BURSTCTL_REPLICAS=host:port,...` (a Slurm TaskProlog).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def placement(
    url: str,
    token: str | None,
    token_file: Path | None,
    allocator: str | None,
    placement_name: str | None,
    job_id: str | None,
    user: str | None,
    group: str | None,
    nodes: int | None,
    app: str | None,
    as_export: bool,
    as_json: bool,
) -> None:
    """Placement advice over the live replicas ([DIST-IO]; docs/placement-live.md): how many
    and which replicas each job should use, the allocator and information level used, and the
    I/O-load."""
    api = Api(url, token, token_file)
    if job_id is None:
        if as_export:
            raise click.UsageError("--export needs --job")
        query = "&".join(
            f"{k}={v}" for k, v in (("allocator", allocator), ("placement", placement_name)) if v
        )
        advice = api.request("GET", "/v1/placement" + (f"?{query}" if query else ""))
    else:
        missing = [
            f"--{n}" for n, v in (("user", user), ("group", group), ("nodes", nodes)) if v is None
        ]
        if missing:
            raise click.UsageError(f"--job needs {', '.join(missing)}")
        body: dict[str, Any] = {"job_id": job_id, "user": user, "group": group, "nodes": nodes}
        for key, value in (("app", app), ("allocator", allocator), ("placement", placement_name)):
            if value:
                body[key] = value
        advice = api.request("POST", "/v1/placement", body)
    if as_json:
        click.echo(json.dumps(advice, indent=2))
        return
    if as_export:
        mine = advice["jobs"][0]["addresses"] if advice["jobs"] else []
        click.echo(f"export BURSTCTL_REPLICAS={','.join(mine)}")
        return
    load = advice["io_load"]
    click.echo(
        f"{len(advice['replicas'])} live replicas: {', '.join(advice['replicas'])}; "
        f"I/O-load {'-' if load is None else f'{load:.3f}'}"
    )
    columns = ("job", "count", "replicas", "allocator", "level", "fallback")
    table = [columns] + [
        (
            j["job_id"],
            str(j["count"]),
            ",".join(j["replicas"]),
            j["allocator_used"],
            str(j["level"]),
            j["fallback"] or "-",
        )
        for j in advice["jobs"]
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    for r in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


@click.command()
@_connection_options
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds per refresh.")
@click.option(
    "--iterations", type=int, default=0, help="Stop after N refreshes [default: 0, run until ^C]."
)
def top(
    url: str, token: str | None, token_file: Path | None, interval: float, iterations: int
) -> None:
    """A live table of the jobs with the highest rate (at most 100): measured throughput,
    allotted rate, bytes, yield, seconds waited on the bucket, and the rule that binds each
    (``!``: its limit holds the job back; ``✗``: its reservation is unmet)."""
    import time

    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    if not interval > 0:
        raise click.BadParameter("must be > 0", param_hint="--interval")
    api = Api(url, token, token_file)
    console = Console()
    previous: dict[str, int] = {}
    last = time.monotonic()

    def render() -> Table:
        nonlocal previous, last
        rows = api.request("GET", f"/v1/jobs?order=rate&limit={TOP_ROWS}")
        policy = api.request("GET", "/v1/policy")
        now = time.monotonic()
        elapsed = max(now - last, 1e-9)
        title = f"burstctl {url} — policy {policy['name']} (version {policy['version']})"
        table = Table(title=title, title_justify="left")
        for name in ("job", "user", "group", "nodes", "state", "throughput", "rate", "moved"):
            table.add_column(name, justify="right" if name in {"nodes", "throughput"} else "left")
        table.add_column("yield", justify="right")
        table.add_column("waited", justify="right")  # on its bucket: throttled
        table.add_column("rule")  # !: its limit holds it back; ✗: its reservation is unmet
        seen: dict[str, int] = {}
        for j in sorted(rows, key=lambda j: -j["rate"]):
            job_id, moved = j["job_id"], j["bytes_moved"]
            seen[job_id] = moved
            rate = (moved - previous[job_id]) / elapsed if job_id in previous else 0.0
            cells = job_row(j)
            rule = j.get("rule") or "-"
            rule += "!" if j.get("limited_by") else "✗" if j.get("reservation_met") is False else ""
            waited = f"{j['wait_seconds']:.1f} s"
            table.add_row(*cells[:5], _rate(rate), cells[5], _size(moved), cells[-1], waited, rule)
        previous, last = seen, now
        return table

    done = 0
    with Live(render(), console=console, auto_refresh=False) as live:
        try:
            while iterations <= 0 or (done := done + 1) < iterations:
                time.sleep(interval)  # the refresh period of a terminal display
                live.update(render(), refresh=True)
        except KeyboardInterrupt:
            pass


@click.command("policies")
def list_policies() -> None:
    """List the policies this installation knows."""
    from burstctl.policies.registry import default_registry

    for name in default_registry().names():
        click.echo(name)
