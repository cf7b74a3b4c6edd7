"""Streaming aggregation: rules that fold the clients' updates one at a time.

A rule of :data:`mmfl.core.aggregation.AGGREGATION_RULES` that can combine updates without
seeing them all at once declares a *fold*: its attribute ``rule.fold`` is a class built as
``fold(previous, **kwargs)`` (the rule's parameters and the constant part of its context)
with two methods::

    add(update: dict[str, Tensor], weight: float | dict[str, float], **item) -> None
    finish() -> dict[str, Tensor]          # what rule(updates, weights, previous, ...) returns

``item``: the per-update part of the context, the keys named in ``fold.item_keys`` (``iot``:
``multimodal``, a bool per update; in the list path a list with one entry per update). A fold
keeps running sums (float64, one model's worth) and never a reference to an update, so a
server that feeds it replies as they arrive holds one model plus one reply, not the cohort.

Which rules fold (:func:`foldable`): ``weighted_mean``, ``mean``, ``iot`` and ``norm_clip``
(its threshold is fixed). ``median``, ``trimmed_mean``, ``krum``, ``multi_krum``, ``bulyan``
and ``norm_clip_adaptive`` (a threshold from the round's median norm) need the whole list, as
do the representation rules. Central DP's clipped sum (:class:`CentralDPFold`) folds too.

Numerics: a fold accumulates ``sum_k p_k w_k`` and ``sum_k p_k`` in float64 and divides at the
end; the list rule scales each update by ``p_k / sum p`` first. The two differ by float64
rounding only: after the cast back to float32 the results agree bit for bit except for rare
elements one float32 ulp apart (measured in docs/performance.md, "Streaming aggregation").
``central DP`` sums in the same order and dtype as :func:`mmfl.core.dp.central_dp_mean`: bit-exact.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mmfl.core.aggregation import AGGREGATION_RULES, mean, weighted_mean, iot_weighted_mean, scale_weight, weight_for
from mmfl.core.dp import clip_update, gaussian_like
from mmfl.core.robust import clip_scales, device_of, norm_clip


def foldable(rule: str) -> bool:
    """Whether rule ``rule`` declares a fold (it can aggregate updates one at a time)."""
    return getattr(AGGREGATION_RULES.get(rule).factory, "fold", None) is not None


def make_fold(rule: str, previous: dict[str, Tensor] | None, **kwargs: Any):
    """A fresh fold of rule ``rule`` (None: the rule needs the whole list of updates).
    ``kwargs``: the rule's parameters and constant context (those the fold does not take
    are ignored, as the list rules ignore theirs)."""
    fold = getattr(AGGREGATION_RULES.get(rule).factory, "fold", None)
    return None if fold is None else fold(previous, **kwargs)


class WeightedMeanFold:
    """:func:`~mmfl.core.aggregation.weighted_mean` one update at a time: per key a float64 sum
    of ``p_k w_k`` and of ``p_k`` over the updates carrying it; integer keys a running maximum.
    ``finish``: ``sum p w / sum p`` cast to the key's dtype; a key whose weights sum to 0 keeps
    its ``previous`` value (an error without one)."""

    item_keys: tuple[str, ...] = ()

    def __init__(self, previous: dict[str, Tensor] | None = None, **context: Any):
        self.previous = previous
        self.sums: dict[str, Tensor] = {}  # key -> float64 sum of p_k w_k
        self.totals: dict[str, float] = {}  # key -> sum of p_k
        self.dtypes: dict[str, torch.dtype] = {}
        self.maxima: dict[str, Tensor] = {}  # integer keys (num_batches_tracked)

    def add(self, update: dict[str, Tensor], weight: float | dict[str, float], **item: Any) -> None:
        for key, t in update.items():
            if not t.is_floating_point():
                m = self.maxima.get(key)
                self.maxima[key] = t.clone() if m is None else torch.maximum(m, t)
                continue
            w = weight_for(key, weight)
            acc = self.sums.get(key)
            if acc is None:
                acc = self.sums[key] = torch.zeros_like(t, dtype=torch.float64)
                self.totals[key], self.dtypes[key] = 0.0, t.dtype
            acc.add_(t.to(torch.float64), alpha=w)
            self.totals[key] += w

    def finish(self) -> dict[str, Tensor]:
        out = dict(self.previous) if self.previous is not None else {}
        for key, acc in self.sums.items():
            total = self.totals[key]
            if total <= 0:
                if self.previous is not None and key in self.previous:
                    continue
                raise ValueError(f"weights of '{key}' must sum to a positive number")
            out[key] = acc.div_(total).to(self.dtypes[key])
        out.update(self.maxima)
        return out


class MeanFold(WeightedMeanFold):
    """:func:`~mmfl.core.aggregation.mean` one update at a time: every weight 1 (float64 sums,
    see the module's note on numerics)."""

    def add(self, update, weight=None, **item):
        super().add(update, 1.0)


class IotFold(WeightedMeanFold):
    """:func:`~mmfl.core.aggregation.iot_weighted_mean` one update at a time: the weight of an
    update from a client holding several modalities (``multimodal``) times ``multimodal_weight``."""

    item_keys = ("multimodal",)

    def __init__(self, previous=None, multimodal_weight: float = 100.0, **context):
        super().__init__(previous)
        self.multimodal_weight = multimodal_weight

    def add(self, update, weight, multimodal: bool | None = None, **item):
        if multimodal is None:
            raise ValueError("the 'iot' rule needs multimodal=<bool> per update (a multimodal server gives it)")
        super().add(update, scale_weight(weight, self.multimodal_weight) if multimodal else weight)


class NormClipFold:
    """:func:`~mmfl.core.robust.norm_clip` one update at a time: ``dw_k = w_k - previous``
    (float64), scaled by ``1 / max(1, ||dw_k|| / clip_norm)``, into a :class:`WeightedMeanFold`
    of the deltas; ``finish``: ``previous + mean`` per key, cast back."""

    item_keys: tuple[str, ...] = ()

    def __init__(self, previous: dict[str, Tensor] | None = None, clip_norm: float = 1.0, **context: Any):
        if previous is None:
            raise ValueError("aggregation rule 'norm_clip' clips updates relative to the global values: "
                             "it needs previous")
        self.previous, self.clip_norm = previous, clip_norm
        self.deltas = WeightedMeanFold({k: torch.zeros_like(v, dtype=torch.float64) if v.is_floating_point() else v
                                        for k, v in previous.items()})

    def add(self, update, weight, **item):
        prev = self.previous
        missing = [k for k in update if k not in prev]
        if missing:
            raise ValueError(f"aggregation rule 'norm_clip': key '{missing[0]}' has no previous value")
        d = {k: t.to(torch.float64) - prev[k].to(torch.float64) for k, t in update.items() if t.is_floating_point()}
        norm = torch.sqrt(sum((t ** 2).sum() for t in d.values())
                          + torch.zeros((), dtype=torch.float64, device=device_of(prev)))
        scale = clip_scales(norm.reshape(1), self.clip_norm)[0] if self.clip_norm > 0 else 1.0
        self.deltas.add({k: (d[k] * scale) if k in d else t for k, t in update.items()}, weight)

    def finish(self):
        out = dict(self.previous)
        for k, d in self.deltas.finish().items():
            prev = self.previous[k]
            out[k] = (prev.to(torch.float64) + d).to(prev.dtype) if prev.is_floating_point() else d
        return out


class CentralDPFold:
    """:func:`~mmfl.core.dp.central_dp_mean` one update at a time (DP-FedAvg, McMahan et al.
    2018, Alg. 1): each ``dw_k`` clipped to ``clip_norm`` and summed in float64 in arrival order
    (the list path's order and dtype: bit-exact); ``finish`` adds ``N(0, (z C)^2)`` noise from
    ``seed`` and divides by ``denominator``. ``info`` gets ``dp/clipped`` and ``dp/update_norm``."""

    item_keys: tuple[str, ...] = ()

    def __init__(self, previous: dict[str, Tensor], clip_norm: float, noise_multiplier: float, seed: int,
                 denominator: int | None = None, info: dict | None = None):
        self.previous, self.clip_norm, self.z, self.seed = previous, clip_norm, noise_multiplier, seed
        self.denominator, self.info = denominator, info
        self.keys: list[str] | None = None
        self.total: dict[str, Tensor] = {}
        self.norms: list[float] = []
        self.maxima = WeightedMeanFold()  # integer keys only: their running maximum

    def add(self, update, weight=None, **item):
        own = sorted(k for k, t in update.items() if t.is_floating_point())
        if self.keys is None:
            self.keys = own
        elif own != self.keys:
            raise ValueError("differential privacy needs every update to carry the same keys "
                             f"({len(own)} vs {len(self.keys)}); clients holding only some modules are not supported")
        missing = [k for k in own if k not in self.previous]
        if missing:
            raise ValueError(f"differential privacy: key '{missing[0]}' has no global value")
        delta = {k: update[k].to(torch.float64) - self.previous[k].to(torch.float64) for k in own}
        clipped, norm = clip_update(delta, self.clip_norm)
        self.norms.append(norm)
        for k in own:  # sum(c[k] for c in clipped) of the list path: 0 + c_1 + c_2 + ...
            self.total[k] = (0 + clipped[k]) if k not in self.total else self.total[k] + clipped[k]
        self.maxima.add({k: t for k, t in update.items() if not t.is_floating_point()}, 1.0)

    def finish(self):
        n = self.denominator or len(self.norms)
        keys = list(self.total)
        noise = gaussian_like(self.total, self.z * self.clip_norm, self.seed) if self.z > 0 else None
        out = dict(self.previous)
        for k in keys:
            mean = (self.total[k] + (noise[k] if noise is not None else 0.0)) / n
            out[k] = (self.previous[k].to(torch.float64) + mean).to(self.previous[k].dtype)
        out.update(self.maxima.maxima)
        if self.info is not None:
            self.info["dp/clipped"] = sum(1 for x in self.norms if x > self.clip_norm)
            self.info["dp/update_norm"] = float(sum(self.norms) / max(1, len(self.norms)))
        return out


# the declarations: these rules can be fed one update at a time
weighted_mean.fold = WeightedMeanFold
mean.fold = MeanFold
iot_weighted_mean.fold = IotFold
norm_clip.fold = NormClipFold
