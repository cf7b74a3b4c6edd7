"""Privacy rules: every reply is checked before it leaves its client.

The ``[privacy]`` table (:class:`~mmfl.config.PrivacyConfig`) marks each modality
``shareable`` or ``private`` (``default`` for the ones it does not name) and the labels
``private`` (the default) or ``shareable``. A :class:`PrivacyChecker` looks at a
client's reply :class:`~mmfl.core.message.Message` next to that client's own data
(its :class:`~mmfl.data.base.ArrayDataset` view) and raises :class:`PrivacyError`, one
line naming the client, the route, the array and the rule, when the reply carries

- **raw data of a private modality**: an array, read as rows of that modality's sample
  size (its trailing dims equal the sample shape, or its last dim or its size is a
  multiple of the flattened size; a 2-D array also transposed), with one row equal to
  one of the client's samples of that modality. Found by content, whatever the array's
  name, the rows' order, or what other rows share the array: the client's rows are
  hashed once (a vectorized hash of their bit patterns, cached per client)
  and a hash hit is verified element by element (in float64). Constant rows (one value repeated:
  an all-zero image) and samples the client lacks (``present/<m>`` False) are not
  indexed: they say nothing about the client, and zeros are everywhere in weights.
- **the labels**: an integer, boolean or integral-valued float array that equals the
  client's labels in order, or whose values form a sub-multiset of them covering at
  least ``label_share`` of the client's rows (a permutation, a subset), or a one-hot
  ``[k, C]`` array decoding to either; an array named like a label (``labels``,
  ``act/y``) holding class ids that the client's labels hold at least as often (one
  batch's labels, as split learning sends them); or a scalar named like a label
  (``label``, ``labels/3``, ``y``, ``target``). Not counted as labels: arrays with fewer than
  ``MIN_LABEL_ROWS`` values or a single distinct value (counters, ``num_batches_tracked``,
  zero tensors), and per-class vectors or matrices (last dim = number of classes, e.g. a
  class histogram or prototype counts), which are not per-sample.

Limits: the check sees content, not meaning. Data transformed on the client (an
embedding, a cropped or rescaled sample, a cast to a lower precision, a sample split
across rows) is not raw data to it; that is the trade-off the rules state: a
``shareable`` modality may leave as anything, a ``private`` one only as what a model
makes of it. A client holding a single class, or at most ``MIN_LABEL_ROWS`` samples, cannot
be label-checked (its labels equal its class histogram, or are too few to tell from a
counter).
"""

from __future__ import annotations

import math
import re
import weakref
from typing import Iterable

import numpy as np
import torch
from torch import Tensor

from mmfl.schema import PrivacyConfig
from mmfl.data.base import PRESENT, ArrayDataset
from mmfl.core.message import Message
from mmfl.errors import MMFLError

MIN_LABEL_ROWS = 4  # fewer values than this are never read as labels (counters, scalars)
LABEL_SHARE = 0.5  # a permutation/subset of labels must cover this share of the client's rows
_CHUNK = 1 << 20  # elements hashed at a time (bounds the float64 copies)
_LABEL_NAME = re.compile(r"^(labels?|targets?|y|y_true|gt)(_?\d+)?$")


class PrivacyError(MMFLError):
    """A reply that breaks the run's ``[privacy]`` rules."""


def label_named(name: str) -> bool:
    """True for a name, or a ``/``- or ``.``-separated part of it, like ``label``, ``labels_3``, ``y``."""
    return any(_LABEL_NAME.match(part.lower()) for part in re.split(r"[/.]", name))


# ----------------------------------------------------------------------------- row hashing

_COEFFS: dict[int, np.ndarray] = {}


def _coeffs(d: int) -> np.ndarray:
    if d not in _COEFFS:
        rng = np.random.default_rng(0x6D6D666C)
        _COEFFS[d] = rng.integers(1, 2**32, size=d, dtype=np.uint64).astype(np.uint32) | np.uint32(1)
    return _COEFFS[d]


def _canonical(rows: Tensor) -> np.ndarray:
    """float64 copy (exact for every float and small-int dtype) with -0.0 made 0.0: what
    "equal rows" means."""
    return rows.detach().to("cpu", torch.float64).numpy() + 0.0


def _hash_rows(rows: Tensor, informative: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """A hash of each row of ``rows`` ``[n, d]``: equal rows (as float64) have equal hashes,
    unequal rows rarely do (a hit is verified). With ``informative``, also a mask of the
    rows holding more than one distinct value. Hashes the rows' float32 bit patterns
    (equal float64 rows round to equal float32 rows), ``sum_j mix(bits_j) * c_j`` with
    per-column odd constants, vectorized."""
    n, d = rows.shape
    out = np.empty(n, dtype=np.uint64)
    keep = np.empty(n, dtype=bool) if informative else None
    c = _coeffs(d)
    step = max(1, _CHUNK // max(d, 1))
    for s in range(0, n, step):
        x = rows[s:s + step].detach().to("cpu", torch.float32).contiguous().numpy() + np.float32(0.0)
        b = x.view(np.uint32)
        b = b ^ (b >> np.uint32(15))
        out[s:s + step] = (b * c).sum(axis=1, dtype=np.uint64)  # products wrap mod 2^32
        if informative:
            keep[s:s + step] = x.max(axis=1) != x.min(axis=1) if d > 1 else False
    return out, keep


class _RowIndex:
    """The hashed rows of one client's samples of one modality (sorted, with their positions)."""

    def __init__(self, data: ArrayDataset, modality: str):
        self.modality = modality
        self.shape = tuple(data.features[modality].shape[1:])
        self.size = math.prod(self.shape)
        rows = _rows_of(data, modality, None)
        hashes, keep = _hash_rows(rows.reshape(rows.shape[0], -1), informative=True)
        mask = data.features.get(PRESENT + modality)
        if mask is not None:  # samples the client lacks are not its data
            keep &= (mask if data.indices is None else mask[data.indices]).numpy().astype(bool)
        pos = np.nonzero(keep)[0]
        order = np.argsort(hashes[pos], kind="stable")
        self.hashes = hashes[pos][order]
        self.pos = pos[order]

    def find(self, rows: Tensor, data: ArrayDataset) -> int | None:
        """Position of the first row of ``rows`` ``[k, size]`` equal to one of the client's rows."""
        if not len(self.hashes) or rows.shape[0] == 0:
            return None
        h, _ = _hash_rows(rows)
        for r in np.nonzero(np.isin(h, self.hashes))[0]:  # a hash hit, verified
            lo, hi = np.searchsorted(self.hashes, h[r], "left"), np.searchsorted(self.hashes, h[r], "right")
            mine = _canonical(_rows_of(data, self.modality, self.pos[lo:hi]).reshape(hi - lo, -1))
            if (mine == _canonical(rows[r:r + 1])).all(axis=1).any():
                return int(r)
        return None


def _rows_of(data: ArrayDataset, modality: str, pos) -> Tensor:
    """Rows ``pos`` (positions within the view; all if None) of ``modality``'s tensor."""
    t, base = data.features[modality], data.indices
    if pos is not None:
        pos = torch.as_tensor(np.asarray(pos), dtype=torch.long)
        base = pos if base is None else base[pos]
    return t if base is None else t[base]


def _as_rows(t: Tensor, size: int) -> list[Tensor]:
    """``t`` read as rows of ``size`` values (whole samples: any array whose size is a
    multiple of ``size``; a 2-D ``[size, k]`` array also transposed), possibly none."""
    if size < 2 or t.numel() < size or t.numel() % size or t.is_complex():
        return []
    out = [t.reshape(-1, size)]
    if t.dim() == 2 and t.shape[0] == size and t.shape[1] != size:
        out.append(t.t())
    return out


# ----------------------------------------------------------------------------- labels

def _integral(t: Tensor) -> Tensor | None:
    """``t`` as int64 if all its values are integers (bool and integer dtypes; floats with
    integral finite values), else None. Cheap for weights: a sample of values first."""
    if t.is_complex():
        return None
    t = t.detach().cpu()
    if t.dtype == torch.bool or not t.is_floating_point():
        return t.to(torch.int64)
    flat = t.reshape(-1)
    head = flat[:1024]
    if not bool(torch.isfinite(head).all()) or not bool((head == head.round()).all()):
        return None
    if not bool(torch.isfinite(flat).all()) or not bool((flat == flat.round()).all()):
        return None
    if flat.numel() and float(flat.abs().max()) > 2**52:
        return None
    return t.to(torch.int64)


def _one_hot(v: Tensor, num_classes: int) -> Tensor | None:
    """The class of each row of an integral ``[..., C]`` one-hot array, else None."""
    if num_classes < 2 or v.dim() < 2 or v.shape[-1] != num_classes:
        return None
    rows = v.reshape(-1, num_classes)
    if not bool(((rows == 0) | (rows == 1)).all()) or not bool((rows.sum(1) == 1).all()):
        return None
    return rows.argmax(1)


def _label_kind(flat: Tensor, y: Tensor, hist: Tensor, num_classes: int, per_class: bool) -> str | None:
    """How the 1-D int64 ``flat`` carries the labels ``y``: "in order", "permuted or a
    subset", or None. ``per_class``: the array is shaped per class (last dim C)."""
    k, n = flat.numel(), y.numel()
    if k < MIN_LABEL_ROWS or n < MIN_LABEL_ROWS:
        return None
    lo, hi = int(flat.min()), int(flat.max())
    if lo == hi:  # a constant: a counter or a zero tensor; or one class's labels, which equal its histogram
        return None
    if k == n and torch.equal(flat, y):
        return "in order"
    if per_class or k < max(MIN_LABEL_ROWS, math.ceil(LABEL_SHARE * n)):
        return None
    return "permuted or a subset" if _sub_multiset(flat, hist) else None


def _sub_multiset(flat: Tensor, hist: Tensor) -> bool:
    """True if the values of the 1-D int64 ``flat`` are class ids, each as often at most
    as the client's labels hold it."""
    c = hist.numel()
    if flat.numel() == 0 or int(flat.min()) < 0 or int(flat.max()) >= c:
        return False
    return bool((torch.bincount(flat, minlength=c) <= hist).all())


# ----------------------------------------------------------------------------- the checker

class PrivacyChecker:
    """Checks replies against a run's ``[privacy]`` rules (:func:`check`)."""

    def __init__(self, rules: PrivacyConfig):
        self.rules = rules
        self._rows: dict[tuple[int, str], tuple[weakref.ref, _RowIndex]] = {}
        self._labels: dict[int, tuple[weakref.ref, Tensor, Tensor]] = {}

    def _index(self, data: ArrayDataset, m: str) -> _RowIndex:
        key = (id(data), m)
        hit = self._rows.get(key)
        if hit is None or hit[0]() is not data:
            hit = (weakref.ref(data), _RowIndex(data, m))
            self._rows[key] = hit
        return hit[1]

    def _label_stats(self, data: ArrayDataset, num_classes: int) -> tuple[Tensor, Tensor]:
        hit = self._labels.get(id(data))
        if hit is None or hit[0]() is not data:
            y = torch.as_tensor(data.label_array(), dtype=torch.int64)
            hist = torch.bincount(y, minlength=num_classes) if y.numel() else \
                torch.zeros(num_classes, dtype=torch.int64)
            hit = (weakref.ref(data), y, hist)
            self._labels[id(data)] = hit
        return hit[1], hit[2]

    def violation(self, reply: Message, data: ArrayDataset, num_classes: int | None = None) -> str | None:
        """What in ``reply`` breaks the rules for the client holding ``data`` (one phrase), or None."""
        private = []
        for m in data.modalities:
            rule, key = self.rules.rule_of(m)
            if rule == "private":
                private.append((m, key))
        for name, t in reply.arrays.items():
            for m, key in private:
                idx = self._index(data, m)
                if any(idx.find(rows, data) is not None for rows in _as_rows(t, idx.size)):
                    return f"array '{name}' carries private modality '{m}' raw data ({key} = \"private\")"
        if self.rules.labels != "private":
            return None
        for name in reply.scalars:
            if label_named(name):
                return f"scalar '{name}' is named like a label (privacy.labels = \"private\")"
        c = num_classes if num_classes is not None else int(data.label_array().max(initial=-1)) + 1
        y, hist = self._label_stats(data, c)
        for name, t in reply.arrays.items():
            v = _integral(t)
            if v is None or (v.numel() < MIN_LABEL_ROWS and not label_named(name)):
                continue
            hot = _one_hot(v, c)
            kind = None
            if hot is not None:
                kind = _label_kind(hot, y, hist, c, per_class=False)
                kind = kind and f"one-hot, {kind}"
            if kind is None:
                kind = _label_kind(v.reshape(-1), y, hist, c, per_class=v.dim() >= 1 and v.shape[-1] == c)
            if kind is None and label_named(name) and _sub_multiset(hot if hot is not None else v.reshape(-1), hist):
                kind = "a label-named array of the client's classes"  # e.g. one batch's labels (split learning)
            if kind is not None:
                return f"array '{name}' carries the client's labels ({kind}; privacy.labels = \"private\")"
        return None

    def check(self, reply: Message, data: ArrayDataset, *, cid: int, route: str,
              num_classes: int | None = None) -> None:
        """Raise :class:`PrivacyError` if ``reply`` (client ``cid``'s, on ``route``) breaks the rules."""
        bad = self.violation(reply, data, num_classes)
        if bad is not None:
            raise PrivacyError(f"client {cid}, route {route}: {bad}")


def make_checker(rules: PrivacyConfig | None, modalities: Iterable[str] = ()) -> PrivacyChecker | None:
    """The checker of a run's rules (None: no ``[privacy]`` table); ``modalities``: every
    modality of the run's data set(s), which the rules' names must be among."""
    if rules is None:
        return None
    rules.check_names(modalities)
    return PrivacyChecker(rules)


def federation_modalities(federation) -> list[str]:
    """The modalities of a federation's data set and of its ``[[client_data]]`` sources."""
    names = list(federation.meta.modalities)
    for src in getattr(federation, "sources", []) or []:
        names += [m for m in src.meta.modalities if m not in names]
    return names
