"""The generic format for a user's own data: a manifest table plus files.

``root/manifest.csv`` (or ``.jsonl``, one JSON object per line) has one row
per sample: a label column, one column per modality, and optionally a client
column (a natural federated split) and a split column (``train``/``test``).
A modality cell is either a file path (relative to ``root``, or absolute),
read by extension::

    .png .jpg .jpeg .bmp .gif -> "image": float32 [C, H, W] in [0, 1] (Pillow)
    .wav                      -> "audio": float32 [1, audio_length] mono PCM
    .txt                      -> "text":  the file's text
    .npy                      -> "array": float32, the stored shape

or an inline value: a number or a list of numbers (JSON ``[1, 2]``, or
space/semicolon separated ``1 2``/``1;2``) -> "array" float32 ``[d]``; any other
string -> "text". Text becomes int64 token ids ``[text_max_tokens]`` (lowercase
``\\w+`` tokens; vocabulary from the train split; 0 = pad, 1 = unknown), stored
as ``meta.info["vocab"][modality]`` (token -> id). Rows are counted from 1
(the first data row, after a CSV header). Readers live in :data:`READERS`
(kind -> function) and :data:`EXTENSIONS` (file extension -> kind).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.audio import read_wav as read_wav_any
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.split import check_fraction, stratified_split  # noqa: F401  (re-exported)
from mmfl.data.tables import Blob, Unreadable
from mmfl.errors import ConfigError, DataError


@dataclass
class ManifestParams:
    root: str = field(default="", metadata={"help": "(required) directory holding the manifest; relative "
                                                    "paths in cells are relative to it"})
    manifest: str = field(default="manifest.csv", metadata={"help": "manifest file in root: .csv (header row) "
                                                                    "or .jsonl (one JSON object per line)"})
    label_column: str = field(default="label", metadata={"help": "column of class labels (ints or names)"})
    modalities: list[str] = field(default_factory=list, metadata={
        "help": "columns holding modalities (empty = all but the label, client and split columns)"})
    client_column: str = field(default="client", metadata={
        "help": "client-id column, used if present: a natural split (ids mapped to 0..K-1 in sorted order)"})
    split_column: str = field(default="split", metadata={
        "help": "train/test column, used if present; otherwise a seeded stratified split"})
    test_fraction: float = field(default=0.2, metadata={"help": "test share when there is no split column"})
    seed: int = field(default=0, metadata={"help": "seed of the stratified split"})
    image_size: int = field(default=0, metadata={"help": "resize images to this square size (0 = keep)"})
    image_mode: Literal["L", "RGB"] = field(default="RGB", metadata={"help": "L (1 channel) or RGB (3)"})
    audio_length: int = field(default=16000, metadata={"help": "samples per clip (zero-padded or truncated)"})
    audio_sample_rate: int = field(default=0, metadata={
        "help": "resample audio to this rate (linear interpolation; 0 = keep, all files must then share one)"})
    text_max_tokens: int = field(default=64, metadata={"help": "token ids per text cell (padded with 0)"})

    def __post_init__(self):
        if not self.root:
            raise ConfigError("data.root: required for manifest (the directory holding the manifest)")
        check_fraction(self.test_fraction)
        for key in ("image_size", "audio_sample_rate"):
            if getattr(self, key) < 0:
                raise ConfigError(f"data.{key}: must be >= 0, got {getattr(self, key)}")
        for key in ("audio_length", "text_max_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key}: must be >= 1, got {getattr(self, key)}")
        if self.image_mode not in ("L", "RGB"):
            raise ConfigError(f"data.image_mode: must be 'L' or 'RGB', got {self.image_mode!r}")


# ---- readers: fn(path, params, state) -> np.ndarray | str; `state` is per-column (ends up in meta.info)

def read_image(path: Path, p: ManifestParams, state: dict) -> np.ndarray:
    """Image file -> float32 ``[C, H, W]`` in [0, 1] (C = 1 for L, 3 for RGB)."""
    from PIL import Image

    with Image.open(path) as img:
        img.load()
        img = img.convert(p.image_mode)
        if p.image_size:
            img = img.resize((p.image_size, p.image_size), Image.BILINEAR)
        arr = np.asarray(img, dtype=np.float32) / 255.0
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1).copy()


def read_wav(path: Path, p: ManifestParams, state: dict) -> np.ndarray:
    """PCM wav (8/16/32-bit) -> mono float32 ``[1, audio_length]`` in [-1, 1]."""
    target = p.audio_sample_rate
    x, rate = read_wav_any(path, target)
    if not target:
        first = state.setdefault("sample_rate", rate)
        if rate != first:
            raise DataError(f"sample rate {rate} Hz differs from {first} Hz of earlier files "
                            "(set data.audio_sample_rate to resample)")
    if target:
        state["sample_rate"] = target
    out = np.zeros((1, p.audio_length), dtype=np.float32)
    out[0, : min(len(x), p.audio_length)] = x[: p.audio_length]
    return out


def read_text(path: Path, p: ManifestParams, state: dict) -> str:
    return path.read_text(encoding="utf-8")


def read_npy(path: Path, p: ManifestParams, state: dict) -> np.ndarray:
    return np.asarray(np.load(path, allow_pickle=False), dtype=np.float32)


READERS: dict[str, Callable[[Path, ManifestParams, dict], Any]] = {
    "image": read_image, "audio": read_wav, "text": read_text, "array": read_npy,
}
EXTENSIONS: dict[str, str] = {
    ".png": "image", ".jpg": "image", ".jpeg": "image", ".bmp": "image", ".gif": "image",
    ".wav": "audio", ".txt": "text", ".npy": "array",
}

_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_INT = re.compile(r"[-+]?\d+")
_TOKEN = re.compile(r"\w+")


def _inline_numbers(cell: Any) -> np.ndarray | None:
    """A number or list of numbers -> float32 ``[d]``; None if ``cell`` is not one."""
    if isinstance(cell, bool):
        return None
    if isinstance(cell, (int, float)):
        return np.array([cell], dtype=np.float32)
    if isinstance(cell, list):
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in cell)
        return np.array(cell, dtype=np.float32) if ok and cell else None
    s = cell.strip()
    if s.startswith("[") and s.endswith("]"):
        try:
            return _inline_numbers(json.loads(s))
        except json.JSONDecodeError:
            return None
    parts = [t for t in re.split(r"[;\s]+", s) if t]
    if parts and all(_NUM.fullmatch(t) for t in parts):
        return np.array([float(t) for t in parts], dtype=np.float32)
    return None


def _file_kind(cell: Any) -> str | None:
    """The reader kind of a file-path cell (by extension), None for an inline value."""
    return EXTENSIONS.get(Path(cell.strip()).suffix.lower()) if isinstance(cell, str) else None


def read_cell(cell: Any, root: Path, p: ManifestParams, states: dict, col: str,
              as_text: bool = False) -> tuple[str, Any]:
    """One modality cell -> (kind, value); raises DataError naming the problem (caller adds row).

    ``as_text``: the column holds inline text somewhere, so inline numbers are text too.
    A :class:`~mmfl.data.tables.Blob` (media bytes from a Parquet/Arrow/datasets table) is decoded
    by the same reader as a file of its kind; a numpy array (a table's nested list) is an array.
    """
    if isinstance(cell, Unreadable):
        raise DataError(cell.reason)
    if isinstance(cell, Blob):
        try:
            return cell.kind, READERS[cell.kind](io.BytesIO(cell.data), p, states.setdefault(col, {}))
        except Exception as e:  # noqa: BLE001 - any decoder failure is a data problem
            raise DataError(f"cannot read {cell.name or 'the stored bytes'} as {cell.kind}: {e}") from None
    if isinstance(cell, np.ndarray):
        return "array", np.asarray(cell, dtype=np.float32)
    if isinstance(cell, str):
        kind = _file_kind(cell)
        if kind is not None:
            path = Path(cell.strip()).expanduser()
            path = path if path.is_absolute() else root / path
            if not path.is_file():
                raise DataError(f"file not found: {path}")
            try:
                return kind, READERS[kind](path, p, states.setdefault(col, {}))
            except Exception as e:  # noqa: BLE001 - any decoder failure is a data problem
                raise DataError(f"cannot read {path} as {kind}: {e}") from None
    vec = None if as_text else _inline_numbers(cell)
    if vec is not None:
        return "array", vec
    if isinstance(cell, str) or (as_text and isinstance(cell, (int, float))):
        return "text", str(cell)
    raise DataError(f"unsupported value {cell!r}")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def build_vocab(texts: list[str]) -> dict[str, int]:
    """Token -> id, by frequency then alphabetically; 0 = ``<pad>``, 1 = ``<unk>``."""
    counts = Counter(t for s in texts for t in tokenize(s))
    vocab = {"<pad>": 0, "<unk>": 1}
    for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        vocab[tok] = len(vocab)
    return vocab


def encode_texts(texts: list[str], vocab: dict[str, int], max_tokens: int) -> torch.Tensor:
    """Texts -> int64 ``[N, max_tokens]`` ids (truncated, 0-padded; unknown -> 1)."""
    out = torch.zeros(len(texts), max_tokens, dtype=torch.int64)
    for i, s in enumerate(texts):
        ids = [vocab.get(t, 1) for t in tokenize(s)[:max_tokens]]
        out[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return out


def _read_rows(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
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


def _empty(v: Any) -> bool:
    return v is None or (isinstance(v, str) and not v.strip())


def _label_ids(values: list[Any]) -> tuple[np.ndarray, list[str]]:
    """Labels (all ints, or names) -> int64 ids and class names."""
    as_int = [int(v) if isinstance(v, int) and not isinstance(v, bool) else
              int(v) if isinstance(v, float) and v.is_integer() else
              int(v.strip()) if isinstance(v, str) and _INT.fullmatch(v.strip()) else None for v in values]
    if all(v is not None and v >= 0 for v in as_int):
        y = np.array(as_int, dtype=np.int64)
        return y, [str(i) for i in range(int(y.max()) + 1)]
    names = sorted({str(v).strip() for v in values})
    index = {n: i for i, n in enumerate(names)}
    return np.array([index[str(v).strip()] for v in values], dtype=np.int64), names


@DATASETS.register("manifest", ManifestParams,
                   help="your own data: a manifest.csv/.jsonl of labels, modality files or inline values")
def load_manifest(p: ManifestParams) -> DatasetBundle:
    """Read ``root/manifest`` and its files into a bundle (see the module docstring for the format)."""
    root = Path(p.root).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: manifest root directory not found")
    mpath = Path(p.manifest).expanduser()
    mpath = mpath if mpath.is_absolute() else root / mpath
    cols, rows = _read_rows(mpath)
    if not rows:
        raise DataError(f"{mpath}: no rows")
    if p.label_column not in cols:
        raise DataError(f"{mpath}: no label column {p.label_column!r} (columns: {', '.join(cols)})")
    special = {p.label_column, p.client_column, p.split_column}
    mods = list(p.modalities) or [c for c in cols if c not in special]
    if not mods:
        raise DataError(f"{mpath}: no modality columns (columns: {', '.join(cols)})")
    for m in mods:
        if m not in cols or m in special:
            raise DataError(f"{mpath}: {m!r} is not a modality column (columns: {', '.join(cols)})")

    def where(n: int, col: str) -> str:
        return f"{mpath}: row {n}, column {col!r}"

    for n, row in enumerate(rows, 1):
        for col in [p.label_column] + [c for c in (p.client_column, p.split_column) if c in cols]:
            if _empty(row.get(col)):
                raise DataError(f"{where(n, col)}: empty cell (every row needs a {col})")
    labels, class_names = _label_ids([r[p.label_column] for r in rows])

    states: dict[str, dict] = {}
    values: dict[str, list] = {m: [] for m in mods}
    kinds: dict[str, str] = {}
    as_text = {m: any(isinstance(r.get(m), str) and _file_kind(r[m]) is None and not _empty(r[m])
                      and _inline_numbers(r[m]) is None for r in rows) for m in mods}
    for n, row in enumerate(rows, 1):
        for m in mods:
            cell = row.get(m)
            if _empty(cell):
                raise DataError(f"{where(n, m)}: empty cell (missing modalities are not supported yet)")
            try:
                kind, val = read_cell(cell, root, p, states, m, as_text[m])
            except DataError as e:
                raise DataError(f"{where(n, m)}: {e}") from None
            first = kinds.setdefault(m, kind)
            if kind != first:
                raise DataError(f"{where(n, m)}: a {kind} value, but earlier rows hold {first} values")
            if kind != "text" and values[m] and val.shape != values[m][0].shape:
                raise DataError(f"{where(n, m)}: ragged shapes: {tuple(val.shape)} here, "
                                f"{tuple(values[m][0].shape)} in row 1 (for images set data.image_size)")
            values[m].append(val)

    if p.split_column in cols:
        split = [str(r[p.split_column]).strip().lower() for r in rows]
        for n, s in enumerate(split, 1):
            if s not in ("train", "test"):
                raise DataError(f"{where(n, p.split_column)}: must be 'train' or 'test', got {s!r}")
        split_arr = np.array(split)
        tr_idx, te_idx = np.flatnonzero(split_arr == "train"), np.flatnonzero(split_arr == "test")
        if not len(tr_idx) or not len(te_idx):
            raise DataError(f"{mpath}: split column {p.split_column!r} has no "
                            f"{'train' if not len(tr_idx) else 'test'} rows")
    else:
        tr_idx, te_idx = stratified_split(labels, p.test_fraction, p.seed)

    feats_tr, feats_te, vocab = {}, {}, {}
    for m in mods:
        if kinds[m] == "text":
            vocab[m] = build_vocab([values[m][i] for i in tr_idx])
            full = encode_texts(values[m], vocab[m], p.text_max_tokens)
        else:
            full = torch.from_numpy(np.stack(values[m]).astype(np.float32))
        feats_tr[m], feats_te[m] = full[torch.from_numpy(tr_idx)], full[torch.from_numpy(te_idx)]
    y = torch.from_numpy(labels)
    train = ArrayDataset(feats_tr, y[torch.from_numpy(tr_idx)])
    test = ArrayDataset(feats_te, y[torch.from_numpy(te_idx)])

    client_ids, info = None, {"source": str(mpath), "kinds": kinds, "vocab": vocab, "modality_info": states}
    if p.client_column in cols:
        raw = [rows[i][p.client_column] for i in tr_idx]
        keys = [str(v).strip() for v in raw]
        numeric = all(_INT.fullmatch(k) for k in keys)
        names = sorted(set(keys), key=(lambda k: int(k)) if numeric else None)
        index = {k: i for i, k in enumerate(names)}
        client_ids = torch.tensor([index[k] for k in keys], dtype=torch.int64)
        info["client_names"] = names
    meta = DatasetMeta(name="manifest", num_classes=len(class_names),
                       modalities={m: tuple(feats_tr[m].shape[1:]) for m in mods},
                       class_names=class_names, info=info)
    return DatasetBundle(train=train, test=test, meta=meta, client_ids=client_ids)
