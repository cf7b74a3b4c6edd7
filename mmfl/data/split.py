"""Seeded stratified train/test splits shared by the loaders."""

from __future__ import annotations

import numpy as np

from mmfl.errors import ConfigError


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded stratified split of ``range(len(labels))`` -> (train idx, test idx), both sorted.

    Each class puts ``round(n_c * test_fraction)`` rows into test, at least one
    and at most ``n_c - 1`` when it has two or more rows (singletons stay in train).
    """
    rng = np.random.default_rng(seed)
    test = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        k = min(max(int(round(len(idx) * test_fraction)), 1), len(idx) - 1) if len(idx) >= 2 else 0
        test.append(rng.permutation(idx)[:k])
    test_idx = np.sort(np.concatenate(test)) if test else np.zeros(0, dtype=np.int64)
    mask = np.ones(len(labels), dtype=bool)
    mask[test_idx] = False
    return np.flatnonzero(mask), test_idx.astype(np.int64)


def check_fraction(value: float, key: str = "test_fraction") -> None:
    if not 0.0 < value < 1.0:
        raise ConfigError(f"data.{key}: must be in (0, 1), got {value}")
