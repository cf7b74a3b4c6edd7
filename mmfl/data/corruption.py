"""Simulated data problems of a federation, applied by :func:`mmfl.data.federation.build_federation`
after the partition and the modality assignment (FedMultimodal's missing modalities, missing
labels and label noise, per sample and per client; docs/data.md, "Missing modalities, missing
labels and label noise in simulation"):

- :func:`zero_absent`: a sample that lacks modality ``m`` (``present/<m>`` False) carries zeros
  in ``m``'s row, not the original values;
- :func:`drop_labels`: ``[corruption] label_missing_rate``, a share of each client's train rows
  loses its label; the declared rule: such rows are dropped from training (and counted);
- :func:`flip_labels`: ``[corruption] label_noise``, a share of each client's labelled train
  rows gets a wrong label: any other class, uniformly (``symmetric``), or class ``c`` ->
  ``(c + 1) mod K`` (``pair``, the class-pair flip of the noisy-label literature);
- :func:`policy_rows`: ``[modalities] missing_policy = "complete_rows"`` keeps only the rows
  holding every modality the client holds; :func:`without_modality` is ``drop_modality:<m>``.

Every draw comes from a seed derived from the run seed and the client id, so a resumed run
(or ``mmfl partition``) draws exactly the same rows. Tensors shared with a loader's cache are
never written to: each function copies what it changes.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import numpy as np
import torch

from mmfl.data.base import PRESENT, ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.modality import missing_masks, missing_test_masks
from mmfl.errors import ConfigError
from mmfl.seeds import derive_seed


def zero_absent(data: ArrayDataset, masks: dict[str, torch.Tensor]) -> ArrayDataset:
    """``data`` with the ``present/<m>`` ``masks`` (over its underlying rows) added and, in each
    modality ``m``, the rows its mask marks absent set to zero (a copy of that feature tensor;
    the others are shared)."""
    feats = dict(data.features)
    for key, present in masks.items():
        m = key[len(PRESENT):]
        present = present.to(torch.bool)
        if m in feats and not bool(present.all()):
            t = feats[m].clone()
            t[~present.to(t.device)] = 0
            feats[m] = t
        feats[key] = present.to(data.labels.device)
    return ArrayDataset(feats, data.labels, data.indices, data.device)


def drop_labels(part: np.ndarray, rate: float, seed: int, cid: int) -> tuple[np.ndarray, int]:
    """The rows of ``part`` that keep their label, and how many lost it: ``round(rate * n)``
    rows drawn at random (seed ``(seed, "corruption", "labels", cid)``)."""
    part = np.asarray(part, dtype=np.int64)
    k = int(round(rate * len(part)))
    if k == 0:
        return part, 0
    rng = np.random.default_rng(derive_seed(seed, "corruption", "labels", cid))
    lost = np.zeros(len(part), dtype=bool)
    lost[rng.choice(len(part), size=k, replace=False)] = True
    return part[~lost], k


def flip_labels(labels: np.ndarray, rows: np.ndarray, rate: float, kind: str, num_classes: int,
                seed: int, cid: int) -> int:
    """Flip, in place in ``labels`` (a copy of the train labels), ``round(rate * len(rows))`` of
    the labels at ``rows`` (drawn at random, seed ``(seed, "corruption", "noise", cid)``) to
    another class: uniform over the other K - 1 (``symmetric``) or ``c -> (c + 1) mod K``
    (``pair``). Returns how many were flipped."""
    k = int(round(rate * len(rows)))
    if k == 0 or num_classes < 2:
        return 0
    rng = np.random.default_rng(derive_seed(seed, "corruption", "noise", cid))
    pick = np.asarray(rows)[rng.choice(len(rows), size=k, replace=False)]
    old = labels[pick]
    if kind == "pair":
        labels[pick] = (old + 1) % num_classes
    else:  # an offset in 1..K-1: uniform over the other classes
        labels[pick] = (old + rng.integers(1, num_classes, size=k)) % num_classes
    return k


def policy_rows(data: ArrayDataset, part: np.ndarray, held: tuple[str, ...]) -> np.ndarray:
    """``complete_rows``: the rows of ``part`` (positions in ``data``) that hold every modality
    in ``held`` (all of them where ``data`` has no masks)."""
    return _rows_holding(data, part, held, every=True)


def without_modality(data: ArrayDataset | None, m: str) -> ArrayDataset | None:
    """``data`` without modality ``m`` (its tensor, its ``present/`` and ``length/`` keys)."""
    if data is None:
        return None
    keep = [k for k in data.features if k != m and not k.endswith("/" + m)]
    return ArrayDataset({k: data.features[k] for k in keep}, data.labels, data.indices, data.device)


def client_report(data: ArrayDataset, held: tuple[str, ...], original: np.ndarray | None,
                  counts: dict[str, int]) -> dict:
    """One client's line of ``mmfl partition``: the modalities it holds, its rows, the rows
    lacking each held modality, and the counters of what the simulation did (``counts``:
    ``labels_dropped``, ``incomplete_dropped``, ``empty_dropped``). ``labels_flipped``: its rows
    whose label differs from ``original`` (the loader's labels, None: no label noise)."""
    rows = data.base_rows()
    lacking = {}
    for m in held:
        mask = data.features.get(PRESENT + m)
        lacking[m] = int((~mask.cpu().numpy()[rows]).sum()) if mask is not None else 0
    flipped = 0
    if original is not None:
        flipped = int((data.labels.cpu().numpy()[rows] != original[rows]).sum())
    return {"holds": tuple(held), "rows": int(len(rows)), "lacking": lacking, "labels_flipped": flipped,
            **{k: int(counts.get(k, 0)) for k in ("labels_dropped", "incomplete_dropped", "empty_dropped")}}


@dataclass
class Simulated:
    """What :func:`simulate` returns: the (possibly changed) train/test/public sets and meta, each
    client's rows (positions in ``train``) and modalities, and the per-client counters."""

    train: ArrayDataset
    test: ArrayDataset
    public: ArrayDataset | None
    meta: DatasetMeta
    parts: list[np.ndarray]
    holds: list[tuple[str, ...]]
    counts: list[dict[str, int]]
    original_labels: np.ndarray | None  # the loader's labels where label noise changed some
    changed: bool  # rows or labels differ from the partition's (the pooled set is the clients' union)


def simulate(cfg, bundle: DatasetBundle, parts: list[np.ndarray], holds: list[tuple[str, ...]], mrng) -> Simulated:
    """Apply ``[modalities]``' missingness and policy and ``[corruption]``'s label problems to
    ``bundle`` split as ``parts`` / ``holds``. ``mrng``: the modality generator right after the
    assignment (the train masks draw from it, as they always have)."""
    mp, seed = cfg.modalities.params, cfg.run.seed
    train, test, public, meta = bundle.train, bundle.test, bundle.public, bundle.meta
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    holds = [tuple(h) for h in holds]
    counts: list[dict[str, int]] = [{} for _ in parts]
    short: dict[str, int] = {}
    masks = missing_masks(train, parts, holds, mp.missing_rate, mrng, short)
    if masks:
        train = zero_absent(train, masks)
    _warn_short("missing_rate", "train", short)
    short = {}
    tmasks = missing_test_masks(test, mp.test_missing_rate,
                                np.random.default_rng(derive_seed(seed, "modalities", "test")), short)
    if tmasks:
        test = zero_absent(test, tmasks)
    _warn_short("test_missing_rate", "test", short)
    drop = mp.dropped_modality
    if drop is not None:
        only = [c for c, h in enumerate(holds) if h == (drop,)]
        if only:
            raise ConfigError(f"modalities.missing_policy: drop_modality:{drop} leaves client(s) "
                              f"{', '.join(map(str, only[:5]))}{' ...' if len(only) > 5 else ''} with no modality "
                              f"(they hold only {drop})")
        holds = [tuple(m for m in h if m != drop) for h in holds]
        train, test, public = (without_modality(d, drop) for d in (train, test, public))
        meta = dataclasses.replace(meta, modalities={k: v for k, v in meta.modalities.items() if k != drop})
    corr = cfg.corruption
    lost_rate = corr.label_missing_rate if corr is not None else 0.0
    noise = corr.label_noise if corr is not None else {"rate": 0.0, "kind": "symmetric"}
    original = None
    if lost_rate > 0 or noise["rate"] > 0:
        y = train.labels.cpu().numpy().copy()
        for cid, part in enumerate(parts):
            parts[cid], counts[cid]["labels_dropped"] = drop_labels(part, lost_rate, seed, cid)
            rows = train.base_rows(parts[cid])
            flip_labels(y, rows, noise["rate"], noise["kind"], meta.num_classes, seed, cid)
        if noise["rate"] > 0:
            original = train.labels.cpu().numpy()
            train = ArrayDataset(train.features, torch.from_numpy(y).to(train.labels.device), train.indices,
                                 train.device)
    for cid, (part, held) in enumerate(zip(parts, holds)):
        if not any(PRESENT + m in train.features for m in held):
            continue
        if mp.missing_policy == "complete_rows":
            kept = policy_rows(train, part, held)
            counts[cid]["incomplete_dropped"] = len(part) - len(kept)
            part = kept
        # a row with none of its client's modalities trains nothing
        kept = _rows_holding(train, part, held, every=False)
        counts[cid]["empty_dropped"] = len(part) - len(kept)
        parts[cid] = kept
    changed = bool(lost_rate > 0 or noise["rate"] > 0 or any(c.get("incomplete_dropped") or c.get("empty_dropped")
                                                                for c in counts))
    return Simulated(train, test, public, meta, parts, holds, counts, original, changed)


def _warn_short(key: str, where: str, short: dict[str, int]) -> None:
    """One warning line where the rates could not all be met without emptying samples."""
    if short:
        gaps = ", ".join(f"{k} fewer {where} samples lack {m}" for m, k in short.items())
        print(f"mmfl: warning: modalities.{key}: the rates add up to more than every sample can lose "
              f"while keeping one modality: {gaps} than asked", file=sys.stderr)


def _rows_holding(data: ArrayDataset, part: np.ndarray, held: tuple[str, ...], every: bool) -> np.ndarray:
    """The rows of ``part`` that hold every modality of ``held`` (``every``) or at least one (a
    modality without a ``present/`` mask is held by every row)."""
    part = np.asarray(part, dtype=np.int64)
    base = data.base_rows(part)
    keep = np.full(len(part), every)
    for m in held:
        mask = data.features.get(PRESENT + m)
        has = mask.cpu().numpy()[base] if mask is not None else np.ones(len(part), dtype=bool)
        keep = keep & has if every else keep | has
    return part[keep]
