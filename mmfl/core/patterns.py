"""Accuracy by missingness pattern: which of the evaluated set's modalities a test row lacks.

A test set (or a client's personal test rows) whose samples may lack modalities carries bool
``present/<m>`` masks (:data:`mmfl.data.base.PRESENT`). :func:`evaluate_model
<mmfl.core.training.evaluate_model>` then adds, per pattern, the accuracy of the joint output
and the row count:

- ``pattern/complete/accuracy``, ``pattern/complete/n``: rows holding every modality;
- ``pattern/no_<m>/accuracy``, ``pattern/no_<m>/n``: rows lacking ``m`` alone;
- ``pattern/no_<m1>+<m2>/...``: rows lacking several (names sorted, joined by ``+``).

A pattern no row follows is not reported. Without masks nothing is added. The personalized
evaluation pools the devices' counts (:func:`pool_patterns`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmfl.data.base import PRESENT

PATTERN = "pattern/"


def pattern_name(missing) -> str:
    """``"complete"`` for no missing modality, else ``"no_" + "+".join(sorted(missing))``."""
    missing = sorted(missing)
    return "complete" if not missing else "no_" + "+".join(missing)


def pattern_order(name: str) -> tuple:
    """Sort key of pattern names: ``complete`` first, then by how many modalities are missing."""
    return (name != "complete", name.count("+"), name)


def masked_modalities(inputs: dict[str, Tensor]) -> list[str]:
    """The modalities of a batch that carry a ``present/<m>`` mask (sorted)."""
    return sorted(k[len(PRESENT):] for k in inputs if k.startswith(PRESENT) and k[len(PRESENT):] in inputs)


class PatternCounter:
    """Counts hits and rows per missingness pattern over batches (:meth:`add`), then
    :meth:`metrics`. ``modalities``: the evaluated set's modalities (a row's pattern names
    the ones it lacks)."""

    def __init__(self, modalities):
        self.modalities = sorted(modalities)
        self.hits: dict[str, int] = {}
        self.rows: dict[str, int] = {}
        self.masked = False

    def add(self, inputs: dict[str, Tensor], hit: Tensor) -> None:
        """``hit``: bool ``[B]``, the joint prediction was right."""
        masks = {m: inputs[PRESENT + m].reshape(-1).to(device=hit.device, dtype=torch.bool)
                 for m in self.modalities if PRESENT + m in inputs}
        if not masks:
            self._count("complete", hit)
            return
        self.masked = True
        code = torch.zeros(hit.shape[0], dtype=torch.long, device=hit.device)
        for i, m in enumerate(self.modalities):
            if m in masks:
                code = code + (~masks[m]).long() * (1 << i)
        for c in code.unique().tolist():
            name = pattern_name(m for i, m in enumerate(self.modalities) if c >> i & 1)
            self._count(name, hit[code == c])

    def _count(self, name: str, hit: Tensor) -> None:
        self.hits[name] = self.hits.get(name, 0) + int(hit.sum())
        self.rows[name] = self.rows.get(name, 0) + int(hit.numel())

    def metrics(self) -> dict[str, float]:
        """``pattern/<name>/accuracy`` and ``pattern/<name>/n``; empty when no batch had a mask."""
        if not self.masked:
            return {}
        out: dict[str, float] = {}
        for name in sorted(self.rows, key=pattern_order):
            n = self.rows[name]
            if n:
                out[f"{PATTERN}{name}/accuracy"] = self.hits[name] / n
                out[f"{PATTERN}{name}/n"] = n
        return out


def pattern_keys(row: dict) -> dict:
    """The ``pattern/*`` entries of a metrics row."""
    return {k: v for k, v in row.items() if k.startswith(PATTERN)}


def pool_patterns(per_device: list[dict]) -> dict[str, float]:
    """The devices' ``pattern/<name>/accuracy`` pooled over their rows (``pattern/<name>/n`` summed)."""
    hits: dict[str, float] = {}
    rows: dict[str, float] = {}
    for d in per_device:
        for k, n in d.items():
            if k.startswith(PATTERN) and k.endswith("/n"):
                name = k[len(PATTERN):-len("/n")]
                rows[name] = rows.get(name, 0.0) + float(n)
                hits[name] = hits.get(name, 0.0) + float(d[f"{PATTERN}{name}/accuracy"]) * float(n)
    out: dict[str, float] = {}
    for name in sorted(rows, key=pattern_order):
        if rows[name] > 0:
            out[f"{PATTERN}{name}/accuracy"] = hits[name] / rows[name]
            out[f"{PATTERN}{name}/n"] = int(round(rows[name]))
    return out
