"""Sequence columns of a manifest: per-column settings, stacking rows into one tensor with
padding or cutting on the time axis (``max_length``, ``pad``), and valid lengths given by a
column (``length_column``); lengths go to ``features["length/<m>"]``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mmfl.data.base import LENGTH
from mmfl.data.manifest_cells import fit_length
from mmfl.errors import ConfigError, DataError


def per_column(value, default, columns: list[str], key: str) -> dict[str, Any]:
    """A setting that is one value for all ``columns`` or a table column -> value."""
    if not isinstance(value, dict):
        return {m: value for m in columns}
    for k in value:
        if k not in columns:
            raise ConfigError(f"{key}.{k}: not a column this setting applies to (those columns: "
                              f"{', '.join(columns) or 'none'})")
    return {m: value.get(m, default) for m in columns}


def length_columns(rows, cols, feats, kinds, mods, p, where, present=None) -> None:
    """``length_column``: each row's valid length of an already padded array column, from a
    manifest column, written as ``length/<m>`` (cut to the stored length; integers >= 1). A row
    lacking ``m`` (``present[m]`` False) gets length 1 whatever its cell holds."""
    array_cols = [m for m in mods if kinds[m] == "array"]
    if isinstance(p.length_column, dict):
        pairs = per_column(p.length_column, "", array_cols, "data.length_column")
    else:
        pairs = {m: p.length_column for m in array_cols} if p.length_column else {}
    for m, col in pairs.items():
        if not col:
            continue
        if col not in cols:
            raise DataError(f"{where(None, col)}: no such column (data.length_column; columns: {', '.join(cols)})")
        steps = int(feats[m].shape[-1])
        out = []
        for n, row in enumerate(rows, 1):
            if present is not None and not present[m][n - 1]:
                out.append(1)
                continue
            v = row.get(col)
            try:
                t = int(str(v).strip()) if not isinstance(v, (int, np.integer)) else int(v)
            except ValueError:
                t = 0
            if t < 1:
                raise DataError(f"{where(n, col)}: a length must be an integer >= 1, got {v!r}")
            out.append(min(t, steps))
        if feats[m].dim() == 2:  # a padded sequence of scalars [T] is one channel [1, T], as with max_length
            feats[m] = feats[m].unsqueeze(1)
        feats[LENGTH + m] = torch.tensor(out, dtype=torch.int64)


def stack_column(vals: list[np.ndarray], length: int, truncate: str, kind: str, m: str, where, first_row="row 1"):
    """Per-row arrays -> float32 ``[N, *shape]`` (and int64 lengths ``[N]`` with ``length``);
    ``first_row`` names the row of ``vals[0]`` in messages."""
    first = vals[0].shape
    if not length:
        for n, v in enumerate(vals, 1):
            if v.shape != first:
                hint = ("set data.image_size" if kind == "image" else
                        "set data.max_length, or data.pad = true, to pad/cut sequences on the last axis" if kind == "array" else
                        "audio_length fixes the length")
                raise DataError(f"{where(n, m)}: ragged shapes: {tuple(v.shape)} here, {tuple(first)} in {first_row} "
                                f"({hint})")
        return torch.from_numpy(np.stack(vals).astype(np.float32)), None
    out, lengths = [], []
    for n, v in enumerate(vals, 1):
        if v.ndim == 0:
            raise DataError(f"{where(n, m)}: a scalar; data.max_length needs sequences ([T] or [C, T])")
        if v.shape[:-1] != first[:-1]:
            raise DataError(f"{where(n, m)}: shape {tuple(v.shape)} here, {tuple(first)} in {first_row}: only the "
                            "last axis (time) may differ (data.max_length pads/cuts it; for [T, C] "
                            "values set data.time_axis = 'first')")
        x, t = fit_length(v, length, truncate)
        out.append(x)
        lengths.append(t)
    return torch.from_numpy(np.stack(out).astype(np.float32)), torch.tensor(lengths, dtype=torch.int64)
