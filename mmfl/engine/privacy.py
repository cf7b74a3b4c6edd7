"""Privacy rules: every reply is checked before it leaves its client.

The ``[privacy]`` table (:class:`~mmfl.config.PrivacyConfig`) marks each modality
``shareable`` or ``private`` (``default`` for the ones it does not name) and the labels
``private`` (the default) or ``shareable``. A :class:`PrivacyChecker` looks at a
client's reply :class:`~mmfl.core.message.Message` next to that client's own data
(its :class:`~mmfl.data.base.ArrayDataset` view) and raises :class:`PrivacyError`, one
line naming the client, the route, the array and the rule, when the reply carries

- **raw data of a private modality**: a stretch of values that is an affine copy
  (|Pearson correlation| >= ``MIN_CORR``) of one of the client's samples, after a dtype
  cast, a sign change, ``a*x + b``, a byte reinterpretation, any axis permutation or
  flattening of a stack, a shift by any number of values, or as a contiguous slice of
  at least ``2 * WINDOW - 1`` values; also written in scalars
  (:mod:`mmfl.engine.privacy_content` says how).
- **the labels**: in order in any encoding (ids, floats, a one-to-one relabelling,
  one-hot or soft labels in either layout, bytes read as another dtype), out of order as
  class ids (or shifted ids, or one-hot rows) fitting the client's class histogram and
  covering ``LABEL_SHARE`` of its rows, a label-named array of the client's classes, a
  label-named scalar, the numbers of a string scalar, the numeric scalars read as vectors
  (in order, without the required ``num_examples``, by name families ``y0, y1, ...``);
  **near-copies** that a simple decoder reads back (:mod:`mmfl.engine.privacy_decode`: a share
  of the labels changed, noise, affine maps, renamed classes, one-hot with added columns,
  balanced accuracy >= 0.9).
  Not counted as labels: arrays with fewer than ``MIN_LABEL_ROWS`` values or a single
  distinct value (counters, ``num_batches_tracked``, zero tensors), and per-class vectors
  or matrices (last dim = number of classes), which are not per-sample.

Limits (docs/architecture.md "Privacy rules" lists them): the check sees content, not
meaning. A learned or arbitrary map of a sample (an embedding, a linear mix of its
values), a reordering of a sample's values other than an axis permutation, pieces shorter
than ``2 * WINDOW - 1`` values, labels out of order with renamed classes are not detected;
a ``shareable`` modality may leave as anything, a ``private`` one only as what a model
makes of it. A client holding a single class, or at most ``MIN_LABEL_ROWS`` samples,
cannot be label-checked (its labels equal its class histogram, or are too few to tell
from a counter).
"""

from __future__ import annotations

import hashlib
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
from mmfl.engine.privacy_content import WindowIndex, find_rows, numbers_in
from mmfl.engine.privacy_decode import decode_labels

MIN_LABEL_ROWS = 4  # fewer values than this are never read as labels (counters, scalars)
LABEL_SHARE = 0.5  # a permutation/subset of labels must cover this share of the client's rows
_LABEL_NAME = re.compile(r"^(labels?|targets?|y|y_true|gt)(_?\d+)?$")
REQUIRED_SCALARS = ("num_examples", "batch_size")
_SCALARS = "#scalars"  # the name of a carrier made of numeric scalars (no array is named so)  # scalars a reply must carry (the aggregation weight)
_STEM = re.compile(r"^(.*?)[_\-.]?(\d+)$")  # a scalar name ending in a number: 'y17', 'v_3', 'label-0'


class PrivacyError(MMFLError):
    """A reply that breaks the run's ``[privacy]`` rules."""


def label_named(name: str) -> bool:
    """True for a name, or a ``/``- or ``.``-separated part of it, like ``label``, ``labels_3``, ``y``."""
    return any(_LABEL_NAME.match(part.lower()) for part in re.split(r"[/.]", name))


# ----------------------------------------------------------------------------- private rows

def _index_rows(data: ArrayDataset, modality: str) -> WindowIndex:
    """The client's informative rows of ``modality`` (more than one distinct value, present);
    the check reads them on the CPU, wherever the run keeps its data."""
    t = data.features[modality]
    rows = _rows_of(data, modality, None).cpu()
    flat = rows.reshape(rows.shape[0], -1)
    keep = (flat.amax(1) != flat.amin(1)).numpy() if flat.shape[1] > 1 else np.zeros(len(flat), bool)
    mask = data.features.get(PRESENT + modality)
    if mask is not None:  # samples the client lacks are not its data
        keep &= (mask if data.indices is None else mask[data.indices]).cpu().numpy().astype(bool)
    pos = np.nonzero(keep)[0]
    return WindowIndex(flat[torch.as_tensor(pos, dtype=torch.long, device="cpu")], pos, tuple(t.shape[1:]))


def _rows_of(data: ArrayDataset, modality: str, pos) -> Tensor:
    """Rows ``pos`` (positions within the view; all if None) of ``modality``'s tensor."""
    t, base = data.features[modality], data.indices
    if pos is not None:
        pos = torch.as_tensor(np.asarray(pos), dtype=torch.long, device=t.device if base is None else base.device)
        base = pos if base is None else base[pos]
    return t if base is None else t[base]


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
    subset" (also with ids shifted by a constant), or None. ``per_class``: the array is
    shaped per class (last dim C)."""
    k, n = flat.numel(), y.numel()
    if k < MIN_LABEL_ROWS or n < MIN_LABEL_ROWS:
        return None
    lo, hi = int(flat.min()), int(flat.max())
    if lo == hi:  # a constant: a counter or a zero tensor; or one class's labels, which equal its histogram
        return None
    if k == n and torch.equal(flat, y):
        return "in order"
    if k == n and _same_partition(flat.numpy(), y.numpy()):
        return "in order, ids mapped one-to-one (shifted, scaled or classes renamed)"
    if per_class or k < max(MIN_LABEL_ROWS, math.ceil(LABEL_SHARE * n)):
        return None
    if _sub_multiset(flat, hist):
        return "permuted or a subset"
    nz = torch.nonzero(hist).reshape(-1)
    for shift in {lo - int(nz[0]), hi - int(nz[-1])} - {0}:
        if _sub_multiset(flat - shift, hist):
            return f"permuted or a subset, ids shifted by {shift}"
    return None


def _same_partition(v: np.ndarray, y: np.ndarray) -> bool:
    """True if ``v`` ``[n]`` is a one-to-one relabelling of ``y`` ``[n]`` (equal where ``y``
    is equal, different where it differs), with at least two classes."""
    if v.shape != y.shape or len(v) < MIN_LABEL_ROWS:
        return False
    _, vi = np.unique(v, return_inverse=True)
    ny = len(np.unique(y))
    if ny < 2 or int(vi.max()) + 1 != ny:
        return False
    return len(np.unique(vi.astype(np.int64) * (int(y.max()) + 1) + (y - y.min()))) == ny


def _sub_multiset(flat: Tensor, hist: Tensor) -> bool:
    """True if the values of the 1-D int64 ``flat`` are class ids, each as often at most
    as the client's labels hold it."""
    c = hist.numel()
    if flat.numel() == 0 or int(flat.min()) < 0 or int(flat.max()) >= c:
        return False
    return bool((torch.bincount(flat, minlength=c) <= hist).all())


_LABEL_VIEWS = (torch.int64, torch.int32, torch.int16, torch.uint8, torch.float64, torch.float32, torch.float16)


def _label_readings(t: Tensor, num_classes: int, n: int) -> Iterable[tuple[str, Tensor, bool]]:
    """``(how, 1-D values, per_class)`` readings of an array that could carry labels: a
    one-hot or soft-label array in either layout (its argmax over the class axis), its
    values, its bytes read as other dtypes (when that gives ``n`` values, or the array is
    not floating point: ``y.view(torch.uint8)``)."""
    t = t.detach().cpu()
    if t.is_complex():
        return
    if num_classes >= 2 and t.dim() >= 2:
        axes = [t.dim() - 1] + ([0] if t.dim() == 2 and t.shape[0] == num_classes else [])
        for ax in axes:
            if t.shape[ax] != num_classes:
                continue
            m = t.movedim(ax, -1).reshape(-1, num_classes)
            lay = "" if ax == t.dim() - 1 else "classes first, "
            v = _integral(m)
            hot = _one_hot(v, num_classes) if v is not None else None
            if hot is not None:
                yield f"one-hot, {lay}", hot, False
            elif m.shape[0] == n and m.is_floating_point() or (v is not None and m.shape[0] == n):
                mf = m.to(torch.float64)
                if bool((mf.amax(1) > mf.amin(1)).all()):
                    yield f"argmax over classes (soft labels), {lay}", mf.argmax(1), True
    yield "", t.reshape(-1), t.dim() >= 1 and t.shape[-1] == num_classes
    if t.dtype == torch.bool:
        return
    raw = t.contiguous().reshape(-1).view(torch.uint8)
    for dt in _LABEL_VIEWS:
        size = torch.empty((), dtype=dt, device="cpu").element_size()
        if dt == t.dtype or raw.numel() % size:
            continue
        if raw.numel() // size == n or not t.is_floating_point():
            yield f"its bytes read as {str(dt).removeprefix('torch.')}, ", raw.view(dt), False


def _label_match(t: Tensor, y: Tensor, hist: Tensor, num_classes: int) -> str | None:
    """How the array ``t`` carries the labels ``y`` (one phrase), or None."""
    for how, vals, per_class in _label_readings(t, num_classes, y.numel()):
        if vals.numel() < MIN_LABEL_ROWS:
            continue
        v = _integral(vals)
        if v is not None:
            kind = _label_kind(v.reshape(-1), y, hist, num_classes, per_class)
        elif vals.is_floating_point() and vals.numel() == y.numel() and bool(torch.isfinite(vals).all()) \
                and _same_partition(vals.to(torch.float64).numpy(), y.numpy()):
            kind = "in order, ids mapped one-to-one (shifted, scaled or classes renamed)"
        else:
            kind = None
        if kind is not None:
            return how + kind
    return None


# ----------------------------------------------------------------------------- the checker

class PrivacyChecker:
    """Checks replies against a run's ``[privacy]`` rules (:func:`check`)."""

    def __init__(self, rules: PrivacyConfig):
        self.rules = rules
        self._rows: dict[tuple[int, str], tuple[weakref.ref, WindowIndex]] = {}
        self._labels: dict[int, tuple[weakref.ref, Tensor, Tensor]] = {}

    def _index(self, data: ArrayDataset, m: str) -> WindowIndex:
        """The client's index, cached by its rows (the feature tensor and the view's row
        ids), so a new view object on the same rows (one per round) reuses it."""
        t = data.features[m]
        rows = b"" if data.indices is None else data.indices.cpu().numpy().tobytes()
        key = (id(t), m, hashlib.blake2b(rows, digest_size=16).digest())
        hit = self._rows.get(key)
        if hit is None or hit[0]() is not t:
            hit = (weakref.ref(t), _index_rows(data, m))
            self._rows[key] = hit
        return hit[1]

    def _label_stats(self, data: ArrayDataset, num_classes: int) -> tuple[Tensor, Tensor]:
        hit = self._labels.get(id(data))
        if hit is None or hit[0]() is not data:
            y = torch.as_tensor(data.label_array(), dtype=torch.int64, device="cpu")
            hist = torch.bincount(y, minlength=num_classes) if y.numel() else \
                torch.zeros(num_classes, dtype=torch.int64, device="cpu")
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
        carriers = _carriers(reply)
        for what, _, t in carriers:
            for m, key in private:
                how = find_rows(t, self._index(data, m))
                if how is not None:
                    how = f"{how}; " if how else ""
                    return f"{what} carries private modality '{m}' raw data ({how}{key} = \"private\")"
        if self.rules.labels != "private":
            return None
        for name in reply.scalars:
            if label_named(name):
                return f"scalar '{name}' is named like a label (privacy.labels = \"private\")"
        c = num_classes if num_classes is not None else int(data.label_array().max(initial=-1)) + 1
        y, hist = self._label_stats(data, c)
        for what, name, t in _with_windows(carriers, y.numel()):
            if t.numel() < MIN_LABEL_ROWS and not label_named(name):
                continue
            kind = _label_match(t, y, hist, c)
            if kind is None and name and label_named(name):
                v = _integral(t)
                hot = _one_hot(v, c) if v is not None else None
                if v is not None and _sub_multiset(hot if hot is not None else v.reshape(-1), hist):
                    kind = "a label-named array of the client's classes"  # e.g. one batch's labels (split learning)
            if kind is None:
                kind = decode_labels(t, y, c)  # near-copies: a share changed, noise, affine, extra columns
            if kind is not None:
                return f"{what} carries the client's labels ({kind}; privacy.labels = \"private\")"
        return None

    def check(self, reply: Message, data: ArrayDataset, *, cid: int, route: str,
              num_classes: int | None = None) -> None:
        """Raise :class:`PrivacyError` if ``reply`` (client ``cid``'s, on ``route``) breaks the rules."""
        bad = self.violation(reply, data, num_classes)
        if bad is not None:
            raise PrivacyError(f"client {cid}, route {route}: {bad}")


def _carriers(reply: Message) -> list[tuple[str, str, Tensor]]:
    """Everything in ``reply`` that can carry data, as ``(what, array name or "", tensor)``: each
    array; the numeric scalars as vectors (:func:`_scalar_vectors`); the digits of each
    integer scalar; the numbers written in each string scalar."""
    out = [(f"array '{k}'", k, t) for k, t in reply.arrays.items()]
    out += _scalar_vectors(reply.scalars)
    for k, v in reply.scalars.items():
        if isinstance(v, int) and not isinstance(v, bool) and len(str(abs(v))) >= MIN_LABEL_ROWS:
            out.append((f"scalar '{k}' (its decimal digits)", "",
                        torch.tensor([float(c) for c in str(abs(v))], device="cpu")))
        elif isinstance(v, str):
            vals = numbers_in(v)
            if len(vals):
                out.append((f"string scalar '{k}' (the numbers it holds)", "", torch.from_numpy(vals)))
    return out


MAX_WINDOWS = 256  # a scalar vector at most this much longer than the labels is searched window by window


def _with_windows(carriers: list[tuple[str, str, Tensor]], n: int) -> Iterable[tuple[str, str, Tensor]]:
    """The carriers, and for each scalar vector longer than the client's ``n`` labels each of its
    windows of ``n`` consecutive values (labels written among other scalars, before and after)."""
    for what, name, t in carriers:
        yield what, name, t
        if name == _SCALARS and n >= MIN_LABEL_ROWS and n < t.numel() <= n + MAX_WINDOWS:
            for i in range(t.numel() - n + 1):
                yield f"{what[:-1]} values {i}..{i + n - 1},", name, t[i:i + n]


def _scalar_vectors(scalars: dict) -> list[tuple[str, str, Tensor]]:
    """The numeric scalars read as vectors of at least ``MIN_LABEL_ROWS`` values: all of them
    in order; all but the required ones (:data:`REQUIRED_SCALARS`, wherever they sit); and
    each family of names with a common stem and a number (``y0``, ``y1``, ...), in the
    numbers' order (any other scalar anywhere between them)."""
    nums = [(k, float(v)) for k, v in scalars.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    out, seen = [], set()

    def add(what: str, pairs: list[tuple[str, float]]) -> None:
        key = tuple(k for k, _ in pairs)
        if len(pairs) >= MIN_LABEL_ROWS and key not in seen:
            seen.add(key)
            names = ", ".join(f"'{k}'" for k, _ in pairs[:3]) + (", ..." if len(pairs) > 3 else "")
            out.append((f"the {len(pairs)} numeric scalars ({names}), {what},", _SCALARS,
                        torch.tensor([v for _, v in pairs], dtype=torch.float64, device="cpu")))

    add("read in order", nums)
    add("read in order without the required ones", [(k, v) for k, v in nums if k not in REQUIRED_SCALARS])
    families: dict[str, list[tuple[int, str, float]]] = {}
    for k, v in nums:
        m = _STEM.match(k)
        if m:
            families.setdefault(m.group(1), []).append((int(m.group(2)), k, v))
    for stem, members in families.items():
        add(f"'{stem}<i>' in the order of i", [(k, v) for _, k, v in sorted(members)])
    return out


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
