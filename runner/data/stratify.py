"""Splitting multi-label data: iterative stratification (Sechidis, Tsoumakas and Vlahavas 2011,
"On the Stratification of Multi-Label Data", Algorithm 1, first order).

A per-class split cannot hold out "a fraction of every class" when a sample carries several
classes. Iterative stratification keeps, for every class, the share of its positives in each
part close to that part's share of the samples, the rarest classes first:

1. Each part ``j`` (here: the held-out part with share ``r``, the rest with ``1 - r``) wants
   ``r_j N`` samples and ``r_j n_c`` positives of every class ``c``.
2. While a sample with a positive label is unassigned: take the class with the fewest
   unassigned positives (ties: the lowest class index), and give each of its unassigned samples,
   in a seeded random order, to the part that wants most positives of that class (ties: the part
   that wants most samples; then a seeded coin). The part's wants go down by one for every
   class the sample carries, and by one sample.
3. Samples without a positive label go, one by one in a seeded random order, to the part that
   wants most samples (the paper's rule; ties broken by a seeded coin).

Differences from scikit-multilearn's ``IterativeStratification`` (``iterative_train_test_split``
uses ``order=2``, label pairs): there the next label is not the rarest (at order 1 it keeps the
first label met while scanning the rows), unlabelled samples go to a random part that still
wants samples, and ties reseed NumPy's global generator. Here the order is the paper's and
every draw comes from one ``RandomState(seed)``, so a seed fixes the split.
"""

from __future__ import annotations

import numpy as np


def iterative_split(
    labels: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (sorted) of the rest and of the held-out part of the (N, C) 0/1 ``labels``, the
    held-out part taking about ``fraction`` of the samples and of every class's positives.

    No bound holds for every matrix (a sample's classes move together), but the rarest class is
    split first and exactly: its held-out positives are ``floor`` or ``ceil`` of ``fraction *
    n_c``. Deterministic for a ``seed``; ``0 < fraction < 1`` (checked by the caller)."""
    matrix = np.asarray(labels, dtype=bool)
    n, num_classes = matrix.shape
    shares = np.array([fraction, 1.0 - fraction])
    want_samples = shares * n
    want_labels = shares[:, None] * matrix.sum(0)[None, :].astype(np.float64)
    part = np.full(n, -1, dtype=np.int64)
    rng = np.random.RandomState(seed)
    unassigned_positives = matrix.sum(0).astype(np.int64)
    while unassigned_positives.any():
        counts = np.where(unassigned_positives > 0, unassigned_positives, np.iinfo(np.int64).max)
        label = int(np.argmin(counts))
        rows = np.flatnonzero(matrix[:, label] & (part < 0))
        for row in rows[rng.permutation(rows.size)]:
            m = _most_wanted(want_labels[:, label], want_samples, rng)
            part[row] = m
            carried = matrix[row]
            want_labels[m, carried] -= 1
            want_samples[m] -= 1
            unassigned_positives[carried] -= 1
    rest = np.flatnonzero(part < 0)
    for row in rest[rng.permutation(rest.size)]:
        m = _most_wanted(want_samples, want_samples, rng)
        part[row] = m
        want_samples[m] -= 1
    return np.flatnonzero(part == 1), np.flatnonzero(part == 0)


def _most_wanted(primary: np.ndarray, secondary: np.ndarray, rng: np.random.RandomState) -> int:
    """The part with the largest ``primary`` want; ties go to the largest ``secondary``, then
    to a seeded coin."""
    best = np.flatnonzero(primary == primary.max())
    if best.size > 1:
        best = best[secondary[best] == secondary[best].max()]
    return int(best[0] if best.size == 1 else rng.choice(best))
