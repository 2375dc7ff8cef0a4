"""Digest deltas: what a replica sends of its jobs when its peer holds its previous digest.

A replica's stream to a peer carries a full digest first, then deltas
(``Digest.base_sequence`` > 0): the jobs that arrived or changed since the
digest sent before on that stream, and the ids of those that left
(``Digest.left``). The receiver applies a delta to the digest it holds of that
sender (:func:`apply`) only when that digest is the delta's base, so a delta is
never merged onto the wrong base.

The sender keeps the digest its peers hold of it, the *sent view*
(:func:`advance`): every row as last sent. A row is sent again when any of its
columns differs, bit for bit, from the sent one; times are instants on the
sender's clock (``controller/digest.py``), so a job whose only change is that
time passed is not resent. Two exceptions, each compared with the value sent
(so what peers hold never drifts further than the tolerance from the truth):
the ``progress`` P_i of a job with no open operation on the sender grows with
time (its work time runs), and is resent when it differs from the sent one by
more than ``PROGRESS_TOLERANCE`` of it; a job's ``demand`` (a measured rate
times the headroom, which wobbles) is resent when it differs by more than
``DEMAND_TOLERANCE``, the controller's default push tolerance, below which no
client's pace changes anyway; 0 and > 0 always differ. Every
``FULL_EVERY``-th digest resets the sent view to the digest as built.

The catalog (``controller/catalog.py``) rides along: a delta carries the records whose
``(version, origin)`` the sent view does not hold, and the receiver merges them into its
base's (the highest ``(version, origin)`` of each identity wins). A tombstone the sender has
forgotten stays in the receiver's reconstruction until the next full digest.

The receiver's reconstruction equals the sender's sent view bit for bit, and
the sender merges its own sent view, not the digest as built, so that every
replica computes the global view from the same input.

Pure: arrays in, arrays out; the stream bookkeeping is ``controller/peer_link.py``'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from burstctl.common.limits import MAX_JOBS
from burstctl.controller.catalog import changed_since, merged
from burstctl.controller.digest import (
    JOB_ARRAY_FIELDS,
    JOB_TEXT_FIELDS,
    OPTIONAL_FIELDS,
    Digest,
    DigestError,
    DigestJobs,
)

# A digest with this many sequences since the last reset of the sent view is sent
# as built (a full digest on every stream): progress drift is bounded, and a peer
# that holds a wrong view for any reason is set right within FULL_EVERY·λ.
FULL_EVERY = 20
# Relative change of P_i of a job without an open operation that is not worth a row.
PROGRESS_TOLERANCE = 0.01
# Relative change of a job's demand that is not worth a row (config push_tolerance's default).
DEMAND_TOLERANCE = 0.02

_NAN_EQUAL = frozenset(OPTIONAL_FIELDS)  # NaN marks an absent value: equal


def _gather(first: DigestJobs, at: np.ndarray, second: DigestJobs, other: np.ndarray) -> DigestJobs:
    """Row k: row ``at[k]`` of ``first`` where that is ≥ 0, else row ``other[k]`` of
    ``second``."""
    mine = at >= 0
    theirs = ~mine
    at_mine, at_theirs = at[mine], other[theirs]
    picks = np.where(mine, at, other).tolist()
    columns: dict[str, Any] = {}
    for name in JOB_TEXT_FIELDS:
        a, b = getattr(first, name), getattr(second, name)
        columns[name] = [a[i] if f else b[i] for f, i in zip(mine.tolist(), picks, strict=True)]
    for name in JOB_ARRAY_FIELDS:
        a, b = getattr(first, name), getattr(second, name)
        column = np.empty(len(at), dtype=a.dtype)
        column[mine] = a[at_mine]
        column[theirs] = b[at_theirs]
        columns[name] = column
    return DigestJobs(**columns)


def _replace(base: DigestJobs, at: np.ndarray, rows: DigestJobs) -> DigestJobs:
    """``base`` with row ``at[k]`` replaced by row k of ``rows``: numpy assignments, and
    ``base``'s own text columns where the new rows' text is the same (the usual case)."""
    picks = at.tolist()
    columns: dict[str, Any] = {}
    for name in JOB_TEXT_FIELDS:
        column, new = getattr(base, name), getattr(rows, name)
        if any(column[i] != v for i, v in zip(picks, new, strict=True)):
            column = list(column)
            for i, v in zip(picks, new, strict=True):
                column[i] = v
        columns[name] = column
    for name in JOB_ARRAY_FIELDS:
        column = getattr(base, name).copy()
        column[at] = getattr(rows, name)
        columns[name] = column
    return DigestJobs(**columns)


def _changed(sent: DigestJobs, at: np.ndarray, built: DigestJobs) -> np.ndarray:
    """Per row of ``built``: whether it differs from row ``at`` of ``sent`` (−1: none)."""
    new = at < 0
    if new.all():
        return new
    where = np.where(new, 0, at)  # a new row is compared with row 0: it is changed anyway
    changed = new.copy()
    picks = where.tolist()
    for name in JOB_TEXT_FIELDS:
        old, now = getattr(sent, name), getattr(built, name)
        if len(old) == len(now) and not new.any() and old == now:
            continue  # the common case: same jobs, same text, one C-level compare
        changed |= np.fromiter(
            (old[j] != v for j, v in zip(picks, now, strict=True)), dtype=bool, count=len(now)
        )
    for name in JOB_ARRAY_FIELDS:
        old_col, new_col = getattr(sent, name)[where], getattr(built, name)
        differs = old_col != new_col
        if name in _NAN_EQUAL:
            differs &= ~(np.isnan(old_col) & np.isnan(new_col))
        if name == "progress":
            idle = ~built.open_op & ~sent.open_op[where]
            close = np.abs(new_col - old_col) <= PROGRESS_TOLERANCE * np.abs(old_col)
            differs &= ~(idle & close)
        elif name == "demand":
            differs &= np.abs(new_col - old_col) > DEMAND_TOLERANCE * np.abs(old_col)
        changed |= differs
    return changed


def advance(sent: Digest | None, built: Digest) -> tuple[Digest, Digest | None]:
    """The new sent view after ``built`` (this replica's digest as just built), and the
    delta that takes a peer from ``sent`` to it; None: send the sent view in full (no
    ``sent`` of the same incarnation, or a reset every ``FULL_EVERY`` sequences).

    The sent view has ``built``'s header and, per job of ``built``, the row of ``sent``
    when it has not changed (see the module docstring), else ``built``'s. With no row
    changed, arrived or left, its ``jobs`` is ``sent.jobs`` itself.
    """
    if (
        sent is None
        or sent.incarnation != built.incarnation
        or built.sequence % FULL_EVERY == 0
        or built.sequence <= sent.sequence
    ):
        return built, None
    old, new = sent.jobs, built.jobs
    aligned = old.job_id == new.job_id
    if aligned:
        at = np.arange(len(new), dtype=np.intp)
        left: tuple[str, ...] = ()
    else:
        position = {job_id: i for i, job_id in enumerate(old.job_id)}
        at = np.fromiter((position.get(j, -1) for j in new.job_id), dtype=np.intp, count=len(new))
        present = set(new.job_id)
        left = tuple(j for j in old.job_id if j not in present)
    changed = _changed(old, at, new)
    rows = np.flatnonzero(changed)
    delta_rows = _gather(new, rows, new, rows)  # the changed rows of ``built``
    if not rows.size and not left:
        view = old
    elif rows.size == len(new):
        view = new
    elif aligned:
        view = _replace(old, rows, delta_rows)
    else:
        view = _gather(old, np.where(changed, -1, at), new, np.arange(len(new)))
    sent_view = dataclasses.replace(built, jobs=view)
    delta = dataclasses.replace(
        built,
        jobs=delta_rows,
        base_sequence=sent.sequence,
        left=left,
        catalog=changed_since(sent.catalog, built.catalog),
    )
    return sent_view, delta


def apply(base: Digest, delta: Digest) -> Digest:
    """The full digest ``delta`` makes of ``base`` (both validated, ``delta`` a delta on
    ``base``'s sequence): ``delta``'s header, ``base``'s jobs without those in
    ``delta.left``, with ``delta``'s jobs in place of or beside them, in job id order.

    Raises :class:`DigestError` for a delta that cannot apply: a job that left that
    ``base`` does not hold, a job both among the delta's jobs and those that left, a
    send instant before ``base``'s, or a result of more than ``MAX_JOBS`` jobs.
    """
    if delta.sent_at < base.sent_at:
        raise DigestError("sent_at", f"{delta.sent_at!r} is before its base's {base.sent_at!r}")
    old, rows = base.jobs, delta.jobs
    full = dataclasses.replace(
        delta, base_sequence=0, left=(), catalog=merged(base.catalog, delta.catalog)
    )
    if not rows.job_id and not delta.left:
        return dataclasses.replace(full, jobs=old)
    position = {job_id: i for i, job_id in enumerate(old.job_id)}
    changed = set(rows.job_id)
    for i, job_id in enumerate(delta.left):
        if job_id not in position:
            raise DigestError(f"left[{i}]", f"job {job_id!r} is not in the base digest")
        if job_id in changed:
            raise DigestError(f"left[{i}]", f"job {job_id!r} is also among the delta's jobs")
    gone = set(delta.left)
    if not gone and changed <= position.keys():  # rows replaced in place: the base's order
        at = np.fromiter(map(position.__getitem__, rows.job_id), dtype=np.intp, count=len(rows))
        return dataclasses.replace(full, jobs=_replace(old, at, rows))
    ids = sorted((position.keys() - gone) | changed)  # digests list jobs in id order
    if len(ids) > MAX_JOBS:
        raise DigestError("jobs", f"{len(ids)} jobs after the delta, more than {MAX_JOBS}")
    in_delta = {job_id: i for i, job_id in enumerate(rows.job_id)}
    count = len(ids)
    from_delta = np.fromiter((in_delta.get(j, -1) for j in ids), dtype=np.intp, count=count)
    from_base = np.fromiter((position.get(j, -1) for j in ids), dtype=np.intp, count=count)
    return dataclasses.replace(full, jobs=_gather(rows, from_delta, old, from_base))
