"""The generic format for a user's own data: a manifest table plus files.

``root/manifest.csv`` (or ``.jsonl``, one JSON object per line) has one row
per sample: a label column, one column per modality, and optionally a client
column (a natural federated split) and a split column (``train``/``test``/``public``).
A modality cell is either a file path (relative to ``root``, or absolute),
read by extension (:mod:`mmfl.data.manifest_cells`)::

    .png .jpg .jpeg .bmp .gif -> "image": float32 [C, H, W] in [0, 1] (Pillow)
    .wav                      -> "audio": float32 [1, audio_length] mono PCM
    .txt                      -> "text":  the file's text (UTF-8, non-empty)
    .npy                      -> "array": float32, the stored shape (finite, non-empty)
    .csv .tsv                 -> "array": float32 [C, T] (lines = steps, columns = channels)

or an inline value: a number or a list of numbers (JSON ``[1, 2]``, nested lists for
``[C, T]``, or space/semicolon separated ``1 2``/``1;2``) -> "array" float32; any other
string -> "text". Text columns go through their ``text_encoder``
(:mod:`mmfl.data.manifest_text`). Array columns of varying last-axis length are padded or
cut to ``max_length`` with ``length/<m>`` written; ``normalize`` z-scores modalities with
train-split statistics (by default every column but token ids: ``"auto"``). Rows are counted
from 1 (the first data row, after a CSV header).
Labels keep their given names, mapped to dense ids in sorted order (numeric order when
every label is an integer), stored in ``meta.class_names`` and ``meta.info["label_map"]``;
a column that is not classes is refused (:mod:`mmfl.data.labels`, ``label_type``). An empty
modality cell, or one naming a missing file, is a missing modality for that row: zeros and
``present/<m>`` = False (:mod:`mmfl.data.manifest_missing`, ``missing``); rows without a label
(``unlabelled``) or without any modality are left out, with one line saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.base import LENGTH, PRESENT, ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.labels import LABEL_TYPES, check_label_column
from mmfl.data.manifest_cells import (EXTENSIONS, READERS, file_kind, fit_length, inline_numbers,  # noqa: F401
                                      is_inline_text, read_cell, read_image, read_npy, read_text, read_wav,
                                      zscore, zscore_stats)
from mmfl.data.manifest_columns import rename_columns, standardize
from mmfl.data.manifest_missing import (absent_cells, check_presence, fill, fill_lengths, refuse_absent,
                                        rows_to_keep)
from mmfl.data.manifest_seq import length_columns, per_column, stack_column
from mmfl.data.manifest_text import (DEFAULT_TEXT_ENCODER, TOKENS, build_vocab, check_text_encoder,  # noqa: F401
                                     column_encoders, encode_column, encode_texts, tokenize)
from mmfl.data.manifest_rows import INTEGER, SPLITS, empty, label_ids, read_rows, split_rows
from mmfl.data.split import check_fraction, stratified_split  # noqa: F401  (re-exported)
from mmfl.errors import ConfigError, DataError



@dataclass
class ManifestParams:
    root: str = field(default="", metadata={"help": "(required) directory holding the manifest; relative "
                                                    "paths in cells are relative to it"})
    manifest: str = field(default="manifest.csv", metadata={"help": "manifest file in root: .csv (header row) "
                                                                    "or .jsonl (one JSON object per line)"})
    label_column: str = field(default="label", metadata={
        "help": "column of class labels: integers (numeric order) or names (sorted), mapped to ids 0..K-1"})
    classes: list[str] = field(default_factory=list, metadata={
        "help": "the labels in id order (empty = the sorted labels found); fixes ids across data sets"})
    modalities: list[str] = field(default_factory=list, metadata={
        "help": "columns holding modalities (empty = all but the label, client and split columns)"})
    client_column: str = field(default="client", metadata={
        "help": "client-id column, used if present: a natural split (ids mapped to 0..K-1 in sorted order); "
                "test and public rows may leave it empty"})
    split_column: str = field(default="split", metadata={
        "help": "train/test/public column, used if present (public rows: CreamFL's public set); "
                "otherwise a seeded stratified train/test split"})
    test_fraction: float = field(default=0.2, metadata={"help": "test share when there is no split column"})
    seed: int = field(default=0, metadata={"help": "seed of the stratified split"})
    rename: dict[str, str] = field(default_factory=dict, metadata={
        "help": "table column -> modality name, e.g. { tweet = \"text\" } to match another data set's "
                "modality (the other options name columns)"})
    image_size: int = field(default=0, metadata={"help": "resize images to this square size (0 = keep)"})
    image_mode: Literal["L", "RGB"] = field(default="RGB", metadata={"help": "L (1 channel) or RGB (3)"})
    audio_length: int = field(default=16000, metadata={"help": "samples per clip (zero-padded or truncated)"})
    audio_sample_rate: int = field(default=0, metadata={
        "help": "resample audio to this rate (linear interpolation; 0 = keep, all files must then share one)"})
    text_encoder: str | dict[str, str] = field(default=DEFAULT_TEXT_ENCODER, metadata={
        "help": "text columns -> tensors: minilm (frozen, 384-d), hash / hash:<d> (hashed words), tokens "
                "(ids for a trainable embedding); one name, or a table column -> name"})
    image_encoder: str | dict[str, str] = field(default="", metadata={
        "help": "image columns -> frozen features: '' (keep pixels [C, H, W]), mobilenet_v2 (1280-d, input "
                "image_size or 224), pixels:<s> (grey s*s); one name, or a table column -> name"})
    text_max_tokens: int = field(default=64, metadata={"help": "token ids per text cell with text_encoder "
                                                               "= 'tokens' (cut, padded with 0)"})
    text_vocab_size: int = field(default=0, metadata={
        "help": "'tokens': keep this many ids (pad, unk + the most frequent train tokens; 0 = all)"})
    max_length: int | dict[str, int] = field(default=0, metadata={
        "help": "pad (0) or cut array columns on their last axis to this length, writing length/<m> "
                "(0 = off: shapes must agree); one int, or a table column -> int"})
    pad: bool | list[str] = field(default=False, metadata={
        "help": "zero-pad variable-length array columns to their longest sequence and write length/<m>: true = "
                "every array column whose last axis varies, or a list of columns (max_length, when set, wins)"})
    length_column: str | dict[str, str] = field(default="", metadata={
        "help": "a column holding each row's valid length for already padded sequences: one column for every "
                "array column, or a table array column -> length column; written as length/<m>"})
    time_axis: Literal["last", "first"] = field(default="last", metadata={
        "help": "where time is in array values: 'last' ([C, T], the model's layout) or 'first' ([T, C], e.g. "
                "a table saved row per time step: moved to the last axis at load)"})
    truncate: Literal["end", "start"] = field(default="end", metadata={
        "help": "what max_length cuts from a longer sequence: 'end' keeps the first steps, 'start' the last"})
    normalize: bool | str | list[str] = field(default="auto", metadata={
        "help": "z-score with train-split mean/std (present rows only): 'auto' = every column but token ids "
                "(frozen text features included), true = every array, image and audio column, false = none, "
                "or a list of columns; per feature for [d], per channel for [C, ...]"})
    missing: Literal["allow", "error"] = field(default="allow", metadata={
        "help": "an empty modality cell or one naming a missing file: 'allow' (zeros + present/<m> = False, one "
                "line per modality at load) or 'error'; a row with no modality at all is left out"})
    unlabelled: Literal["drop", "error"] = field(default="drop", metadata={
        "help": "a train/test row with an empty label: 'drop' (left out, counted in one line; no algorithm here "
                "trains on unlabelled rows yet) or 'error'"})
    label_type: Literal["auto", "class"] = field(default="auto", metadata={
        "help": "'auto' refuses a label column that is not classes (fractional numbers, numbers and names "
                "mixed, numbers distinct on more than half the rows); 'class' takes every value as a class"})

    def __post_init__(self):
        if not self.root:
            raise ConfigError("data.root: required for manifest (the directory holding the manifest)")
        check_fraction(self.test_fraction)
        for key in ("image_size", "audio_sample_rate", "text_vocab_size"):
            if getattr(self, key) < 0:
                raise ConfigError(f"data.{key}: must be >= 0, got {getattr(self, key)}")
        if 0 < self.text_vocab_size < 3:
            raise ConfigError(f"data.text_vocab_size: must be 0 (all) or >= 3, got {self.text_vocab_size}")
        for key in ("audio_length", "text_max_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key}: must be >= 1, got {getattr(self, key)}")
        for key, allowed in (("image_mode", ("L", "RGB")), ("time_axis", ("last", "first")),
                             ("truncate", ("end", "start")), ("missing", ("allow", "error")),
                             ("unlabelled", ("drop", "error")), ("label_type", LABEL_TYPES)):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"data.{key}: must be {' or '.join(map(repr, allowed))}, got {getattr(self, key)!r}")
        if isinstance(self.text_encoder, dict):
            self.text_encoder = {k: check_text_encoder(v, f"data.text_encoder.{k}")
                                 for k, v in self.text_encoder.items()}
        else:
            self.text_encoder = check_text_encoder(self.text_encoder, "data.text_encoder")
        from mmfl.data.featurize import parse_image_encoder

        for k, v in (self.image_encoder.items() if isinstance(self.image_encoder, dict) else [("", self.image_encoder)]):
            if not isinstance(v, str):
                raise ConfigError(f"data.image_encoder{'.' + k if k else ''}: expected a name, got {v!r}")
            if v:
                parse_image_encoder(v, f"data.image_encoder{'.' + k if k else ''}")
        lengths = self.max_length if isinstance(self.max_length, dict) else {"": self.max_length}
        for k, v in lengths.items():
            key = f"data.max_length.{k}" if k else "data.max_length"
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{key}: must be an integer >= 0 (0 = no padding), got {v!r}")
        if not isinstance(self.pad, bool) and not (isinstance(self.pad, list) and all(isinstance(m, str) for m in self.pad)):
            raise ConfigError(f"data.pad: expected true/false or a list of column names, got {self.pad!r}")
        cols = self.length_column.values() if isinstance(self.length_column, dict) else [self.length_column]
        if not all(isinstance(c, str) for c in cols):
            raise ConfigError(f"data.length_column: expected a column name or a table column -> column, "
                              f"got {self.length_column!r}")
        if isinstance(self.normalize, str) and self.normalize != "auto" or (
                isinstance(self.normalize, list) and not all(isinstance(m, str) for m in self.normalize)):
            raise ConfigError(f"data.normalize: expected \"auto\", true/false or a list of column names, "
                              f"got {self.normalize!r}")
        if not isinstance(self.classes, list) or len(set(map(str, self.classes))) != len(self.classes):
            raise ConfigError(f"data.classes: expected a list of distinct labels, got {self.classes!r}")
        self.classes = [str(c).strip() for c in self.classes]
        names = list(self.rename.values())
        if not all(isinstance(v, str) and v.strip() for v in names) or len(set(names)) != len(names):
            raise ConfigError(f"data.rename: expected a table column -> distinct modality names, got {self.rename!r}")




@DATASETS.register("manifest", ManifestParams,
                   help="your own data: a manifest.csv/.jsonl of labels, modality files or inline values")
def load_manifest(p: ManifestParams) -> DatasetBundle:
    """Read ``root/manifest`` and its files into a bundle (see the module docstring for the format)."""
    root = Path(p.root).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: manifest root directory not found")
    mpath = Path(p.manifest).expanduser()
    mpath = mpath if mpath.is_absolute() else root / mpath
    cols, rows = read_rows(mpath)
    if not rows:
        raise DataError(f"{mpath}: no rows")
    if p.label_column not in cols:
        raise DataError(f"{mpath}: no label column {p.label_column!r} (columns: {', '.join(cols)})")
    length_cols = set(p.length_column.values()) if isinstance(p.length_column, dict) else {p.length_column} - {""}
    special = {p.label_column, p.client_column, p.split_column, *length_cols}
    mods = list(p.modalities) or [c for c in cols if c not in special]
    if not mods:
        raise DataError(f"{mpath}: no modality columns (columns: {', '.join(cols)})")
    for m in mods:
        if m not in cols or m in special:
            raise DataError(f"{mpath}: {m!r} is not a modality column (columns: {', '.join(cols)})")

    numbers = np.arange(1, len(rows) + 1)  # the manifest's row numbers of the rows kept

    def where(n: int | None, col: str) -> str:
        return f"{mpath}: row {numbers[n - 1]}, column {col!r}" if n is not None else f"{mpath}: column {col!r}"

    if p.missing == "error":
        refuse_absent(rows, mods, root, where)
    public = np.array([p.split_column in cols and str(r.get(p.split_column) or "").strip().lower() == "public"
                       for r in rows], dtype=bool)
    labelled = np.array([not empty(r.get(p.label_column)) for r in rows], dtype=bool)
    keep = rows_to_keep(rows, absent_cells(rows, mods, root)[0], labelled, public, p, where)
    if not len(keep):
        raise DataError(f"{mpath}: no rows left (every row lacks a label or every modality)")
    rows, numbers = [rows[i] for i in keep], numbers[keep]
    absent, missing_files = absent_cells(rows, mods, root)
    labels_raw = [r.get(p.label_column) for r in rows]
    check_label_column(labels_raw, np.flatnonzero(~public[keep]), p.label_type, p.label_column, where, numbers)
    split = split_rows(rows, cols, p, labels_raw, where)
    for n, row in enumerate(rows, 1):  # (every kept train/test row has a label: rows_to_keep)
        if p.client_column in cols and split[n - 1] == "train" and empty(row.get(p.client_column)):
            raise DataError(f"{where(n, p.client_column)}: empty cell (every train row needs a {p.client_column})")
    known = np.flatnonzero(split != "public")
    try:
        labels, class_names = label_ids(labels_raw, list(known), p.classes)
    except ValueError as e:
        i, lab = e.args[0]
        raise DataError(f"{where(i + 1, p.label_column)}: label {lab!r} is not in data.classes "
                        f"({', '.join(p.classes)})") from None

    present = {m: ~absent[:, j] for j, m in enumerate(mods)}
    idx = {s: np.flatnonzero(split == s) for s in SPLITS}
    check_presence(present, idx, missing_files, p.rename, mpath)
    values, kinds, states = _read_columns(rows, mods, root, p, where, present)
    feats, info = _encode_columns(values, kinds, mods, idx["train"], p, where, present, numbers)
    length_columns(rows, cols, feats, kinds, mods, p, where, present)
    info = {"source": str(mpath), "kinds": kinds, "modality_info": states, **info,
            "label_map": {n: i for i, n in enumerate(class_names)}}
    standardize(feats, kinds, mods, idx["train"], p, info, present)
    for m in mods:
        if not present[m].all():
            feats[PRESENT + m] = torch.from_numpy(present[m].copy())

    if p.rename:
        feats, mods, info = rename_columns(feats, mods, info, p.rename)
    y = torch.from_numpy(labels)

    def subset(s: str) -> ArrayDataset:  # present/<m> only in a split where some row lacks m
        rows_s = torch.from_numpy(idx[s])
        out = {k: t[rows_s] for k, t in feats.items()}
        return ArrayDataset({k: t for k, t in out.items() if not k.startswith(PRESENT) or not bool(t.all())},
                            y[rows_s])

    client_ids = None
    if p.client_column in cols:
        keys = [str(rows[i][p.client_column]).strip() for i in idx["train"]]
        numeric = all(INTEGER.fullmatch(k) for k in keys)
        names = sorted(set(keys), key=(lambda k: int(k)) if numeric else None)
        index = {k: i for i, k in enumerate(names)}
        client_ids = torch.tensor([index[k] for k in keys], dtype=torch.int64)
        info["client_names"] = names
    meta = DatasetMeta(name="manifest", num_classes=len(class_names),
                       modalities={m: tuple(feats[m].shape[1:]) for m in mods},
                       class_names=class_names, info=info)
    public = subset("public") if len(idx["public"]) else None
    return DatasetBundle(train=subset("train"), test=subset("test"), meta=meta, client_ids=client_ids,
                         public=public)


def _read_columns(rows, mods, root, p, where, present) -> tuple[dict[str, list], dict[str, str], dict[str, dict]]:
    """Every present modality cell read and checked: (values per column, None where absent; kind
    per column; reader states)."""
    states: dict[str, dict] = {}
    values: dict[str, list] = {m: [] for m in mods}
    kinds: dict[str, str] = {}
    as_text = {m: any(is_inline_text(r.get(m)) for r in rows) for m in mods}
    for n, row in enumerate(rows, 1):
        for m in mods:
            cell = row.get(m)
            if not present[m][n - 1]:
                values[m].append(None)
                continue
            try:
                kind, val = read_cell(cell, root, p, states, m, as_text[m])
            except DataError as e:
                raise DataError(f"{where(n, m)}: {e}") from None
            first = kinds.setdefault(m, kind)
            if kind != first:
                raise DataError(f"{where(n, m)}: a {kind} value, but earlier rows hold {first} values")
            values[m].append(val)
    return values, kinds, states


def _encode_columns(values, kinds, mods, train_idx, p, where, present, numbers) -> tuple[dict[str, torch.Tensor], dict]:
    """Columns -> stacked tensors (+ ``length/<m>``) and their meta.info entries. Only present cells
    are encoded (a frozen encoder never sees an absent one); absent rows are zeros (length 1)."""
    text_cols = [m for m in mods if kinds[m] == "text"]
    array_cols = [m for m in mods if kinds[m] == "array"]
    encoders = column_encoders(p.text_encoder, text_cols)
    max_len = per_column(p.max_length, 0, array_cols, "data.max_length")
    padded = array_cols if p.pad is True else list(p.pad or [])
    for m in padded:
        if m not in array_cols:
            raise ConfigError(f"data.pad: {m!r} is not an array column of the manifest "
                              f"(array columns: {', '.join(array_cols) or 'none'})")
        last = {v.shape[-1] if v.ndim else 0 for v in values[m] if v is not None}  # time last ([T, C]: time_axis)
        if p.time_axis == "first":
            last = {v.shape[0] if v.ndim else 0 for v in values[m] if v is not None}
        if not max_len.get(m) and len(last) > 1:  # pad to the longest sequence
            max_len[m] = max(last)
    feats: dict[str, torch.Tensor] = {}
    image_cols = [m for m in mods if kinds[m] == "image"]
    image_enc = per_column(p.image_encoder, "", image_cols, "data.image_encoder")
    info: dict[str, Any] = {"text_encoder": encoders, "image_encoder": {}, "vocab": {}, "token_vocab_size": {},
                            "max_length": {m: L for m, L in max_len.items() if L}}
    n = len(next(iter(values.values())))
    for m in mods:
        have = np.flatnonzero(present[m])  # the rows holding m; positions below are within them
        pos = {int(r): i for i, r in enumerate(have)}
        train_have = np.array([pos[int(r)] for r in train_idx if int(r) in pos], dtype=np.int64)
        first = int(numbers[have[0]])

        def at(i, col, have=have):  # position i (1-based) among the present rows -> its manifest row
            return where(None if i is None else int(have[i - 1]) + 1, col)

        vals = [values[m][r] for r in have]
        if kinds[m] == "text":
            x, lengths, extra = encode_column(vals, train_have, encoders[m], p.text_max_tokens,
                                              p.text_vocab_size)
            if "vocab" in extra:
                info["vocab"][m] = extra["vocab"]
                info["token_vocab_size"][m] = len(extra["vocab"])
        else:
            if kinds[m] == "array" and p.time_axis == "first":  # [T, C, ...] -> [C, ..., T]
                vals = [np.moveaxis(v, 0, -1) if v.ndim > 1 else v for v in vals]
            if kinds[m] == "array" and max_len.get(m, 0):  # a sequence of scalars [T] is one channel [1, T]
                vals = [v[None] if v.ndim == 1 else v for v in vals]
            x, lengths = stack_column(vals, max_len.get(m, 0), p.truncate, kinds[m], m, at, first_row=f"row {first}")
            if kinds[m] == "image" and image_enc.get(m):
                x = _image_features(x, image_enc[m], p.image_size)
                info["image_encoder"][m] = image_enc[m]
        feats[m] = fill(x, have, n)
        if lengths is not None:
            feats[LENGTH + m] = fill_lengths(lengths, have, n)
    info = {k: v for k, v in info.items() if v or k == "vocab"}
    return feats, info


def _image_features(x: torch.Tensor, encoder: str, image_size: int) -> torch.Tensor:
    """Images float ``[N, C, H, W]`` in [0, 1] -> frozen features ``[N, d]`` (:func:`mmfl.data.featurize.
    image_features`, cached; MobileNetV2's input side is ``image_size``, or 224 when it is 0)."""
    from mmfl.data.featurize_image import image_features

    u8 = (x.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
    return image_features(u8, encoder, size=image_size or 224)
