"""Campaigns: the one runner every sweep command uses (docs/simulator.md, "Campaigns").

A campaign is a list of cases (picklable), a function run on each case that returns
the case's rows, and a place for the rows. The cases run on Dask: a ``LocalCluster`` of
worker processes on loopback (``workers``, default the CPUs, no dashboard), or an
existing cluster (``scheduler``, e.g. ``tcp://127.0.0.1:8786``). ``workers=1`` without
a scheduler runs the cases in this process, one after the other, for debugging; the
rows are the same.

Rows are identical whichever way the cases ran: each case's rows depend on the case
only, and they are put in the order of the case list, never in completion order.

Progress goes to a callback (the CLI gives stderr): one line per finished case.

With an output file (`RowFile`), the rows of each case are appended to it as the case
finishes, in one write, so a killed campaign keeps every case it finished; at the end
the file is rewritten (a temporary file, then ``os.replace``) with every row in the
order of the case list. `RowFile.open(resume=True)` reads back the cases a killed
campaign finished, and the campaign then computes only the others.

A `RowFile` with ``params`` (everything that determines a case's rows other than the
case's keys: the generator and window flags, the policies, ...) records them in a
sidecar ``FILE.meta.json`` (written atomically after the rows file is started); a resume
whose ``params`` differ from the record is refused (`ParamsMismatch`) before the file is
touched. A file without its record (written before campaigns recorded their flags)
resumes with a warning that its flags cannot be checked.

Dask and distributed are imported only when cases run on a cluster (the ``sim`` extra).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import socket
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Generic, Literal, TypeVar

from burstctl.common.files import write_atomically

C = TypeVar("C")
R = TypeVar("R")
Row = dict[str, Any]
Format = Literal["csv", "json"]


class CampaignError(Exception):
    """A campaign that cannot start: a cluster out of reach, an output file of another
    campaign, a missing ``sim`` extra."""


class ParamsMismatch(CampaignError):
    """A resume with other parameters than the file's record: ``differences`` lists
    ``(name, recorded, given)``, recorded being None for a name the record lacks."""

    def __init__(self, path: Path, differences: Sequence[tuple[str, Any, Any]]) -> None:
        self.path = path
        self.differences = list(differences)
        what = "; ".join(
            f"{name} {_shown(given)} (the file has {_shown(recorded)})"
            for name, recorded, given in self.differences
        )
        super().__init__(
            f"{path} was written by another campaign: {what}. Resume with the flags of the"
            " interrupted run, or start again with another file; the file is left as it was"
        )


def _shown(value: Any) -> str:
    return "none" if value is None else json.dumps(value)


def meta_path(path: Path) -> Path:
    """The sidecar record of a campaign's output file: ``FILE.meta.json``."""
    return path.with_name(path.name + ".meta.json")


def _plain(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as JSON gives them back (tuples become lists, paths strings)."""
    loaded: dict[str, Any] = json.loads(json.dumps(dict(params), default=str))
    return loaded


@dataclass(frozen=True, slots=True)
class Cluster:
    """Where the cases run. ``scheduler``: the address of an existing Dask scheduler;
    otherwise a ``LocalCluster`` of ``workers`` processes (default: the CPUs), or this
    process alone when ``workers == 1``."""

    workers: int | None = None
    scheduler: str | None = None

    def describe(self) -> str:
        if self.scheduler is not None:
            return f"the Dask cluster at {self.scheduler}"
        if self.workers == 1:
            return "this process"
        return f"a local Dask cluster of {self.workers or os.cpu_count() or 1} processes"


def run_cases(
    fn: Callable[[C], R], cases: Sequence[C], todo: Sequence[int], cluster: Cluster
) -> Iterator[tuple[int, R]]:
    """Runs ``fn`` on ``cases[i]`` for each ``i`` in ``todo``; yields ``(i, rows)`` as each
    case finishes (completion order). An exception raised by ``fn`` propagates."""
    if not todo:
        return
    if cluster.scheduler is None and cluster.workers == 1:
        for i in todo:
            yield i, fn(cases[i])
        return
    yield from _run_on_dask(fn, cases, todo, cluster)


def _run_on_dask(
    fn: Callable[[C], R], cases: Sequence[C], todo: Sequence[int], cluster: Cluster
) -> Iterator[tuple[int, R]]:
    try:
        import dask
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise CampaignError(
            "campaigns on Dask need the sim extra: pip install 'burstctl[sim]'"
        ) from None
    # Our own settings, not the user's dask.yaml: no dashboard, quiet unless wrong, and
    # worker processes that never outlive this one.
    settings = {
        "distributed.worker.daemon": True,
        "logging.distributed": "warning",
    }
    with dask.config.set(settings):
        if cluster.scheduler is not None:
            _reachable(cluster.scheduler)
            try:
                client = Client(cluster.scheduler, timeout="20s")
            except OSError as exc:
                raise CampaignError(f"no Dask scheduler at {cluster.scheduler}: {exc}") from None
            local: Any = None
        else:
            local = LocalCluster(
                n_workers=cluster.workers or os.cpu_count() or 1,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                scheduler_port=0,
                dashboard_address=None,
                # The scheduler's HTTP server (health routes) runs even without the
                # dashboard: on a free loopback port, not 8787, which a second campaign
                # on the node (or anything else) may hold.
                scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
                silence_logs=logging.WARNING,
            )
            client = Client(local)
        try:
            futures = client.map(fn, [cases[i] for i in todo], pure=False)
            index = {f.key: i for f, i in zip(futures, todo, strict=True)}
            for future, result in as_completed(futures, with_results=True):
                yield index[future.key], result
        finally:
            client.close()
            if local is not None:
                local.close()


def _reachable(address: str) -> None:
    """Fails at once on a TCP scheduler that refuses connections (Dask would retry until
    its timeout); other protocols are left to Dask."""
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "tcp"):
        return
    host, _, port = rest.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except ValueError:
        raise CampaignError(f"{address}: not a scheduler address (tcp://HOST:PORT)") from None
    except OSError as exc:
        raise CampaignError(f"no Dask scheduler at {address}: {exc}") from None


@dataclass
class RowFile(Generic[C]):
    """The output file of a campaign: CSV (a header, then rows) or JSON lines.

    ``key_of_case`` and ``key_of_row`` map a case and a row to the same key (a row read
    back from CSV has strings for values, so the key must parse them); ``rows_per_case``
    says how many rows a finished case has. ``params``: the campaign's parameters other
    than the case keys, recorded in ``FILE.meta.json`` and checked on resume (JSON
    values; see the module docstring).
    """

    path: Path
    fmt: Format
    fields: Sequence[str]
    key_of_case: Callable[[C], Hashable]
    key_of_row: Callable[[Row], Hashable]
    rows_per_case: Callable[[C], int]
    params: Mapping[str, Any] | None = None
    _lines: dict[int, list[str]] = field(default_factory=dict, init=False)
    _out: IO[str] | None = field(default=None, init=False)

    def render(self, rows: Sequence[Row]) -> list[str]:
        """Each row as one line of the file, ``\\n`` included."""
        if self.fmt == "json":
            return [json.dumps(row) + "\n" for row in rows]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(self.fields), lineterminator="\n")
        lines = []
        for row in rows:
            writer.writerow(row)
            lines.append(buf.getvalue())
            buf.seek(0)
            buf.truncate()
        return lines

    def header(self) -> str:
        return ",".join(self.fields) + "\n" if self.fmt == "csv" else ""

    def open(
        self,
        cases: Sequence[C],
        *,
        resume: bool,
        warn: Callable[[str], None] | None = None,
    ) -> list[int]:
        """Starts the file; returns the indices of the cases still to compute. ``resume``:
        keeps the finished cases already in the file (every row of the case present)
        and drops the rest, such as the torn last line of a killed run; refuses
        (`ParamsMismatch`) a file recorded with other ``params``, leaving it as it was;
        ``warn`` gets the warning about a file without a record."""
        if resume and self.path.exists():
            self._check_params(warn)
            self._lines = self._read_back(cases)
        self._replace(sorted(self._lines))
        self._write_params()
        self._out = self.path.open("a", newline="")
        return [i for i in range(len(cases)) if i not in self._lines]

    def _check_params(self, warn: Callable[[str], None] | None) -> None:
        if self.params is None:
            return
        meta = meta_path(self.path)
        try:
            recorded = json.loads(meta.read_text())
        except FileNotFoundError:
            if warn is not None:
                warn(
                    f"warning: {self.path} has no {meta.name} (written before campaigns"
                    " recorded their flags): its flags cannot be checked; resuming as if"
                    " they were these"
                )
            return
        except ValueError as exc:
            raise CampaignError(f"{meta}: not JSON ({exc}); cannot resume") from None
        if not isinstance(recorded, dict):
            raise CampaignError(f"{meta}: not a campaign's record; cannot resume")
        given = _plain(self.params)
        names = list(dict.fromkeys([*given, *recorded]))
        differences = [
            (name, recorded.get(name), given.get(name))
            for name in names
            if recorded.get(name) != given.get(name)
        ]
        if differences:
            raise ParamsMismatch(self.path, differences)

    def _write_params(self) -> None:
        """The record, atomically (after the rows file: a kill between the two leaves the
        old record beside an empty file, which a resume with other flags refuses)."""
        if self.params is None:
            return
        write_atomically(meta_path(self.path), json.dumps(_plain(self.params), indent=1) + "\n")

    def case_rows(self) -> list[list[Row]]:
        """The rows of every case in the file (after `finish`), in case order, as read
        back (JSON lines: the values as written; CSV: strings)."""
        out = []
        for i in sorted(self._lines):
            text = "".join(self._lines[i])
            if self.fmt == "json":
                out.append([json.loads(line) for line in text.splitlines()])
            else:
                reader = csv.DictReader(io.StringIO(text), fieldnames=list(self.fields))
                out.append([dict(r) for r in reader])
        return out

    def add(self, index: int, rows: Sequence[Row]) -> None:
        """Appends one finished case's rows in one write."""
        assert self._out is not None, "open() first"
        lines = self.render(rows)
        self._lines[index] = lines
        self._out.write("".join(lines))
        self._out.flush()

    def finish(self) -> None:
        """Rewrites the file with every row in case order."""
        if self._out is not None:
            self._out.close()
            self._out = None
        self._replace(sorted(self._lines))

    def _replace(self, order: Sequence[int]) -> None:
        """Writes the header and the given cases' rows to a temporary file beside the
        output, then renames it over the output: a kill leaves the old file or the new."""
        write_atomically(self.path, self.header() + "".join("".join(self._lines[i]) for i in order))

    def _read_back(self, cases: Sequence[C]) -> dict[int, list[str]]:
        text = self.path.read_text()
        if not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]  # the last line was torn by a kill
        rows: list[Row]
        if self.fmt == "csv":
            if not text:
                return {}
            if not text.startswith(self.header()):
                raise CampaignError(
                    f"{self.path}: its columns are not this campaign's; cannot resume"
                )
            try:
                parsed = list(csv.DictReader(io.StringIO(text), restkey="\0"))
            except csv.Error as exc:
                raise CampaignError(f"{self.path}: not CSV ({exc}); cannot resume") from None
            # A record cut short by a kill inside a quoted field has missing values.
            rows = [r for r in parsed if None not in r.values() and "\0" not in r]
            lines = self.render(rows)
        else:
            lines = text.splitlines(keepends=True)
            try:
                rows = [json.loads(line) for line in lines]
            except json.JSONDecodeError as exc:
                raise CampaignError(f"{self.path}: not JSON lines ({exc}); cannot resume") from None
        where = {self.key_of_case(c): i for i, c in enumerate(cases)}
        found: dict[int, list[str]] = {}
        for line, row in zip(lines, rows, strict=True):
            try:
                key = self.key_of_row(row)
            except (KeyError, ValueError, TypeError):
                raise CampaignError(
                    f"{self.path}: a row without this campaign's keys; cannot resume"
                ) from None
            if key not in where:
                raise CampaignError(
                    f"{self.path}: a row of another campaign ({key}); cannot resume"
                )
            found.setdefault(where[key], []).append(line)
        return {i: ls for i, ls in found.items() if len(ls) == self.rows_per_case(cases[i])}


def run_campaign(
    fn: Callable[[C], list[Row]],
    cases: Sequence[C],
    cluster: Cluster,
    *,
    out: RowFile[C] | None = None,
    resume: bool = False,
    progress: Callable[[str], None] | None = None,
    label: Callable[[C], str] = str,
) -> list[list[Row]] | None:
    """Runs every case (only the missing ones when ``resume``).

    Without ``out``, returns each case's rows in case order. With ``out``, the rows go to
    the file (see `RowFile`) and the result is None.
    """
    say = progress or (lambda _line: None)
    todo = out.open(cases, resume=resume, warn=say) if out is not None else list(range(len(cases)))
    n = len(cases)
    kept = n - len(todo)
    head = f"campaign: {n} cases on {cluster.describe()}"
    if out is not None and resume:
        head += f"; {kept} already in {out.path}, {len(todo)} to compute"
    say(head)
    results: dict[int, list[Row]] = {}
    done = kept
    for computed, (i, rows) in enumerate(run_cases(fn, cases, todo, cluster), start=1):
        done += 1
        if out is not None:
            out.add(i, rows)
        else:
            results[i] = rows
        say(f"[{done}/{n}] computed {computed}/{len(todo)}: {label(cases[i])}")
    if out is not None:
        out.finish()
        say(f"campaign: {n} cases, {len(todo)} computed, rows in {out.path}")
        return None
    return [results[i] for i in range(n)]


def map_cases(
    fn: Callable[[C], R],
    cases: Sequence[C],
    cluster: Cluster,
    *,
    progress: Callable[[str], None] | None = None,
    label: Callable[[C], str] = str,
) -> list[R]:
    """``[fn(c) for c in cases]`` on ``cluster``, in case order, with a progress line per
    finished case: for campaigns whose results are not rows of a file (no ``--resume``)."""
    say = progress or (lambda _line: None)
    n = len(cases)
    say(f"campaign: {n} cases on {cluster.describe()}")
    results: dict[int, R] = {}
    for done, (i, result) in enumerate(run_cases(fn, cases, range(n), cluster), start=1):
        results[i] = result
        say(f"[{done}/{n}] computed {done}/{n}: {label(cases[i])}")
    return [results[i] for i in range(n)]
