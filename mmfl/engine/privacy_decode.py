"""Can the client's labels be read back from an array? The privacy check's decoding test.

:mod:`mmfl.engine.privacy` refuses the labels in any exact encoding. A near-copy (a share
of the labels changed, small noise added, an affine map, class ids renamed, a one-hot with
extra columns) is not an encoding of the labels, but a server reads the labels from it all
the same. This module tries the decoders a curious server would try first, each with at
most ``C + 3`` fitted numbers, on every per-row reading of an array (an axis of exactly
``n`` values, the client's row count):

- ``v`` ``[n]`` (one value per row): rounding ``round(v)``; the least-squares affine map
  ``round(a v + b)``; the majority class of each distinct rounded value (class ids renamed),
  used only while there are at most ``2 C`` distinct values, so a continuous vector cannot
  fit the labels value by value;
- ``M`` ``[n, D]`` or ``[D, n]`` with ``2 <= D <= C + 2`` (one-hot or scores with a few
  columns added or removed): the argmax over the ``D`` axis, its columns named by majority;
  and the least-squares linear map from ``[M, 1]`` to the one-hot labels, then argmax.

A reading **decodes the labels** when its **balanced accuracy** (the mean over the client's
classes of the share of that class's rows decoded right) is at least ``DECODE_THRESHOLD``
(0.9); with ``K`` classes chance is ``1/K``, a constant decodes at ``1/K`` however skewed
the labels are. Clients with fewer than ``MIN_DECODE_ROWS`` rows or a single class are not
tested (too few rows to tell a fit from a leak). Not covered (docs/security.md): labels out
of order (a permutation of the rows), nonlinear or learned maps (a model's logits on the
client's own rows with more than ``C + 2`` columns, embeddings), fewer than
``DECODE_THRESHOLD`` of the labels kept.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch import Tensor

DECODE_THRESHOLD = 0.9  # balanced accuracy at or above which a reading decodes the labels
MIN_DECODE_ROWS = 8  # clients with fewer rows are not decoding-tested
EXTRA_COLUMNS = 2  # a [n, D] reading with D up to C + EXTRA_COLUMNS is decoded over its columns


def balanced_accuracy(pred: np.ndarray, y: np.ndarray) -> float:
    """Mean over the classes present in ``y`` of the share of their rows with ``pred == y``."""
    classes = np.unique(y)
    return float(np.mean([(pred[y == c] == c).mean() for c in classes]))


def _majority(groups: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each row's prediction: the most frequent label among the rows of its group."""
    _, g = np.unique(groups, return_inverse=True)
    table = np.zeros((int(g.max()) + 1, int(y.max()) + 1), dtype=np.int64)
    np.add.at(table, (g, y), 1)
    return table.argmax(1)[g]


def _row_readings(t: Tensor, n: int, num_classes: int) -> Iterator[tuple[str, np.ndarray]]:
    """``(how, array)``: ``[n]`` vectors and ``[n, D]`` matrices (``2 <= D <= C + 2``) that ``t`` holds
    one row per client sample: the array itself or flattened, either axis of a matrix."""
    if t.is_complex() or t.dtype == torch.bool or t.numel() < n:
        return
    a = t.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(a).all()):
        return
    if a.numel() == n:
        yield "", a.reshape(n).numpy()
    dmax = num_classes + EXTRA_COLUMNS
    if a.dim() == 2 and a.shape[0] != a.shape[1]:
        for ax, lay in ((1, ""), (0, "columns first, ")):
            if a.shape[1 - ax] == n and 2 <= a.shape[ax] <= dmax:
                yield lay, a.movedim(1 - ax, 0).numpy()
    elif a.numel() % n == 0 and 2 <= a.numel() // n <= dmax and a.dim() != 2:
        yield "flattened, ", a.reshape(n, -1).numpy()


def _decode_vector(v: np.ndarray, y: np.ndarray, num_classes: int) -> Iterator[tuple[str, float]]:
    yield "rounded", balanced_accuracy(np.rint(v), y)
    if np.ptp(v) > 0:
        a, b = np.polyfit(v, y.astype(np.float64), 1)
        yield "least-squares affine map, rounded", balanced_accuracy(np.rint(a * v + b), y)
    r = np.rint(v)
    if len(np.unique(r)) <= 2 * num_classes:
        yield "rounded, classes renamed by majority", balanced_accuracy(_majority(r, y), y)


def _decode_matrix(m: np.ndarray, y: np.ndarray, num_classes: int) -> Iterator[tuple[str, float]]:
    yield "argmax over its columns, renamed by majority", balanced_accuracy(_majority(m.argmax(1), y), y)
    x = np.concatenate([m, np.ones((len(m), 1))], 1)
    onehot = np.eye(int(y.max()) + 1)[y]
    w, *_ = np.linalg.lstsq(x, onehot, rcond=None)
    yield "least-squares linear map to one-hot, argmax", balanced_accuracy((x @ w).argmax(1), y)


def decode_labels(t: Tensor, y: Tensor, num_classes: int) -> str | None:
    """How the labels ``y`` ``[n]`` (int64) are read back from ``t`` at balanced accuracy >=
    :data:`DECODE_THRESHOLD` (one phrase), or None."""
    yn = y.detach().cpu().numpy().astype(np.int64)
    n = len(yn)
    if n < MIN_DECODE_ROWS or len(np.unique(yn)) < 2:
        return None
    for lay, r in _row_readings(t, n, num_classes):
        decoders = _decode_vector(r, yn, num_classes) if r.ndim == 1 else _decode_matrix(r, yn, num_classes)
        for how, acc in decoders:
            if acc >= DECODE_THRESHOLD:
                return (f"decoded: {lay}{how}, balanced accuracy {acc:.3f} >= {DECODE_THRESHOLD} "
                        f"over {len(np.unique(yn))} classes")
    return None
