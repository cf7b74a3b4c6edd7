"""Personalized evaluation: every device's own model on a test set that looks like its data.

Personalized methods (``pfedwireless``, FedFomo, FedAMP, ...) keep one model per device, and
what they promise is each device's performance on *its own* distribution. The shared test
set has every class in the data set's proportions, so each device gets a seeded subset of
it whose label distribution follows the device's training labels
(:func:`device_test_indices`), and :func:`evaluate_personalized` scores each device's model
on its subset, with only the modalities that device holds, and averages over devices.

How a device's subset is drawn (:func:`device_test_indices`):

1. p_c = the share of class c in the device's training labels. Classes with **no test row
   at all** are dropped and p renormalized over the rest (a device whose every class lacks
   test rows gets an empty set; a device with no training rows gets the uniform
   distribution over the classes the test set has).
2. The size is ``size`` (default ``min(len(test), max(50, n_k))``, n_k the device's number
   of training rows), then **shrunk so that every class fits**: a class with too few test
   rows for its share caps the size at ``floor(available_c / p_c)``. The proportions are
   kept; the set gets smaller instead (the alternative, topping up with other classes,
   would bias the distribution towards the classes the test set has plenty of).
3. Per-class counts are ``size * p_c`` rounded by largest remainder (they sum to the size;
   ties go to the lower class id), and each class's rows are drawn without replacement.

Draws are seeded per device (``numpy`` generator from ``(seed, cid)``), so a device's rows do
not depend on the other devices, and two devices may share test rows (the subsets are drawn
independently from one shared set: they are *not* disjoint).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn

from mmfl.data.base import PRESENT, ArrayDataset
from mmfl.core.patterns import pattern_keys, pool_patterns
from mmfl.core.training import class_recall, evaluate_model

_TAG = 0x9E57  # a fixed word in the seed sequence, so these draws differ from other uses of (seed, cid)
_CACHE_ATTR = "_personal_test_indices"


def _rng(seed: int, cid: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed) % (1 << 63), int(cid), _TAG]))


def class_targets(p: np.ndarray, size: int) -> np.ndarray:
    """``size * p`` rounded to integers that sum to ``size`` (largest remainder; ties: lower class)."""
    raw = p * size
    base = np.floor(raw).astype(np.int64)
    left = int(size - base.sum())
    if left > 0:
        frac = raw - base
        order = sorted(range(len(p)), key=lambda c: (-frac[c], c))
        for c in order[:left]:
            base[c] += 1
    return base


def one_device_indices(test_labels: np.ndarray, train_labels: np.ndarray, num_classes: int,
                       rng: np.random.Generator, size: int | None = None) -> np.ndarray:
    """Sorted test-row positions for one device (steps 1-3 of the module doc)."""
    test_labels = np.asarray(test_labels, dtype=np.int64)
    train_labels = np.asarray(train_labels, dtype=np.int64)
    avail = np.bincount(test_labels, minlength=num_classes)[:num_classes]
    counts = np.bincount(train_labels, minlength=num_classes)[:num_classes].astype(np.float64)
    if counts.sum() == 0:
        counts = (avail > 0).astype(np.float64)  # no training rows: uniform over the test set's classes
    counts[avail == 0] = 0.0  # a class without test rows cannot be represented: drop it
    if counts.sum() == 0 or len(test_labels) == 0:
        return np.zeros(0, dtype=np.int64)
    p = counts / counts.sum()
    want = min(len(test_labels), max(50, len(train_labels))) if size is None else min(int(size), len(test_labels))
    has = p > 0
    fit = int(np.floor(np.min(avail[has] / p[has]) + 1e-9))  # the largest size at which every class fits
    n = max(0, min(want, fit))
    target = np.minimum(class_targets(p, n), avail)
    rows = []
    for c in range(num_classes):
        if target[c] > 0:
            pool = np.flatnonzero(test_labels == c)
            rows.append(rng.choice(pool, size=int(target[c]), replace=False))
    return np.sort(np.concatenate(rows)).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)


def device_test_indices(test_labels: np.ndarray, client_labels: list[np.ndarray], num_classes: int, seed: int,
                        size: int | None = None) -> list[np.ndarray]:
    """For each device, test-row positions (into ``test_labels``) whose label distribution
    follows that device's training labels ``client_labels[cid]``; seeded by ``(seed, cid)``,
    without replacement within a device. ``size``: rows per device (default
    ``min(len(test), max(50, n_k))``), shrunk when a class has too few test rows (module doc)."""
    test_labels = np.asarray(test_labels)
    return [one_device_indices(test_labels, y, num_classes, _rng(seed, cid), size)
            for cid, y in enumerate(client_labels)]


def personal_test_indices(federation, test: ArrayDataset, seed: int, num_classes: int,
                          size: int | None = None) -> list[np.ndarray]:
    """:func:`device_test_indices` for every client of ``federation`` on ``test``, cached on the
    federation object per ``(seed, size, test)``."""
    cache = federation.__dict__.setdefault(_CACHE_ATTR, {})
    key = (int(seed), size, id(test), len(test), int(num_classes))
    if key not in cache:
        cache[key] = device_test_indices(test.label_array(), [c.label_array() for c in federation.clients],
                                         num_classes, seed, size)
    return cache[key]


def device_test_set(federation, test: ArrayDataset, cid: int, indices: np.ndarray) -> ArrayDataset:
    """Device ``cid``'s test rows with only the modalities it holds (and their ``present/`` masks)."""
    return held_test_set(test, federation.modalities_of(cid), indices)


def held_test_set(test: ArrayDataset, holds, indices: np.ndarray) -> ArrayDataset:
    """Rows ``indices`` of ``test`` with only the modalities ``holds`` (and their ``present/`` masks;
    :meth:`~mmfl.data.base.ArrayDataset.with_features` keeps their ``length/`` keys)."""
    keys = [m for m in holds if m in test.features] + [PRESENT + m for m in holds if PRESENT + m in test.features]
    return test.subset(indices).with_features(keys)


def own_test_indices(test: ArrayDataset, data: ArrayDataset, cid: int, seed: int, num_classes: int,
                     size: int | None = None) -> np.ndarray:
    """Device ``cid``'s rows of :func:`device_test_indices`, computed from its own training data
    alone (what a client does on its own machine; the draw is seeded per device, so the rows are
    the ones the server would draw)."""
    return one_device_indices(test.label_array(), data.label_array(), num_classes, _rng(seed, cid), size)


@torch.no_grad()
def _uar(model: nn.Module, data: ArrayDataset, num_classes: int, batch_size: int) -> float:
    """Unweighted average recall (the mean recall over the classes present in ``data``)."""
    model.eval()
    preds, ys = [], []
    for inputs, labels in data.batches(batch_size, shuffle=False):
        preds.append(model(inputs)["logits"].argmax(1))
        ys.append(labels)
    recall = class_recall(torch.cat(preds), torch.cat(ys), num_classes)
    vals = [r for r in recall if r is not None]
    return float(np.mean(vals)) if vals else 0.0


def device_metrics(model: nn.Module, data: ArrayDataset, num_classes: int, batch_size: int = 1000) -> dict:
    """One device's ``accuracy``, ``uar``, ``test_loss`` and ``rows`` on its test subset ``data``."""
    row = evaluate_model(model, data, batch_size=batch_size, num_classes=num_classes)
    uar = row["uar"] if "uar" in row else _uar(model, data, num_classes, batch_size)
    return {"accuracy": float(row["accuracy"]), "uar": float(uar), "test_loss": float(row["test_loss"]),
            "rows": len(data), **pattern_keys(row)}


def combine_devices(per_device: list[dict | None]) -> dict:
    """The personalized metrics from each device's :func:`device_metrics` (None: a device with
    an empty test subset, or one that did not answer; left out of the means)."""
    done = [d for d in per_device if d is not None]
    per_client = [None if d is None else d["accuracy"] for d in per_device]
    if not done:
        return {"client_accuracy": per_client}
    accs = [d["accuracy"] for d in done]
    return {"accuracy": float(np.mean(accs)), "accuracy_std": float(np.std(accs)),
            "uar": float(np.mean([d["uar"] for d in done])),
            "test_loss": float(np.mean([d["test_loss"] for d in done])), "client_accuracy": per_client,
            "personal_test_rows": float(np.mean([d["rows"] for d in done])), **pool_patterns(done)}


def evaluate_devices(model_of: Callable[[int], nn.Module], indices: list[np.ndarray], modalities_of,
                     test: ArrayDataset, num_classes: int, batch_size: int = 1000) -> dict:
    """Score ``model_of(cid)`` on ``test`` rows ``indices[cid]`` with only the modalities
    ``modalities_of(cid)``, for every device; :func:`combine_devices` of the results."""
    per = []
    for cid, idx in enumerate(indices):
        if len(idx) == 0:
            per.append(None)
            continue
        data = held_test_set(test, modalities_of(cid), idx)
        per.append(device_metrics(model_of(cid), data, num_classes, batch_size))
    return combine_devices(per)


def evaluate_personalized(model_of: Callable[[int], nn.Module], federation, test: ArrayDataset, seed: int,
                          num_classes: int, batch_size: int = 1000) -> dict:
    """Score ``model_of(cid)`` for every device ``cid`` of ``federation`` on its own test
    subset (:func:`personal_test_indices`), restricted to the modalities it holds, with
    :func:`mmfl.core.training.evaluate_model`.

    Returns ``accuracy`` (mean over devices), ``accuracy_std``, ``uar`` (mean of the devices'
    unweighted average recall), ``test_loss`` (mean), ``client_accuracy`` (per device, None
    for a device with an empty test subset; such devices are left out of the means) and
    ``personal_test_rows`` (mean subset size). ``model_of`` is called once per device, in
    device order, and may return the same (reloaded) module each time.
    """
    indices = personal_test_indices(federation, test, seed, num_classes)
    return evaluate_devices(model_of, indices, federation.modalities_of, test, num_classes, batch_size)
