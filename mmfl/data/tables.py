"""Parquet, Arrow and Hugging Face ``datasets`` folders as manifest rows.

:func:`read_rows` turns a table on disk into the ``(columns, rows)`` a manifest is made of
(:mod:`mmfl.data.manifest` maps them to modalities, labels, clients and splits), from:

- a Parquet file (``.parquet``, ``.pq``),
- an Arrow IPC file or stream (``.arrow``, ``.ipc``) or a Feather v2 file (``.feather``),
- a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``.

Cells become str / int / float / bool / None, lists of numbers (a 1-D list), numpy float32
arrays (a rectangular nested list or an ``ArrayND`` feature), or :class:`Blob` for binary media:

- an ``Image`` feature (``{"bytes", "path"}``), or a binary cell whose bytes start like a
  PNG/JPEG/GIF/BMP/WebP/TIFF -> ``Blob("image", bytes)``;
- an ``Audio`` feature, or a binary cell holding a WAV -> ``Blob("audio", bytes)`` (PCM WAV only;
  FLAC/MP3/OGG bytes are refused with a line saying so); a decoded ``{"array", "sampling_rate"}``
  cell is written into a 32-bit PCM WAV (float samples in [-1, 1] kept to ~5e-10);
- a binary cell holding a ``.npy`` -> its array.

Hugging Face features are read from the folder's ``dataset_info.json`` or from the schema
metadata that ``datasets`` writes into Parquet/Arrow files (``Dataset.to_parquet``): a
``ClassLabel`` column gives its class *names* (``-1``, no label, gives an empty cell). A
``DatasetDict`` folder adds a column :data:`SPLIT_COLUMN` holding each row's split name
(see :func:`split_value` for validation and other splits). pandas' index columns
(``__index_level_0__``) are dropped. Dates and times become ISO strings. Other nested types
(structs, maps, unions) and undecodable cells become :class:`Unreadable` cells: an error
naming the file, row and column if the manifest uses them, ignored otherwise. An image/audio
cell with no stored bytes whose file is gone becomes :class:`MissingFile`, and a None cell
stays None: the manifest takes both as a missing modality for that row (``data.missing``).

``datasets`` is imported only for folders, with ``HF_DATASETS_OFFLINE=1`` and
``HF_HUB_OFFLINE=1``: nothing is downloaded. pyarrow is imported on first use.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from mmfl.errors import DataError

PARQUET = (".parquet", ".pq")
ARROW = (".arrow", ".ipc", ".feather")
SUFFIXES = PARQUET + ARROW
SPLIT_COLUMN = "split"
TEST_ALIASES = ("validation", "valid", "val", "dev", "eval", "evaluation")
KEPT_SPLITS = ("train", "test", "public")
_PANDAS_INDEX = re.compile(r"__index_level_\d+__")


@dataclass(frozen=True)
class Blob:
    """Encoded media in a table cell: ``kind`` "image" | "audio", ``data`` the file's bytes,
    ``name`` where it came from (the original file name if the table kept one) for messages."""

    kind: Literal["image", "audio"]
    data: bytes
    name: str = ""

    def __repr__(self) -> str:  # rows are printed in messages: never dump the bytes
        return f"Blob({self.kind!r}, {len(self.data)} bytes{', ' + self.name if self.name else ''})"


def is_table(path: Path) -> bool:
    """Whether :func:`read_rows` reads ``path`` (a table suffix, or a folder)."""
    return path.suffix.lower() in SUFFIXES or path.is_dir()


@dataclass(frozen=True)
class Unreadable:
    """A cell that cannot be used (an unsupported column type, undecodable bytes): ``reason`` says
    why. Reading a table never fails on it; the manifest raises ``reason`` if the cell is used."""

    reason: str


@dataclass(frozen=True)
class MissingFile:
    """An image/audio cell that stores no bytes and names a file that does not exist: the manifest
    takes it as a missing modality for that row (``data.missing``), like an empty cell."""

    path: str


def is_hf_folder(path: Path) -> bool:
    """Whether ``path`` looks like a ``save_to_disk`` folder (a Dataset or a DatasetDict)."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def read_rows(path: str | Path) -> tuple[list[str], list[dict[str, Any]]]:
    """A Parquet/Arrow/Feather file or a ``save_to_disk`` folder -> (columns in order, rows as dicts).

    Raises :class:`DataError` with one line naming the file (and column) for a missing, corrupt
    or truncated file, a folder that is not a ``datasets`` folder, or a column of an unsupported type.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        return _read_hf_folder(path)
    if not path.is_file():
        raise DataError(f"{path}: table not found")
    table = _read_table(path)
    return _to_rows(table, _hf_features(table.schema), path)


# ---------------------------------------------------------------- files

def _read_table(path: Path):
    import pyarrow as pa

    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise DataError(f"{path}: not a table file (suffixes: {' '.join(SUFFIXES)})")
    what = "Parquet" if suffix in PARQUET else "Arrow/Feather"
    try:
        if suffix in PARQUET:
            import pyarrow.parquet as pq

            return pq.read_table(path)
        if suffix == ".feather":
            import pyarrow.feather as feather

            return feather.read_table(path, memory_map=False)
        with pa.memory_map(str(path), "r") as src:  # IPC file format, else stream format (datasets' .arrow)
            try:
                return pa.ipc.open_file(src).read_all()
            except pa.ArrowInvalid:
                src.seek(0)
                return pa.ipc.open_stream(src).read_all()
    except (pa.ArrowException, OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable {what} file ({_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _hf_features(schema) -> dict:
    """The ``datasets`` features stored in a Parquet/Arrow schema's metadata ({} if none)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        return json.loads(raw).get("info", {}).get("features", {}) or {}
    except (ValueError, AttributeError):
        return {}


# ---------------------------------------------------------------- Hugging Face folders

def _read_hf_folder(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    if (path / "dataset_dict.json").is_file():
        try:
            splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{path / 'dataset_dict.json'}: not a DatasetDict description ({e})") from None
        parts = {s: _load_split(path / s) for s in splits}
        return _join_splits(path, parts)
    if not (path / "state.json").is_file():
        raise DataError(f"{path}: not a Hugging Face datasets folder (no dataset_dict.json or state.json: "
                        "write it with Dataset.save_to_disk / DatasetDict.save_to_disk)")
    table, features = _load_split(path)
    return _to_rows(table, features, path)


def _load_split(path: Path):
    """One ``Dataset.save_to_disk`` folder -> (pyarrow table, features as JSON-like dict)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path}: reading a Hugging Face datasets folder needs the datasets package "
                        "(pip install 'mmfl[hf]')") from None
    if not (path / "state.json").is_file():
        raise DataError(f"{path}: not a Hugging Face datasets folder (no state.json)")
    try:
        ds = datasets.load_from_disk(str(path), keep_in_memory=False)
    except Exception as e:  # noqa: BLE001 - any failure to open the folder is a data problem
        raise DataError(f"{path}: cannot read the datasets folder ({_first_line(e)})") from None
    if not isinstance(ds, datasets.Dataset):
        raise DataError(f"{path}: expected one split (a Dataset), found {type(ds).__name__}")
    return ds.data.table, json.loads(json.dumps(ds.features.to_dict(), default=list))


def split_value(name: str, splits: list[str]) -> str | None:
    """The manifest split of a ``DatasetDict`` split named ``name`` (None: its rows are left out).

    ``train``, ``test`` and ``public`` keep their names (case-insensitive). A validation split
    (``validation``, ``valid``, ``val``, ``dev``, ``eval``) is the test split when the folder has no
    ``test`` split, and is left out otherwise (mmfl does no model selection). Other splits
    (e.g. ``unsupervised``) are left out.
    """
    low = name.lower()
    if low in KEPT_SPLITS:
        return low
    if low in TEST_ALIASES and "test" not in {s.lower() for s in splits}:
        first = next(s for s in splits if s.lower() in TEST_ALIASES)
        return "test" if name == first else None
    return None


def _join_splits(path: Path, parts: dict) -> tuple[list[str], list[dict[str, Any]]]:
    cols: dict[str, None] = {}
    rows: list[dict[str, Any]] = []
    names = list(parts)
    left_out = []
    for name, (table, features) in parts.items():
        value = split_value(name, names)
        if value is None:
            left_out.append(f"{name} ({table.num_rows} rows)")
            continue
        c, r = _to_rows(table, features, path / name)
        if SPLIT_COLUMN in c:
            raise DataError(f"{path / name}: has a column {SPLIT_COLUMN!r}, which a DatasetDict's split "
                            "names fill: rename it")
        for row in r:
            row[SPLIT_COLUMN] = value
        cols.update(dict.fromkeys(c))
        rows.extend(r)
    if left_out:
        print(f"mmfl: note: {path}: split(s) {', '.join(left_out)} left out (kept: train, test, public; "
              "validation is the test split only when there is no test split)", file=sys.stderr)
    if rows and all(r[SPLIT_COLUMN] == "train" for r in rows):
        for r in rows:  # train only: no split column, the manifest draws a stratified test split
            del r[SPLIT_COLUMN]
        return list(cols), rows
    return [*cols, SPLIT_COLUMN], rows


# ---------------------------------------------------------------- cells

def _to_rows(table, features: dict, source: Path) -> tuple[list[str], list[dict[str, Any]]]:
    index_cols = set()
    try:
        pandas_meta = json.loads((table.schema.metadata or {}).get(b"pandas", b"{}"))
        index_cols = {c for c in pandas_meta.get("index_columns", []) if isinstance(c, str)}
    except ValueError:
        pass
    names = [n for n in table.column_names if n not in index_cols and not _PANDAS_INDEX.fullmatch(n)]
    columns = {}
    for n in names:
        try:
            columns[n] = _column_values(table.column(n), features.get(n) or {}, source)
        except DataError as e:  # an error only if the column is used (a modality, the label, ...)
            columns[n] = [Unreadable(f"{e} (leave the column out of data.modalities)")] * table.num_rows
    rows = [dict(zip(names, cells)) for cells in zip(*(columns[n] for n in names))] if names else []
    return names, rows


def _column_values(col, feature: dict, source: Path) -> list[Any]:
    import pyarrow as pa

    typ = col.type
    if isinstance(typ, pa.ExtensionType):  # datasets' ArrayND and other extension types: their storage
        col = pa.chunked_array([c.storage for c in col.chunks], type=typ.storage_type)
        typ = typ.storage_type
    ftype = feature.get("_type")
    values = col.to_pylist()
    if ftype == "ClassLabel" and feature.get("names"):
        names = feature["names"]
        return [names[v] if isinstance(v, int) and 0 <= v < len(names) else None for v in values]
    if ftype in ("Image", "Audio"):
        return [_cell(_media, v, ftype.lower(), source) for v in values]
    if pa.types.is_struct(typ):
        fields = {typ.field(i).name for i in range(typ.num_fields)}
        if {"bytes", "path"} <= fields:
            return [_cell(_media, v, None, source) for v in values]
        if {"array", "sampling_rate"} <= fields:
            return [_cell(_decoded_audio, v) for v in values]
        raise DataError(f"unsupported column type {typ} (a struct that is neither an image/audio "
                        "{bytes, path} nor a decoded audio {array, sampling_rate})")
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ) \
            or getattr(pa.types, "is_binary_view", lambda t: False)(typ):
        return [_cell(_media, v, None, source) for v in values]
    if _is_list(typ):
        return [_numbers(v) for v in values]
    if pa.types.is_decimal(typ):
        return [None if v is None else float(v) for v in values]
    if pa.types.is_temporal(typ):
        return [None if v is None else (v.isoformat() if hasattr(v, "isoformat") else str(v)) for v in values]
    if (pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_boolean(typ)
            or pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_null(typ)
            or pa.types.is_dictionary(typ) or getattr(pa.types, "is_string_view", lambda t: False)(typ)):
        return [float(v) if isinstance(v, np.floating) else v for v in values]  # float16 comes as numpy
    raise DataError(f"unsupported column type {typ}")


def _is_list(typ) -> bool:
    import pyarrow as pa

    return (pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
            or getattr(pa.types, "is_list_view", lambda t: False)(typ)
            or getattr(pa.types, "is_large_list_view", lambda t: False)(typ))


def _numbers(v: Any) -> Any:
    """A list cell: 1-D stays a list; a rectangular nested list of numbers -> float32 array."""
    if v is None or not v or not isinstance(v[0], list):
        return v
    try:
        arr = np.asarray(v, dtype=np.float32)
    except (ValueError, TypeError):
        return v  # ragged or not numbers: left as nested lists
    return arr if arr.dtype != object else v


_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*")
_AUDIO_OTHER = {b"fLaC": "FLAC", b"OggS": "Ogg", b"ID3": "MP3", b"\xff\xfb": "MP3", b"\xff\xf3": "MP3"}


def sniff(data: bytes) -> str | None:
    """"image", "audio" (a WAV), "npy" or None from a file's first bytes."""
    if data.startswith(_IMAGE_MAGIC) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP"):
        return "image"
    if data[:4] in (b"RIFF", b"RIFX") and data[8:12] == b"WAVE":
        return "audio"
    if data.startswith(b"\x93NUMPY"):
        return "npy"
    return None


def _media(v: Any, kind: str | None, source: Path) -> Any:
    """A ``{"bytes", "path"}`` dict or raw bytes -> :class:`Blob` (or an array for ``.npy`` bytes)."""
    if v is None:
        return None
    name = ""
    if isinstance(v, dict):
        data, name = v.get("bytes"), v.get("path") or ""
        if data is None and name:
            file = Path(name).expanduser()
            file = file if file.is_absolute() else Path(source if source.is_dir() else source.parent) / file
            if not file.is_file():  # a missing modality for this row (data.missing decides)
                return MissingFile(str(file))
            data = file.read_bytes()
        if data is None:
            return None
    else:
        data = v
    found = sniff(data)
    if found == "npy" and kind is None:
        try:
            return np.asarray(np.load(io.BytesIO(data), allow_pickle=False), dtype=np.float32)
        except (ValueError, OSError) as e:
            raise DataError(f"corrupt .npy bytes ({_first_line(e)})") from None
    other = next((f for m, f in _AUDIO_OTHER.items() if data.startswith(m)), None)
    if kind == "audio" or (kind is None and (found == "audio" or other)):
        if found != "audio":
            fmt = other or "not WAV"
            raise DataError(f"audio bytes are {fmt}; mmfl reads PCM WAV only (re-encode the audio as WAV)")
        return Blob("audio", data, name)
    if kind == "image" or found == "image":
        return Blob("image", data, name)
    raise DataError(f"binary cell{' ' + repr(name) if name else ''} is not an image (PNG/JPEG/GIF/BMP/WebP/TIFF), "
                    "a WAV or a .npy")


def _cell(fn, v: Any, *args) -> Any:
    """``fn(v, *args)``, or an :class:`Unreadable` cell saying why not."""
    try:
        return fn(v, *args)
    except DataError as e:
        return Unreadable(str(e))


def _decoded_audio(v: Any) -> Blob | None:
    return None if v is None else Blob("audio", _wav_bytes(v["array"], v["sampling_rate"]), v.get("path") or "")


def _wav_bytes(array: Any, rate: Any) -> bytes:
    """Decoded audio (float samples in [-1, 1], ``[n]`` or ``[n, channels]``) -> 32-bit PCM WAV bytes."""
    x = np.asarray(array, dtype=np.float64)
    if x.ndim == 2 and x.shape[0] < x.shape[1] and x.shape[0] <= 8:
        x = x.T  # [channels, n] -> [n, channels]
    if x.ndim not in (1, 2) or not rate or int(rate) <= 0:
        raise DataError(f"decoded audio needs a 1-D or 2-D array and a sampling_rate > 0, got shape "
                        f"{x.shape} and rate {rate!r}")
    channels = 1 if x.ndim == 1 else x.shape[1]
    pcm = np.clip(np.round(x * 2.0 ** 31), -(2 ** 31), 2 ** 31 - 1).astype("<i4")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(4)
        w.setframerate(int(rate))
        w.writeframes(pcm.tobytes())
    return buf.getvalue()
