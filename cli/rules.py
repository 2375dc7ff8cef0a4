"""``burstctl rules list|add|rm``: the operator's rules over the REST API (docs/rules.md).

A rule matches jobs (``--job``, ``--user``, ``--group``, ``--app``: exact names or shell-style
patterns) and sets a ``--limit`` and a ``--reservation`` (rates such as ``10MiB/s``, across
all replicas), a ``--weight`` and ``--metadata-ops`` (per job, ops/s). Changes need the
admin token, like every change (``burstctl policy --help``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from burstctl.cli.admin import Api, _connection_options, _rate
from burstctl.common.units import parse_rate


def _rate_option(value: str | None, option: str) -> float:
    if value is None:
        return 0.0
    try:
        return parse_rate(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


@click.group()
def rules() -> None:
    """See and change the operator's rules: limits, reservations, weights, metadata ops/s."""


@rules.command("list")
@_connection_options
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def rules_list(url: str, token: str | None, token_file: Path | None, as_json: bool) -> None:
    """The rules in force, in the order they bind jobs, and what they hold now."""
    got = Api(url, token, token_file).request("GET", "/v1/rules")
    if as_json:
        click.echo(json.dumps(got, indent=2))
        return
    if got["overcommitted"]:
        click.echo(
            f"warning: the reservations sum to {_rate(got['overcommitted'])}, above the "
            "capacity: they are scaled down to it"
        )
    for r in got["rules"]:
        sets = []
        if r["limit"]:
            sets.append(f"limit {_rate(r['limit'])}" + (" (binds)" if r["limited"] else ""))
        if r["reservation"]:
            met = "" if r["reservation_met"] is not False else " (unmet)"
            sets.append(f"reservation {_rate(r['reservation'])}{met}")
        if r["weight"] != 1:
            sets.append(f"weight {r['weight']:g}")
        if r["metadata_ops"]:
            sets.append(f"metadata {r['metadata_ops']:g} ops/s")
        match = " ".join(f"{k}={v}" for k, v in r["match"].items())
        click.echo(
            f"{r['name']}  rank {r['rank']}  [{match}]  {', '.join(sets)}  "
            f"jobs {len(r['jobs'])}, {_rate(r['rate'])}"
        )


@rules.command("add")
@_connection_options
@click.argument("name")
@click.option("--job", help="Job id or pattern.")
@click.option("--user", help="User name or pattern.")
@click.option("--group", help="Group name or pattern.")
@click.option("--app", help="Application name or pattern (a registered job's app).")
@click.option("--limit", help="Most the bound jobs get together, e.g. 10MiB/s.")
@click.option("--reservation", help="Least they get while they demand it, e.g. 30MiB/s.")
@click.option("--weight", type=float, default=1.0, show_default=True, help="Share multiplier.")
@click.option("--metadata-ops", type=float, default=0.0, help="Metadata ops/s per bound job.")
@click.option("--rank", type=int, default=100, show_default=True, help="Lower binds first.")
@click.option("--replace", is_flag=True, help="Replace a rule of this name (else refused).")
def rules_add(
    url: str,
    token: str | None,
    token_file: Path | None,
    name: str,
    job: str | None,
    user: str | None,
    group: str | None,
    app: str | None,
    limit: str | None,
    reservation: str | None,
    weight: float,
    metadata_ops: float,
    rank: int,
    replace: bool,
) -> None:
    """Add rule NAME (refused with the sum when the reservations would not fit)."""
    match = {k: v for k, v in (("job", job), ("user", user), ("group", group), ("app", app)) if v}
    if not match:
        raise click.UsageError("name at least one of --job, --user, --group, --app")
    body: dict[str, Any] = {
        "match": match,
        "rank": rank,
        "limit": _rate_option(limit, "--limit"),
        "reservation": _rate_option(reservation, "--reservation"),
        "weight": weight,
        "metadata_ops": metadata_ops,
    }
    api = Api(url, token, token_file)
    if replace:
        got = api.request("PUT", f"/v1/rules/{quote(name, safe='')}", body)
    else:
        got = api.request("POST", "/v1/rules", {"name": name, **body})
    click.echo(f"rule {got['name']} in force; it binds {len(got['jobs'])} job(s) here")


@rules.command("rm")
@_connection_options
@click.argument("name")
def rules_rm(url: str, token: str | None, token_file: Path | None, name: str) -> None:
    """Remove rule NAME."""
    Api(url, token, token_file).request("DELETE", f"/v1/rules/{quote(name, safe='')}")
    click.echo(f"rule {name} removed")
