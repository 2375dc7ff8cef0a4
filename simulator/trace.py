"""Replay of an event trace: the simulator driven by job events instead of an instance.

A trace is what a replica's job table sees, in time order: a job posts an
operation (of known volume in bytes, or unknown), a job ends its operation of
unknown volume, and the replica's share of a global split changes (``targets``;
None when the replica decides alone). :func:`replay` steps a fluid model
through it: between two decisions every rate is constant; an operation of
known volume completes when its bytes are moved; the next decision comes at the
next trace event, the next completion, or when the decider asks (a policy's
period), whichever is first. Bytes move in whole bytes. A job has at most one
operation open: its next post ends the previous one.

A :class:`Decider` is told the events and asked for rates. :class:`SimDecider`
keeps each job's accounting with ``policies.accounting``, builds the views the
controller's job table builds and decides through ``policies.decision.decide``.
The controller's scheduler driven through the same trace on a virtual clock
decides the same rates at every step (tests/unit/controller/test_trace_replay.py).

Trace files are JSON lines, one event an object::

    {"t": 0.0, "event": "post", "job": "a", "volume": 1048576,
     "user": "alice", "group": "physics", "nodes": 4, "priority": 1.0}
    {"t": 2.5, "event": "end", "job": "b"}
    {"t": 3.0, "event": "targets", "targets": {"a": 1e8}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from burstctl.policies.accounting import JobAccount, job_view
from burstctl.policies.base import Policy
from burstctl.policies.decision import decide
from burstctl.policies.view import JobId, JobView, SystemView, job_cap

EventKind = Literal["post", "end", "targets"]


class TraceError(ValueError):
    """A malformed trace: names the event (1-based line) and the field at fault."""

    def __init__(self, line: int, field: str, message: str) -> None:
        super().__init__(f"line {line}: {field}: {message}")
        self.line = line
        self.field = field


@dataclass(frozen=True, slots=True)
class JobInfo:
    """Who a job is: what a client's Hello says."""

    user: str = "user"
    group: str = "group"
    nodes: int = 1
    priority: float = 1.0


@dataclass(frozen=True, slots=True)
class TraceEvent:
    t: float
    event: EventKind
    job: JobId = ""
    volume: int = 0  # post: bytes, 0 = unknown (the job ends it with an "end" event)
    info: JobInfo = field(default_factory=JobInfo)  # post: the job's identity
    targets: Mapping[JobId, float] | None = None  # targets: the replica's share, or None


class Decider(Protocol):
    """What :func:`replay` drives: told every event at its time, asked for rates."""

    def post(self, t: float, job: JobId, info: JobInfo, volume: int) -> None: ...

    def moved(self, t: float, job: JobId, nbytes: int) -> None: ...

    def complete(self, t: float, job: JobId) -> None: ...

    def set_targets(self, t: float, targets: Mapping[JobId, float] | None) -> None: ...

    def decide(self, t: float) -> tuple[dict[JobId, float], float | None]:
        """The rates from ``t`` on (a job not listed gets 0), and when the decider
        wants to decide again without an event (None: at events only)."""
        ...


@dataclass(frozen=True, slots=True)
class Step:
    """One decision of a replay."""

    t: float
    rates: dict[JobId, float]


@dataclass(slots=True)
class _Open:
    volume: int
    moved: int = 0


def replay(trace: Sequence[TraceEvent], decider: Decider, *, until: float) -> list[Step]:
    """Runs ``trace`` through ``decider`` up to time ``until``; every decision taken."""
    check_trace(trace)
    steps: list[Step] = []
    open_ops: dict[JobId, _Open] = {}
    t = trace[0].t if trace else 0.0
    i = 0
    rates: dict[JobId, float] = {}
    while t <= until:
        while i < len(trace) and trace[i].t <= t:
            _apply(trace[i], decider, open_ops)
            i += 1
        rates, wake = decider.decide(t)
        steps.append(Step(t, dict(rates)))
        t_next = trace[i].t if i < len(trace) else math.inf
        if wake is not None:
            t_next = min(t_next, wake)
        finishing = None
        for job, rate in rates.items():
            op = open_ops.get(job)
            if op is not None and op.volume > 0 and rate > 0.0:
                end = t + (op.volume - op.moved) / rate
                if end < t_next:
                    t_next, finishing = end, job
        if t_next > until:
            break
        _advance(decider, open_ops, rates, t, t_next, finishing)
        t = t_next
    return steps


def _apply(event: TraceEvent, decider: Decider, open_ops: dict[JobId, _Open]) -> None:
    if event.event == "post":
        if open_ops.pop(event.job, None) is not None:  # its previous operation ends here
            decider.complete(event.t, event.job)
        open_ops[event.job] = _Open(event.volume)
        decider.post(event.t, event.job, event.info, event.volume)
    elif event.event == "end":
        if open_ops.pop(event.job, None) is not None:  # (a known volume may be done already)
            decider.complete(event.t, event.job)
    else:
        decider.set_targets(event.t, event.targets)


def _advance(
    decider: Decider,
    open_ops: dict[JobId, _Open],
    rates: Mapping[JobId, float],
    t: float,
    now: float,
    finishing: JobId | None,
) -> None:
    """Moves the bytes of [t, now] at ``rates``; completes what is done at ``now``."""
    done = []
    for job in sorted(open_ops):
        op = open_ops[job]
        rate = rates.get(job, 0.0)
        if rate <= 0.0:
            continue
        nbytes = round(rate * (now - t))
        if op.volume > 0:
            left = op.volume - op.moved
            nbytes = left if job == finishing else min(left, nbytes)
        if nbytes > 0:
            op.moved += nbytes
            decider.moved(now, job, nbytes)
        if op.volume > 0 and op.moved >= op.volume:
            done.append(job)
    for job in done:
        del open_ops[job]
        decider.complete(now, job)


def check_trace(trace: Sequence[TraceEvent]) -> None:
    """Raises :class:`TraceError` for events out of time order, an ``end`` of a job
    that never posted, or a job whose identity changes between its posts.

    A job has at most one operation open: a post while the previous one is still
    open ends that one first; an ``end`` after the operation completed is a no-op.
    """
    info: dict[JobId, JobInfo] = {}
    last = -math.inf
    for line, e in enumerate(trace, start=1):
        if not (math.isfinite(e.t) and e.t >= last):
            raise TraceError(line, "t", f"must be finite and not before {last}, got {e.t}")
        last = e.t
        if e.event == "post":
            if info.setdefault(e.job, e.info) != e.info:
                raise TraceError(line, "job", f"{e.job!r} changes its identity")
        elif e.event == "end" and e.job not in info:
            raise TraceError(line, "job", f"{e.job!r} has posted nothing to end")


def load_trace(path: str | Path) -> list[TraceEvent]:
    """Reads a JSON-lines trace (module docstring); TraceError names the line."""
    events = []
    for line, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if raw.strip():
            events.append(_event(line, raw))
    check_trace(events)
    return events


def dump_trace(trace: Iterable[TraceEvent], path: str | Path) -> None:
    lines = []
    for e in trace:
        record: dict[str, Any] = {"t": e.t, "event": e.event}
        if e.event == "post":
            record |= {"job": e.job, "volume": e.volume, **_info_fields(e.info)}
        elif e.event == "end":
            record["job"] = e.job
        else:
            record["targets"] = None if e.targets is None else dict(e.targets)
        lines.append(json.dumps(record, sort_keys=True))
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _info_fields(info: JobInfo) -> dict[str, Any]:
    return {"user": info.user, "group": info.group, "nodes": info.nodes, "priority": info.priority}


def _event(line: int, raw: str) -> TraceEvent:
    try:
        record = json.loads(raw)
    except ValueError as exc:
        raise TraceError(line, "json", str(exc)) from None
    if not isinstance(record, dict):
        raise TraceError(line, "event", "must be a JSON object")
    t = record.get("t")
    if not isinstance(t, int | float) or isinstance(t, bool):
        raise TraceError(line, "t", f"must be a number, got {t!r}")
    kind = record.get("event")
    if kind == "targets":
        targets = record.get("targets")
        if targets is not None and not (
            isinstance(targets, dict)
            and all(isinstance(r, int | float) and r >= 0 for r in targets.values())
        ):
            raise TraceError(line, "targets", "must be null or an object of rates >= 0")
        return TraceEvent(float(t), "targets", targets=targets)
    job = record.get("job")
    if not isinstance(job, str) or not job:
        raise TraceError(line, "job", f"must be a non-empty string, got {job!r}")
    if kind == "end":
        return TraceEvent(float(t), "end", job)
    if kind != "post":
        raise TraceError(line, "event", f"must be post, end or targets, got {kind!r}")
    volume = record.get("volume", 0)
    if not isinstance(volume, int) or isinstance(volume, bool) or volume < 0:
        raise TraceError(line, "volume", f"must be an integer >= 0 (bytes), got {volume!r}")
    nodes = record.get("nodes", 1)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise TraceError(line, "nodes", f"must be an integer >= 1, got {nodes!r}")
    priority = record.get("priority", 1.0)
    if not isinstance(priority, int | float) or not priority > 0:
        raise TraceError(line, "priority", f"must be a number > 0, got {priority!r}")
    user, group = record.get("user", "user"), record.get("group", "group")
    if not isinstance(user, str) or not isinstance(group, str):
        raise TraceError(line, "user", "user and group must be strings")
    return TraceEvent(float(t), "post", job, volume, JobInfo(user, group, nodes, float(priority)))


class SimDecider:
    """Decides as a lone replica's scheduler would: one view per decision of the jobs
    with an open operation, each wanting its b_i."""

    def __init__(self, policy: Policy, capacity: float, node_bandwidth: float) -> None:
        self.policy = policy
        self.capacity = capacity
        self.node_bandwidth = node_bandwidth
        self._accounts: dict[JobId, JobAccount] = {}
        self._info: dict[JobId, JobInfo] = {}
        self._ops: dict[JobId, _PostedOp] = {}
        self._targets: Mapping[JobId, float] | None = None

    def post(self, t: float, job: JobId, info: JobInfo, volume: int) -> None:
        account = self._accounts.get(job)
        if account is None:
            account = self._accounts[job] = JobAccount(first_seen=t, index=len(self._accounts))
            self._info[job] = info
        self._ops[job] = _PostedOp(t, volume)
        account.set_phase(True, t)

    def moved(self, t: float, job: JobId, nbytes: int) -> None:
        self._accounts[job].transfer(nbytes)
        self._ops[job].moved += nbytes

    def complete(self, t: float, job: JobId) -> None:
        op = self._ops.pop(job)
        account = self._accounts[job]
        account.op_completed(op.volume, op.moved)
        account.set_phase(False, t)

    def set_targets(self, t: float, targets: Mapping[JobId, float] | None) -> None:
        self._targets = targets

    def view(self, t: float) -> SystemView:
        rows: dict[JobId, JobView] = {}
        for job, op in self._ops.items():
            info = self._info[job]
            cap = job_cap(info.nodes, self.node_bandwidth, self.capacity)
            rows[job] = job_view(
                self._accounts[job],
                (op,),
                job_id=job,
                user=info.user,
                group=info.group,
                nodes=info.nodes,
                priority=info.priority,
                cap=cap,
                demand=cap,
                now=t,
            )
        return SystemView(t, self.capacity, self.node_bandwidth, rows)

    def decide(self, t: float) -> tuple[dict[JobId, float], float | None]:
        decision = decide(self.policy, self.view(t), self._targets)
        return decision.rates, None if decision.period is None else t + decision.period


@dataclass(slots=True)
class _PostedOp:
    posted_at: float
    volume: int
    moved: int = 0
