"""Reading and checking one manifest cell, and fitting sequences to a length.

A cell is a file path (read by extension, :data:`EXTENSIONS` -> :data:`READERS`) or an
inline value (a number, a list of numbers, possibly nested, a numeric numpy array, or a
text string). Every reader checks what it returns: arrays must be non-empty and finite,
text files non-empty UTF-8. Problems raise :class:`~mmfl.errors.DataError` naming the file
(the caller adds the manifest row and column).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from mmfl.data.audio import read_wav as read_wav_any
from mmfl.errors import DataError

# ---- readers: fn(path, params, state) -> np.ndarray | str; `state` is per-column (ends up in meta.info)


def read_image(path: Path, p, state: dict) -> np.ndarray:
    """Image file -> float32 ``[C, H, W]`` in [0, 1] (C = 1 for L, 3 for RGB); transparent pixels
    (RGBA, LA, palette transparency) are composited on white, as the emoji loader does."""
    from PIL import Image

    with Image.open(path) as img:
        img.load()
        if img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info:
            rgba = img.convert("RGBA")
            img = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
        img = img.convert(p.image_mode)
        if p.image_size:
            img = img.resize((p.image_size, p.image_size), Image.BILINEAR)
        arr = np.asarray(img, dtype=np.float32) / 255.0
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1).copy()


def read_wav(path: Path, p, state: dict) -> np.ndarray:
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


def read_text(path: Path, p, state: dict) -> str:
    """A UTF-8 text file -> its text; empty (or whitespace-only) and binary files are errors."""
    raw = path.read_bytes()
    if b"\x00" in raw:
        raise DataError(f"{path}: a binary file, not text (NUL bytes)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r}); "
                        "convert it to UTF-8") from None
    if not text.strip():
        raise DataError(f"{path}: empty text file")
    return text


def read_npy(path: Path, p, state: dict) -> np.ndarray:
    """A ``.npy`` file of numbers -> float32 in the stored shape (no pickles)."""
    arr = np.load(path, allow_pickle=False)
    if arr.dtype.kind not in "biuf":
        raise DataError(f"{path}: dtype {arr.dtype} is not numeric")
    return check_array(np.asarray(arr, dtype=np.float32), str(path))


def read_table(path: Path, p, state: dict) -> np.ndarray:
    """A numeric ``.csv`` / ``.tsv`` file (rows = time steps, columns = channels; an optional
    header row) -> float32 ``[C, T]`` (one column: ``[T]``)."""
    delim = "\t" if path.suffix.lower() == ".tsv" else ","
    lines = [ln for ln in path.read_text(encoding="utf-8-sig").splitlines() if ln.strip()]
    if lines and not all(_NUM.fullmatch(c.strip()) for c in lines[0].split(delim)):
        lines = lines[1:]  # a header
    rows = []
    for n, ln in enumerate(lines, 1):
        cells = [c.strip() for c in ln.split(delim)]
        if not all(_NUM.fullmatch(c) for c in cells):
            raise DataError(f"{path}: data line {n}: not all numbers ({ln[:60]!r})")
        rows.append([float(c) for c in cells])
    if rows and len({len(r) for r in rows}) > 1:
        raise DataError(f"{path}: lines have different numbers of columns")
    arr = np.array(rows, dtype=np.float32).T
    return check_array(arr[0] if len(arr) == 1 else arr, str(path))


READERS: dict[str, Callable[[Path, Any, dict], Any]] = {
    "image": read_image, "audio": read_wav, "text": read_text, "array": read_npy, "table": read_table,
}
EXTENSIONS: dict[str, str] = {
    ".png": "image", ".jpg": "image", ".jpeg": "image", ".bmp": "image", ".gif": "image",
    ".wav": "audio", ".txt": "text", ".npy": "array", ".csv": "table", ".tsv": "table",
}
KIND_OF = {"table": "array"}  # readers whose values are of another kind

# a number, with nan / inf accepted so that they reach the finiteness check instead of becoming text
_NUM = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|infinity)", re.IGNORECASE)


def check_array(arr: np.ndarray, what: str) -> np.ndarray:
    """``arr`` unchanged if non-empty and finite; else a DataError naming ``what`` and the first bad index."""
    if arr.size == 0:
        raise DataError(f"{what}: empty array (shape {tuple(arr.shape)})")
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        where = idx[0] if len(idx) == 1 else idx
        raise DataError(f"{what}: non-finite value {arr[idx]} at index {where} "
                        f"({int(bad.sum())} of {arr.size} values are NaN/inf)")
    return arr


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def inline_numbers(cell: Any) -> np.ndarray | None:
    """A number, a (nested) list of numbers, a numeric numpy array or a string of numbers
    (JSON list, or space/semicolon separated) -> float32 array (``[d]`` for flat values);
    None if ``cell`` is not one. Ragged nested lists are a DataError."""
    if _is_number(cell):
        return np.array([cell], dtype=np.float32)
    if isinstance(cell, np.ndarray):
        return np.asarray(cell, dtype=np.float32) if cell.dtype.kind in "biuf" and cell.size else None
    if isinstance(cell, (list, tuple)):
        if not cell or not all(_is_number(v) or isinstance(v, (list, tuple)) for v in cell):
            return None
        if all(_is_number(v) for v in cell):
            return np.array(cell, dtype=np.float32)
        try:
            return np.array(cell, dtype=np.float32)
        except (ValueError, TypeError):
            raise DataError("a ragged nested list (inner lists of different lengths)") from None
    if not isinstance(cell, str):
        return None
    s = cell.strip()
    if s.startswith("[") and s.endswith("]"):
        try:
            return inline_numbers(json.loads(s))
        except json.JSONDecodeError:
            return None
    parts = [t for t in re.split(r"[;\s]+", s) if t]
    if parts and all(_NUM.fullmatch(t) for t in parts):
        return np.array([float(t) for t in parts], dtype=np.float32)
    return None


def file_kind(cell: Any) -> str | None:
    """The reader kind of a file-path cell (by extension), None for an inline value."""
    return EXTENSIONS.get(Path(cell.strip()).suffix.lower()) if isinstance(cell, str) else None


def _is_file(root: Path, s: str) -> bool:
    try:
        return (root / Path(s).expanduser()).is_file()
    except (OSError, ValueError):
        return False


def read_cell(cell: Any, root: Path, p, states: dict, col: str, as_text: bool = False) -> tuple[str, Any]:
    """One modality cell -> (kind, value); raises DataError naming the problem (caller adds row).

    ``as_text``: the column holds inline text somewhere, so inline numbers are text too.
    A :class:`~mmfl.data.tables.Blob` (media bytes from a Parquet/Arrow/datasets table) is decoded
    by the same reader as a file of its kind; a numpy array (a table's nested list) is an array.
    """
    from mmfl.data.tables import Blob, Unreadable

    if isinstance(cell, Unreadable):
        raise DataError(cell.reason)
    if isinstance(cell, Blob):
        try:
            return cell.kind, READERS[cell.kind](io.BytesIO(cell.data), p, states.setdefault(col, {}))
        except Exception as e:  # noqa: BLE001 - any decoder failure is a data problem
            raise DataError(f"cannot read {cell.name or 'the stored bytes'} as {cell.kind}: {e}") from None
    if isinstance(cell, np.ndarray):
        return "array", check_array(np.asarray(cell, dtype=np.float32), "table value")
    if isinstance(cell, str):
        kind = file_kind(cell)
        if kind is not None:
            path = Path(cell.strip()).expanduser()
            path = path if path.is_absolute() else root / path
            if not path.is_file():
                raise DataError(f"file not found: {path}")
            if path.stat().st_size == 0:
                raise DataError(f"{path}: empty file (0 bytes); leave the cell empty to mark the modality "
                                "missing for this row")
            try:
                return KIND_OF.get(kind, kind), READERS[kind](path, p, states.setdefault(col, {}))
            except DataError as e:
                if str(path) in str(e):
                    raise
                raise DataError(f"{path}: {e}") from None
            except Exception as e:  # noqa: BLE001 - any decoder failure is a data problem
                raise DataError(f"cannot read {path} as {kind}: {e}") from None
        s = cell.strip()
        if Path(s).suffix and not any(ch.isspace() for ch in s) and _is_file(root, s):  # not text: a file
            raise DataError(f"{s}: unsupported file type {Path(s).suffix!r} "
                            f"(known: {', '.join(sorted(EXTENSIONS))})")
    vec = None if as_text else inline_numbers(cell)
    if vec is not None:
        return "array", check_array(vec, "inline value")
    if isinstance(cell, str) or (as_text and _is_number(cell)):
        return "text", str(cell)
    raise DataError(f"unsupported value {cell!r}")


def is_inline_text(cell: Any) -> bool:
    """A non-empty string that is neither a file path nor numbers."""
    if not isinstance(cell, str) or not cell.strip() or file_kind(cell) is not None:
        return False
    try:
        return inline_numbers(cell) is None
    except DataError:
        return False


# ---- sequences

def fit_length(x: np.ndarray, length: int, truncate: str = "end") -> tuple[np.ndarray, int]:
    """Zero-pad or cut ``x`` ``[..., T]`` on its last axis to ``length``: (``[..., length]``, valid length).

    ``truncate = "end"`` keeps the first ``length`` steps, ``"start"`` the last ones.
    """
    t = x.shape[-1]
    if t >= length:
        return (x[..., :length] if truncate == "end" else x[..., t - length:]).copy(), length
    out = np.zeros(x.shape[:-1] + (length,), dtype=x.dtype)
    out[..., :t] = x
    return out, t


def valid_mask(shape: tuple[int, ...], lengths) -> torch.Tensor | None:
    """bool ``shape`` (``[N, ..., T]``): True where the last-axis position is below the row's
    length (``lengths`` int64 ``[N]``); None if ``lengths`` is None."""
    if lengths is None:
        return None
    t = torch.arange(shape[-1])
    mask = t.view(*([1] * (len(shape) - 1)), -1) < lengths.view(-1, *([1] * (len(shape) - 1)))
    return mask.expand(shape)


def zscore_stats(x, lengths=None) -> tuple:
    """Mean and std of ``x`` ``[N, *shape]`` for a z-score, from valid positions only.

    ``[N, d]`` (or ``[N]``): per feature, each ``[d]``. ``[N, C, ...]``: per channel (the
    first axis after N), pooled over rows and the remaining axes (time steps, pixels),
    each ``[C, 1, ...]``; padded steps (last axis >= the row's ``lengths``) are left out.
    A std below 1e-8 (a constant feature) is taken as 1.
    """
    x = x.double()
    if x.dim() <= 2:
        mean, std = x.mean(0), x.std(0, unbiased=False)
    else:
        mask = valid_mask(tuple(x.shape), lengths)
        w = torch.ones_like(x) if mask is None else mask.to(x.dtype)
        dims = [0] + list(range(2, x.dim()))
        n = w.sum(dims, keepdim=True).clamp(min=1)
        mean = (x * w).sum(dims, keepdim=True) / n
        std = (((x - mean) ** 2) * w).sum(dims, keepdim=True).div(n).sqrt()
        mean, std = mean[0], std[0]
    std = torch.where(std < 1e-8, torch.ones_like(std), std)
    return mean.float(), std.float()


def zscore(x, mean, std, lengths=None):
    """``(x - mean) / std`` with padded positions (see :func:`valid_mask`) kept at 0."""
    out = (x - mean) / std
    mask = valid_mask(tuple(x.shape), lengths)
    return out if mask is None else out * mask.to(out.dtype)
