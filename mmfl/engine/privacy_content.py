"""Matching a reply's content against a client's private rows, up to the transformations
a careless or dishonest client can apply without a model (:mod:`mmfl.engine.privacy`).

The unit of comparison is a **window**: ``W`` consecutive values of one sample
(flattened in C order; ``W = min(WINDOW, d)`` for a sample of ``d`` values). Every
window of every informative client row is indexed once per client (all offsets) by a
32-bit sign code: the signs of its projections on 32 fixed random directions whose
components sum to zero. So the code is unchanged by adding a constant (a shift), by a
positive scale, and nearly so by rounding (a dtype cast); a negative scale flips every bit
(looked up too). A reply is read as value streams (its values; its bytes read as other
dtypes), each stream both as it lies (flattened: stacks, rows shifted by any number of
values, concatenations, slices of a row) and, where its size is a multiple of ``d``, in
every layout of a ``[k, *sample_shape]`` stack with its axes permuted (transposes, swapped
axes). Blocks of ``W`` values of each reading are coded and looked up; a hit is verified:
the block's Pearson correlation with the client's window must be at least ``MIN_CORR`` in
absolute value over the block's whole aligned overlap with the sample, and both windows
must have ``MIN_VARIED`` values off their median (a window of zeros and one spike matches
too many things to mean anything).

Cost: the index, once per client and modality, is a sliding projection (``n * d * W * 32``
multiply-adds); a reply costs about ``32`` multiply-adds per value and per reading.
"""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import torch
from torch import Tensor

WINDOW = 32  # values per compared window: a contiguous slice of at least ~2 * WINDOW values of a row is found
BITS = 32  # sign bits per window code
MIN_CORR = 0.99  # |Pearson correlation| of a block with a client window that counts as a copy
MIN_VARIED = 4  # a window with fewer values off its median is never compared (near-constant, one spike)
BYTE_VIEWS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)  # dtypes the bytes are read as
_CHUNK = 1 << 22  # projections computed at a time (bounds memory)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _directions(w: int) -> np.ndarray:
    """``[w, BITS]`` fixed random directions, each summing to zero (shift-invariant codes)."""
    r = np.random.default_rng(0x6D6D666C + w).standard_normal((w, BITS))
    return r - r.mean(axis=0, keepdims=True)


def _pack(signs: np.ndarray) -> np.ndarray:
    """``[..., BITS]`` booleans -> uint32 codes."""
    return (signs.astype(np.uint64) << np.arange(BITS, dtype=np.uint64)).sum(-1).astype(np.uint32)


def _informative(blocks: np.ndarray) -> np.ndarray:
    """Mask of the rows of ``blocks`` ``[q, w]`` with at least ``MIN_VARIED`` values off
    their median (so at least two distinct values): low-bit images (a few gray levels)
    count, a blank border or a lone spike does not."""
    med = np.sort(blocks, axis=1)[:, blocks.shape[1] // 2]
    return (blocks != med[:, None]).sum(axis=1) >= min(MIN_VARIED, blocks.shape[1] // 2)


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two equal-length vectors (0 for a constant one)."""
    a = a - a.mean()
    b = b - b.mean()
    den = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / den if den > 0 else 0.0


class WindowIndex:
    """The coded windows of one client's rows ``[n, d]`` of one modality."""

    def __init__(self, rows: Tensor, row_ids: np.ndarray, shape: tuple[int, ...]):
        self.shape = shape
        self.size = d = math.prod(shape)
        self.w = w = min(WINDOW, d)
        self.row_ids = row_ids  # position in the client's view of each indexed row
        self.rows = np.nan_to_num(rows.detach().to("cpu", torch.float64).reshape(len(row_ids), d).numpy(),
                                  nan=0.0, posinf=0.0, neginf=0.0)
        per = d - w + 1
        self.codes = np.empty(len(row_ids) * per, dtype=np.uint32)
        if len(row_ids):
            filt = torch.from_numpy(_directions(w).T.copy()).to(torch.float64).unsqueeze(1)  # [BITS, 1, w]
            step = max(1, _CHUNK // (per * BITS))
            for s in range(0, len(row_ids), step):
                x = torch.from_numpy(self.rows[s:s + step]).unsqueeze(1)  # [b, 1, d]
                proj = torch.nn.functional.conv1d(x, filt)  # [b, BITS, per]
                self.codes[s * per:(s + len(x)) * per] = _pack((proj > 0).permute(0, 2, 1).numpy()).reshape(-1)
        keep = np.concatenate([_informative(np.lib.stride_tricks.sliding_window_view(row, w)) for row in self.rows]) \
            if len(row_ids) else np.zeros(0, bool)  # blank stretches (silence, borders) are never compared
        self.order = np.nonzero(keep)[0][np.argsort(self.codes[keep], kind="stable")]
        self.sorted = self.codes[self.order]
        del self.codes
        self.per = per

    def query_stride(self) -> int:
        """Stride of the blocks read from a stream so that every whole row (``d`` values)
        holds a block entirely."""
        return max(1, min(self.w, self.size - self.w + 1))

    def match(self, blocks: np.ndarray) -> list[tuple[int, int, int, float]]:
        """``(block index, indexed row, offset in it, correlation)`` of the blocks of ``blocks``
        ``[q, w]`` (float64) that copy a client window (the first 256, by block)."""
        if not len(self.sorted) or not len(blocks):
            return []
        blocks = np.nan_to_num(blocks, nan=0.0, posinf=0.0, neginf=0.0)
        informative = np.nonzero(_informative(blocks))[0]
        if not len(informative):
            return []
        b = blocks[informative]
        scale = np.abs(b).max(axis=1, keepdims=True)
        scale[scale == 0] = 1.0
        codes = _pack((b / scale) @ _directions(self.w) > 0)
        found = []
        for code_set in (codes, ~codes):  # a negative scale flips every sign
            lo = np.searchsorted(self.sorted, code_set, "left")
            hi = np.searchsorted(self.sorted, code_set, "right")
            hit = np.nonzero(hi > lo)[0]
            if not len(hit):
                continue
            counts = np.minimum(hi[hit] - lo[hit], 16)  # at most 16 client windows per code
            bi = np.repeat(hit, counts)
            within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            flat = self.order[np.repeat(lo[hit], counts) + within]
            r, off = np.divmod(flat, self.per)
            mine = self.rows[r[:, None], off[:, None] + np.arange(self.w)]  # [pairs, w]
            c = _corr_rows(b[bi], mine)
            ok = np.nonzero((np.abs(c) >= MIN_CORR) & _informative(mine))[0]
            found += [(int(informative[bi[k]]), int(r[k]), int(off[k]), float(c[k])) for k in ok]
        return sorted(found)[:256]


def _corr_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation of each row of ``a`` with the same row of ``b`` ``[q, w]``."""
    a = a - a.mean(axis=1, keepdims=True)
    b = b - b.mean(axis=1, keepdims=True)
    den = np.sqrt((a * a).sum(1) * (b * b).sum(1))
    return np.divide((a * b).sum(1), den, out=np.zeros(len(a)), where=den > 0)


def byte_views(t: Tensor) -> list[tuple[str, Tensor]]:
    """``t``'s values, then its bytes read as each dtype of :data:`BYTE_VIEWS` other than its
    own (a reinterpretation: ``x.view(torch.uint8)`` read back as float32), as 1-D tensors."""
    t = t.detach().cpu().contiguous()
    out = [("values", t.reshape(-1))]
    if t.is_complex() or t.dtype == torch.bool:
        return out
    raw = t.reshape(-1).view(torch.uint8)
    for dt in BYTE_VIEWS:
        size = torch.empty((), dtype=dt, device="cpu").element_size()
        if dt != t.dtype and raw.numel() >= size and raw.numel() % size == 0:
            out.append((f"its bytes read as {str(dt).removeprefix('torch.')}", raw.view(dt)))
    return out


def layouts(n_values: int, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """The non-row-major ways a stream of ``n_values`` can hold a ``[k, *shape]`` stack:
    ``(name, the dims as stored, the permutation back to [k, *shape])`` for every distinct
    permutation of the axes longer than 1 (none unless ``n_values`` is a multiple of the
    sample size)."""
    d = math.prod(shape)
    if d < 2 or n_values < d or n_values % d:
        return []
    dims = (n_values // d, *shape)
    long = [i for i, s in enumerate(dims) if s > 1]
    out, seen = [], set()
    for perm in itertools.permutations(long):
        full, it = [], iter(perm)
        full = [next(it) if i in long else i for i in range(len(dims))]
        if full == list(range(len(dims))) or tuple(full) in seen:
            continue
        seen.add(tuple(full))
        stored = tuple(dims[i] for i in full)
        back = tuple(int(np.argsort(full)[i]) for i in range(len(dims)))
        out.append((f"stored as axes {tuple(full)} of [k, {', '.join(map(str, shape))}]", stored, back))
    return out


def find_rows(t: Tensor, index: WindowIndex) -> str | None:
    """How ``t`` (any dtype, shape) carries one of the client's rows of ``index``, or None:
    e.g. ``"sample 13, |corr| 1.0000, its bytes read as float16, flattened"``; the empty
    string for an exact copy as stored (values equal)."""
    if t.numel() < index.w or t.is_complex():
        return None
    w, d = index.w, index.size
    for view_name, flat in byte_views(t):
        v = flat.to(torch.float64).numpy()
        readings = [("flattened", v, None)]
        for lay_name, stored, back in layouts(v.size, index.shape):
            rows = torch.from_numpy(v).reshape(stored).permute(back).reshape(-1, d).numpy()
            readings.append((lay_name, rows, None))
        for read_name, arr, _ in readings:
            if arr.ndim == 1:
                if arr.size < w:
                    continue
                stride = index.query_stride() if v.size >= d else 1
                starts = np.arange(0, arr.size - w + 1, stride)
                blocks = np.lib.stride_tricks.sliding_window_view(arr, w)[starts]
            else:  # rows [k, d]: blocks at offsets 0, stride, ... of each row
                offs = np.arange(0, d - w + 1, index.query_stride())
                blocks = np.lib.stride_tricks.sliding_window_view(arr, w, axis=1)[:, offs].reshape(-1, w)
            hit = None
            for i, r, off, c in _match_chunked(blocks, index):
                if arr.ndim == 1:
                    seg, at = arr, int(starts[i])
                else:
                    seg, at = arr[i // len(offs)], int(offs[i % len(offs)])
                lo, hi = max(0, at - off), min(seg.size, at - off + d)  # the whole aligned overlap
                mine = index.rows[r, lo - (at - off):hi - (at - off)]
                c = _corr(np.nan_to_num(seg[lo:hi]), mine)
                if abs(c) >= MIN_CORR:
                    hit = True
                    break  # else only a window looks alike: not this row; look further
            if hit is not None:
                row = int(index.row_ids[r])
                exact = view_name == "values" and abs(c) > 1 - 1e-9 and _exact(t, index, row)
                if exact:
                    return ""
                return f"sample {row} of the client's, |corr| {abs(c):.4f}, {view_name}, {read_name}"
    return None


def _match_chunked(blocks: np.ndarray, index: WindowIndex):
    step = max(1, _CHUNK // (index.w * BITS))
    for s in range(0, len(blocks), step):
        for i, r, off, c in index.match(np.ascontiguousarray(blocks[s:s + step])):
            yield i + s, r, off, c


def _exact(t: Tensor, index: WindowIndex, row: int) -> bool:
    """True if the client's row ``row`` lies in ``t`` value for value (some layout)."""
    mine = index.rows[int(np.nonzero(index.row_ids == row)[0][0])]
    vals = t.detach().cpu().to(torch.float64).reshape(-1).numpy()
    if vals.size < index.size:
        return False
    if vals.size % index.size == 0:
        orders = [vals.reshape(-1, index.size)]
        for _, stored, back in layouts(vals.size, index.shape):
            orders.append(torch.from_numpy(vals).reshape(stored).permute(back).reshape(-1, index.size).numpy())
        return any((o == mine).all(axis=1).any() for o in orders)
    win = np.lib.stride_tricks.sliding_window_view(vals, index.size)
    return bool((win == mine).all(axis=1).any())


def numbers_in(text: str) -> np.ndarray:
    """The numbers written in ``text`` (JSON, CSV, any separator), as float64; a run of
    digits with no separator (``"3141"``) also reads as one number per digit."""
    found = _NUMBER.findall(text)
    if len(found) == 1 and found[0].isdigit() and len(found[0]) > 1:
        return np.array([float(c) for c in found[0]])
    return np.array([float(x) for x in found], dtype=np.float64)
