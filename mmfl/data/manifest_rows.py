"""The rows of a manifest: reading the table (CSV, JSON lines; Parquet/Arrow/Feather files and
Hugging Face ``datasets`` folders through :mod:`mmfl.data.tables`), the label of each row as a
dense class id, and the split of each row (``train`` / ``test`` / ``public``)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from mmfl.data.split import stratified_split
from mmfl.errors import DataError

SPLITS = ("train", "test", "public")


def read_rows(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """Manifest -> (columns in order, rows as dicts); Parquet/Arrow/Feather files and Hugging Face
    ``datasets`` folders are read by :func:`mmfl.data.tables.read_rows`."""
    from mmfl.data import tables

    if tables.is_table(path):
        return tables.read_rows(path)
    if not path.exists() and tables.is_hf_folder(path.parent):
        raise DataError(f"{path}: manifest not found ({path.parent} is a Hugging Face datasets folder: "
                        "set data.manifest = \".\" to read it)")
    if not path.is_file():
        raise DataError(f"{path}: manifest not found")
    try:
        if path.suffix.lower() == ".jsonl":
            rows, cols = [], {}
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: line {n}: invalid JSON ({e})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}: line {n}: expected a JSON object")
                rows.append(row)
                cols.update(dict.fromkeys(row))
            return list(cols), rows
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = []
            for r in reader:
                if None in r:  # more cells than header columns: an unquoted comma, e.g. a list
                    raise DataError(f"{path}: line {reader.line_num}: {len(reader.fieldnames) + len(r[None])} cells "
                                    f"but {len(reader.fieldnames)} header columns (quote cells that contain commas)")
                rows.append(dict(r))
            return list(reader.fieldnames or []), rows
    except (UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: cannot parse manifest ({e})") from None


def empty(v: Any) -> bool:
    return v is None or (isinstance(v, str) and not v.strip()) or (isinstance(v, float) and v != v)


def _label_key(v: Any) -> tuple[str, int | None]:
    """A label cell -> (its name, its integer value or None): ``3``, ``3.0``, ``"3"`` and ``" 3 "`` are 3."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return str(int(v)), int(v)
    if isinstance(v, float) and v.is_integer():
        return str(int(v)), int(v)
    s = str(v).strip()
    if INTEGER.fullmatch(s):
        return str(int(s)), int(s)
    if _FLOAT_INT.fullmatch(s):  # "3.0", as pandas writes an integer column with gaps
        return str(int(float(s))), int(float(s))
    return s, None


INTEGER = re.compile(r"[-+]?\d+")
_FLOAT_INT = re.compile(r"[-+]?\d+\.0*")


def label_ids(values: list[Any], known: list[int], classes: list[str]) -> tuple[np.ndarray, list[str]]:
    """Labels -> (int64 ids, class names): ids of the sorted distinct labels of the rows ``known``
    (numeric order if all are integers, else string order), or of ``classes`` when given.
    Rows outside ``known`` (public rows) with an unknown or empty label get id -1.
    Raises ``ValueError((row index, label))`` for a label of a ``known`` row not in ``classes``."""
    keys = [None if empty(v) else _label_key(v) for v in values]
    if classes:
        names = list(classes)
    else:
        found = {keys[i] for i in known}
        numeric = all(k[1] is not None for k in found)
        names = [k[0] for k in sorted(found, key=(lambda k: (k[1], k[0])) if numeric else (lambda k: k[0]))]
    index = {n: i for i, n in enumerate(names)}
    ids = np.array([-1 if k is None else index.get(k[0], -1) for k in keys], dtype=np.int64)
    for i in known:
        if ids[i] < 0:
            raise ValueError((i, keys[i][0]))
    return ids, names


def split_rows(rows, cols, p, labels_raw, where) -> np.ndarray:
    """Each row's split name ("train" / "test" / "public") as a str array."""
    if p.split_column in cols:
        split = [str(r.get(p.split_column) or "").strip().lower() for r in rows]
        for n, s in enumerate(split, 1):
            if not s:
                raise DataError(f"{where(n, p.split_column)}: empty cell (every row needs a {p.split_column})")
            if s not in SPLITS:
                raise DataError(f"{where(n, p.split_column)}: must be 'train' or 'test' (or 'public': "
                                f"CreamFL's public set), got {s!r}")
        split = np.array(split)
        for need in ("train", "test"):
            if not (split == need).any():
                raise DataError(f"{where(None, p.split_column)}: no {need} rows")
        return split
    for n, v in enumerate(labels_raw, 1):
        if empty(v):
            raise DataError(f"{where(n, p.label_column)}: empty cell (every row needs a {p.label_column})")
    y, _ = label_ids(labels_raw, list(range(len(rows))), [])
    tr, te = stratified_split(y, p.test_fraction, p.seed)
    split = np.empty(len(rows), dtype=object)
    split[tr], split[te] = "train", "test"
    return split.astype(str)
