"""The partitioner ([DPSAC] §4.3): each cluster's expected load EIO_k = Σ_{i∈k} P_i·B_i, its
share U_k = EIO_k / TEIO, its burst-buffer quota U_k·S and its PFS share U_k·B.

The paper assumes TEIO < B and splits both resources statically. Readings (docs/dpsac.md):
TEIO = 0 (no application expects to do I/O) splits S and B equally between the clusters;
TEIO ≥ B keeps the proportional split (the shares still sum to S and B): the "delay
mechanism" the paper leaves open is Algorithm 3 itself, which serves each cluster at most
its share and defers the rest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from burstctl.policies.dpsac.model import App


@dataclass(frozen=True, slots=True)
class Part:
    """One cluster's partition: ``eio`` EIO_k, ``share`` U_k, ``quota`` U_k·S (buffer
    space) and ``pfs`` U_k·B (drain bandwidth, volume per time unit)."""

    eio: float
    share: float
    quota: float
    pfs: float


def teio(clusters: Sequence[Sequence[str]], apps: Mapping[str, App]) -> float:
    """TEIO = Σ_k EIO_k."""
    return math.fsum(apps[a].expected_load for members in clusters for a in members)


def partition(
    clusters: Sequence[Sequence[str]], apps: Mapping[str, App], S: float, B: float
) -> list[Part]:
    """One ``Part`` per cluster (a cluster is a sequence of app ids of ``apps``)."""
    if S < 0.0 or B < 0.0:
        raise ValueError(f"S and B must be >= 0, got S={S!r}, B={B!r}")
    if not clusters:
        return []
    eios = [math.fsum(apps[a].expected_load for a in members) for members in clusters]
    total = math.fsum(eios)
    even = 1.0 / len(clusters)
    shares = [e / total for e in eios] if total > 0.0 else [even] * len(clusters)
    return [Part(e, u, u * S, u * B) for e, u in zip(eios, shares, strict=True)]
