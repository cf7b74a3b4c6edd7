"""Fixture ``xi_history.json`` files (what benchmarks/wireless/xi_history.py writes after a run) for the
wireless grid's Fig. 3 runs in a fixture run set: K = 9 devices (3 image, 3 audio, 3 both), 3 classes
each, Xi's row softmax per group after every round, numbers from the run's name."""

from __future__ import annotations

import json
import zlib

import numpy as np

HOLDS = [["image"], ["audio"], ["image", "audio"]] * 3
CLASSES = [[0, 1, 2], [1, 2, 3], [0, 1, 4], [5, 6, 7], [2, 6, 8], [0, 5, 9], [3, 4, 9], [7, 8, 9], [1, 5, 8]]


def write_xi_histories(grid) -> int:
    """An xi_history.json in every finished run folder of ``grid`` that keeps its checkpoints."""
    n = 0
    for run in grid.runs():
        d = grid.raw_dir / run.name
        if run.raw.get("keep_checkpoints", 1) <= 1 or not (d / "summary.json").exists():
            continue
        rng = np.random.default_rng(zlib.crc32(run.name.encode()))
        rounds = int(run.raw.get("rounds", 20))
        xi = {}
        for g in ("image", "audio", "shared"):
            logits = np.cumsum(rng.normal(0, 0.3, (rounds, 9, 9)), axis=0)
            e = np.exp(logits - logits.max(axis=2, keepdims=True))
            xi[g] = np.round(e / e.sum(axis=2, keepdims=True), 6).tolist()
        (d / "xi_history.json").write_text(json.dumps({
            "rounds": list(range(1, rounds + 1)), "xi_tilde": xi, "num_clients": 9, "holds": HOLDS,
            "classes": CLASSES, "eta_hat": 0.01}))
        n += 1
    return n
