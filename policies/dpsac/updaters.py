"""Keeping the clusters current as applications join and exit ([DPSAC] §4.5).

Three updaters with one interface, so the simulator and the live policy drive any of them
the same way:

- ``on_batch(items)``: a batch of ``(app_id, length)`` arrives: the Aggregator's rule
  (``merge.add_batch``; the first batch is clustered by Algorithm 1), then the updater's
  baseline is reset (ST's centroids, DT's histogram, OK's centres);
- ``on_join(app_id, length) -> k``: one application arrives; returns the index of its cluster;
- ``on_exit(app_id)``: one application leaves; it is deleted from its cluster directly;
- ``clusters``: the app ids of each cluster; ``centroids``; ``cluster_of(app_id)``;
- ``changed``: True once clusters changed in a way other than the single join or exit just
  reported (a batch, a split, a cluster emptied and dropped, a centre replaced): cluster
  indices may have moved, so the caller repartitions and rebuilds its per-cluster state,
  then sets ``changed = False``.

``ST`` (§4.5.1, simple thresholding), ``DT`` (§4.5.1, distribution-based thresholding) and
``OK`` (§4.5.2, online K-means, Algorithm 4 after Liberty et al.). Every reading of a gap is
in docs/dpsac.md, "Readings".
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

from burstctl.policies.dpsac.merge import Item, add_batch, centroid, closest

# [DPSAC] §4.5.1: both thresholds are 0.1 ("adjustable")
ST_THRESHOLD = 0.1
DT_THRESHOLD = 0.1


def split_at_largest_gap(members: Sequence[Item]) -> tuple[list[Item], list[Item]] | None:
    """``members`` sorted by length and cut at the largest gap between consecutive lengths
    (the first such gap on ties); None when every length is equal (nothing to split)."""
    ordered = sorted(members, key=lambda item: item[1])
    best, best_gap = -1, 0.0
    for i in range(1, len(ordered)):
        gap = ordered[i][1] - ordered[i - 1][1]
        if gap > best_gap:
            best, best_gap = i, gap
    if best < 0:
        return None
    return ordered[:best], ordered[best:]


class Updater:
    """The clusters and the join/exit/batch interface common to ST, DT and OK."""

    name = "base"

    def __init__(self, k_max: int = 5) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max = k_max
        self._clusters: list[list[Item]] = []
        self._where: dict[str, int] = {}
        self.changed = False

    # -- reading ----------------------------------------------------------------------
    @property
    def clusters(self) -> list[list[str]]:
        """The app ids of each cluster (indices as ``on_join`` reports them)."""
        return [[a for a, _ in c] for c in self._clusters]

    @property
    def centroids(self) -> list[float]:
        """Each cluster's mean length (NaN for an empty cluster: only OK keeps those)."""
        return [centroid(c) for c in self._clusters]

    def cluster_of(self, app_id: str) -> int:
        """The index of ``app_id``'s cluster (KeyError if it is not clustered)."""
        return self._where[app_id]

    def __contains__(self, app_id: object) -> bool:
        return app_id in self._where

    def __len__(self) -> int:
        return len(self._where)

    # -- changing ---------------------------------------------------------------------
    def _reindex(self) -> None:
        self._where = {a: k for k, c in enumerate(self._clusters) for a, _ in c}

    def on_batch(self, items: Iterable[Item]) -> None:
        """A batch arrives ([DPSAC] §4.1): inserted or clustered and merged, then the
        updater's baseline is taken afresh. Ids already clustered are ignored."""
        fresh = [(a, float(length)) for a, length in items if a not in self._where]
        self._check(fresh)
        self._clusters = add_batch(self._clusters, fresh, self.k_max)
        self._reindex()
        self._baseline()
        self.changed = True

    def on_join(self, app_id: str, length: float) -> int:
        """One application arrives; returns its cluster's index (the first one clusters)."""
        if app_id in self._where:
            raise ValueError(f"{app_id!r} is already clustered")
        self._check([(app_id, length)])
        if not any(self._clusters):
            self.on_batch([(app_id, length)])
            return self._where[app_id]
        return self._join(app_id, float(length))

    def on_exit(self, app_id: str) -> None:
        """One application leaves: deleted from its cluster ([DPSAC] §4.5: "pessimistically",
        no parameter is recomputed). An emptied cluster is dropped (``changed``), except by
        OK, whose number of centres is fixed."""
        k = self._where.pop(app_id, None)
        if k is None:
            return
        self._clusters[k] = [item for item in self._clusters[k] if item[0] != app_id]
        self._exited(k)

    @staticmethod
    def _check(items: Sequence[Item]) -> None:
        for app_id, length in items:
            if not (math.isfinite(length) and length >= 0.0):
                raise ValueError(f"the length of {app_id!r} must be finite and >= 0: {length!r}")

    def _closest(self, length: float) -> int:
        cs = [c if not math.isnan(c) else math.inf for c in self.centroids]
        return closest(cs, length)

    def _join(self, app_id: str, length: float) -> int:
        k = self._closest(length)
        self._clusters[k].append((app_id, length))
        self._where[app_id] = k
        return k

    def _exited(self, k: int) -> None:
        if not self._clusters[k]:
            del self._clusters[k]
            self._reindex()
            self._forget(k)
            self.changed = True

    def _split(self, k: int) -> bool:
        """Cuts cluster k at its largest gap into clusters k and k + 1; False if it cannot."""
        halves = split_at_largest_gap(self._clusters[k])
        if halves is None:
            return False
        self._clusters[k : k + 1] = [halves[0], halves[1]]
        self._reindex()
        self.changed = True
        return True

    def _baseline(self) -> None:
        """Takes the updater's reference state from the current clusters."""

    def _forget(self, k: int) -> None:
        """Cluster k was dropped."""


class ST(Updater):
    """Simple thresholding ([DPSAC] §4.5.1).

    Each cluster keeps c (its centroid at the last clustering) and ĉ (a cumulative centroid
    over the joins since). A join goes to the closest cluster, ĉ ← (ĉ·|C| + l)/(|C| + 1) with
    |C| the size before the join, and if |ĉ − c| / (max C − min C) ≥ ``threshold`` and
    |C| > K_C the cluster is split at its largest gap, both halves taking their centroid as
    new c and ĉ. A cluster whose lengths are all equal (max = min) never splits."""

    name = "st"

    def __init__(self, k_max: int = 5, threshold: float = ST_THRESHOLD) -> None:
        super().__init__(k_max)
        self.threshold = threshold
        self._c: list[float] = []
        self._c_hat: list[float] = []

    def _baseline(self) -> None:
        self._c = self.centroids
        self._c_hat = list(self._c)

    def _forget(self, k: int) -> None:
        del self._c[k]
        del self._c_hat[k]

    def drift(self, k: int) -> float:
        """|ĉ_k − c_k| / (max C_k − min C_k), 0 when the cluster has no spread."""
        lengths = [length for _, length in self._clusters[k]]
        spread = max(lengths) - min(lengths) if lengths else 0.0
        return abs(self._c_hat[k] - self._c[k]) / spread if spread > 0.0 else 0.0

    def _join(self, app_id: str, length: float) -> int:
        k = self._closest(length)
        size = len(self._clusters[k])
        self._c_hat[k] = (self._c_hat[k] * size + length) / (size + 1)
        super()._join(app_id, length)
        if size > self.k_max and self.drift(k) >= self.threshold and self._split(k):
            mid = [centroid(self._clusters[k]), centroid(self._clusters[k + 1])]
            self._c[k : k + 1] = mid
            self._c_hat[k : k + 1] = list(mid)
            return self._where[app_id]
        return k


class DT(Updater):
    """Distribution-based thresholding ([DPSAC] §4.5.1).

    After a batch, p is the histogram of the lengths (bins of width (max − min)/⌈√n⌉ from
    the batch's minimum; 10 % of the value, or 1, when every length is equal), counts
    normalised to probabilities. Each join goes to the closest cluster and each join or exit
    updates q, the same histogram of the current lengths. After K_C changes (joins and
    exits; the counter then restarts) the Jensen–Shannon divergence D_JS(p‖q) (natural log,
    0·ln 0 = 0) is computed; if it is ≥ ``threshold`` the cluster C_o with the largest
    |p(c_i) − q(c_i)| / p(c_i) (p(c_i): the bin of c_i; +∞ where p(c_i) = 0 < q(c_i), 0
    where both are 0) is split at its largest gap and p ← q."""

    name = "dt"

    def __init__(self, k_max: int = 5, threshold: float = DT_THRESHOLD) -> None:
        super().__init__(k_max)
        self.threshold = threshold
        self.origin = 0.0
        self.width = 1.0
        self._p: dict[int, float] = {}
        self._counts: dict[int, int] = {}
        self.changes = 0
        self.checks = 0  # divergence computations, for the cost the paper reports

    def _bin(self, length: float) -> int:
        return math.floor((length - self.origin) / self.width)

    def _baseline(self) -> None:
        lengths = [length for c in self._clusters for _, length in c]
        if not lengths:
            self._counts, self._p, self.changes = {}, {}, 0
            return
        lo, hi = min(lengths), max(lengths)
        self.origin = lo
        if hi > lo:
            self.width = (hi - lo) / math.ceil(math.sqrt(len(lengths)))
        else:
            self.width = abs(lo) * 0.1 if lo != 0.0 else 1.0
        self._counts = {}
        for length in lengths:
            b = self._bin(length)
            self._counts[b] = self._counts.get(b, 0) + 1
        self._p = self._q()
        self.changes = 0

    def _q(self) -> dict[int, float]:
        total = sum(self._counts.values())
        return {b: n / total for b, n in self._counts.items() if n > 0} if total else {}

    def _count(self, length: float, delta: int) -> None:
        b = self._bin(length)
        self._counts[b] = self._counts.get(b, 0) + delta
        self.changes += 1

    def divergence(self) -> float:
        """D_JS(p‖q) between the baseline p and the current histogram q, in nats."""
        return js_divergence(self._p, self._q())

    def _join(self, app_id: str, length: float) -> int:
        k = super()._join(app_id, length)
        self._count(length, +1)
        self._maybe_split()
        return self._where.get(app_id, k)

    def on_exit(self, app_id: str) -> None:
        k = self._where.get(app_id)
        if k is not None:
            length = next(x for a, x in self._clusters[k] if a == app_id)
            super().on_exit(app_id)
            self._count(length, -1)
            self._maybe_split()

    def _maybe_split(self) -> None:
        if self.changes < self.k_max or not self._clusters:
            return
        self.changes = 0
        self.checks += 1
        q = self._q()
        if js_divergence(self._p, q) < self.threshold:
            return
        best, best_score = -1, -1.0
        for k, c in enumerate(self.centroids):
            if math.isnan(c):
                continue
            pc, qc = self._p.get(self._bin(c), 0.0), q.get(self._bin(c), 0.0)
            score = abs(pc - qc) / pc if pc > 0.0 else (math.inf if qc > 0.0 else 0.0)
            if score > best_score:
                best, best_score = k, score
        if best >= 0:
            self._split(best)
        self._p = q


def js_divergence(p: dict[int, float], q: dict[int, float]) -> float:
    """D_JS(p‖q) = ½ D_KL(p‖m) + ½ D_KL(q‖m), m = (p + q)/2, natural log, 0·ln 0 = 0; two
    empty histograms are 0 apart."""
    total = 0.0
    for b in p.keys() | q.keys():
        pb, qb = p.get(b, 0.0), q.get(b, 0.0)
        m = 0.5 * (pb + qb)
        if pb > 0.0:
            total += 0.5 * pb * math.log(pb / m)
        if qb > 0.0:
            total += 0.5 * qb * math.log(qb / m)
    return max(0.0, total)


class OK(Updater):
    """Online K-means ([DPSAC] §4.5.2, Algorithm 4 after Liberty et al.), the paper's variant
    that keeps the number of centres fixed.

    The centres start as the batch's centroids; w* = min_{c≠c'} (c − c')²/2 (when that is 0,
    one centre or two equal: w* = the batch's mean squared deviation, or 1 if that is 0 too),
    r = 1, q = 0, f = w*/k, n = the batch's size. A join: n += 1, and with probability
    min(D²(l, C)/f, 1) (one ``rng.random()`` per join) l becomes a centre in place of the
    closest one (whose applications go to their closest centre among the new ones:
    ``changed``), q += 1, and if q ≥ 3k(1 + ln n) then r += 1, q = 0, f doubles; the
    application joins its closest centre. An exit deletes the application; its centre stays
    (empty clusters are kept, so cluster indices are the centres')."""

    name = "ok"

    def __init__(self, k_max: int = 5, rng: random.Random | None = None) -> None:
        super().__init__(k_max)
        self.rng = rng if rng is not None else random.Random(0)
        self.centres: list[float] = []
        self.f = 1.0
        self.q = 0
        self.r = 1
        self.n = 0
        self.replacements = 0

    def _baseline(self) -> None:
        self.centres = [c for c in self.centroids if not math.isnan(c)]
        self._clusters = [c for c in self._clusters if c]
        self._reindex()
        k = len(self.centres)
        gaps = [
            (a - b) ** 2 / 2.0 for i, a in enumerate(self.centres) for b in self.centres[i + 1 :]
        ]
        w = min(gaps) if gaps else 0.0
        if w <= 0.0 and self._where:
            lengths = [x for c in self._clusters for _, x in c]
            mean = math.fsum(lengths) / len(lengths)
            w = math.fsum((x - mean) ** 2 for x in lengths) / len(lengths) or 1.0
        self.f = (w if w > 0.0 else 1.0) / max(k, 1)
        self.q = 0
        self.r = 1
        self.n = len(self._where)

    def _closest(self, length: float) -> int:
        return closest(self.centres, length)

    def _join(self, app_id: str, length: float) -> int:
        self.n += 1
        k = self._closest(length)
        distance2 = (length - self.centres[k]) ** 2
        if self.rng.random() < min(distance2 / self.f, 1.0):
            self.centres[k] = length  # replaces the closest centre: the count stays fixed
            self.replacements += 1
            moved = self._clusters[k]
            self._clusters[k] = []
            for item in moved:
                self._clusters[self._closest(item[1])].append(item)
            self._reindex()
            self.changed = True
            self.q += 1
            kk = len(self.centres)
            if self.q >= 3 * kk * (1.0 + math.log(self.n)):
                self.r += 1
                self.q = 0
                self.f *= 2.0
        return super()._join(app_id, length)

    def _exited(self, k: int) -> None:
        pass  # the centre stays


def make_updater(name: str, k_max: int = 5, rng: random.Random | None = None) -> Updater:
    """The updater called ``name``: ``"st"``, ``"dt"`` or ``"ok"`` (``rng`` for OK's draws)."""
    if name == "st":
        return ST(k_max)
    if name == "dt":
        return DT(k_max)
    if name == "ok":
        return OK(k_max, rng)
    raise ValueError(f"unknown updater {name!r}; known: st, dt, ok")
