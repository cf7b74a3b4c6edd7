"""Aggregation rules: named pure functions from the clients' updates to the server's new values.

Every rule has one signature::

    rule(updates: list[dict[str, Tensor]], weights: list[float | dict[str, float]],
         previous: dict[str, Tensor] | None = None, **context) -> dict[str, Tensor]

- ``updates[k]``: what client ``k`` sent (replies in client-id order), tensors by
  key (a model's state-dict names, or CreamFL's ``rep`` entries ``[P, d]``). A
  client holding only some modalities sends only those modules' keys: every rule
  combines each key over the updates that carry it.
- ``weights[k]``: client ``k``'s data weight, a number or ``{key prefix: weight}``
  (a module's own data size; a key takes the weight of its longest matching
  prefix). Rules that do not weigh by data ignore it.
- ``previous``: the current global values. A key no update carries keeps its
  value (and is in the result only when ``previous`` is given).
- ``context``: what a rule needs beyond the updates (CreamFL's GCA: the server's
  representations of the other modality); ``info``, when given, is a dict the
  rule may write diagnostics to.

The table :data:`AGGREGATION_RULES` (a :class:`~mmfl.registry.Registry`) maps a
name to its rule; algorithms choose theirs by name (``algorithm.aggregation``)
and call :func:`aggregate`. A new rule is one function here (or in an algorithm's
module) and one ``@AGGREGATION_RULES.register(...)`` line.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from mmfl.errors import ConfigError
from mmfl.registry import Registry

Rule = Callable[..., dict[str, Tensor]]
AGGREGATION_RULES: Registry[Rule] = Registry("aggregation rule")


def aggregate(rule: str, updates: list[dict[str, Tensor]], weights: list[float | dict[str, float]],
              previous: dict[str, Tensor] | None = None, **context: Any) -> dict[str, Tensor]:
    """Apply the rule named ``rule`` (see the module docstring for the arguments)."""
    return AGGREGATION_RULES.get(rule).factory(updates, weights, previous, **context)


def check_rule(name: str, where: str = "algorithm.aggregation") -> str:
    """``name`` if it is a registered rule, else a ConfigError naming the field."""
    if name not in AGGREGATION_RULES:
        raise ConfigError(f"{where}: unknown aggregation rule {name!r} "
                          f"(known: {', '.join(AGGREGATION_RULES.names())})")
    return name


def weight_for(key: str, w: float | dict[str, float]) -> float:
    """The weight of ``key`` from a number or a ``{key prefix: weight}`` map (longest prefix)."""
    if not isinstance(w, dict):
        return float(w)
    best, found = -1, 0.0
    for prefix, v in w.items():
        if key.startswith(prefix) and len(prefix) > best:
            best, found = len(prefix), float(v)
    if best < 0:
        raise ValueError(f"no weight for '{key}' (prefixes: {sorted(w)})")
    return found


def by_key(updates: list[dict[str, Tensor]], weights: list[float | dict[str, float]] | None = None
           ) -> dict[str, list[tuple[Tensor, float]]]:
    """Each key with ``(tensor, weight)`` of every update carrying it (weight 1 if ``weights`` is None)."""
    per_key: dict[str, list[tuple[Tensor, float]]] = {}
    for i, state in enumerate(updates):
        for key, t in state.items():
            per_key.setdefault(key, []).append((t, 1.0 if weights is None else weight_for(key, weights[i])))
    return per_key


@AGGREGATION_RULES.register("weighted_mean", help="data-weighted mean of each key over the updates carrying it "
                                                  "(FedAvg, MOON Alg. 1 line 7; module-wise for multimodal models)")
def weighted_mean(updates: list[dict[str, Tensor]], weights: list[float | dict[str, float]],
                  previous: dict[str, Tensor] | None = None, **context: Any) -> dict[str, Tensor]:
    """``w_key = sum_k p_k w_k,key / sum_k p_k`` over the updates carrying the key
    (FedAvg: MOON Alg. 1, line 7, ``p_k = |D^k|``; per module for multimodal models, with
    the module's own data size). Floating tensors (any shape) are averaged in float64 and
    cast back; integer tensors (BatchNorm's ``num_batches_tracked``) take the maximum. A key
    whose weights sum to 0 keeps its ``previous`` value (an error without one)."""
    out = dict(previous) if previous is not None else {}
    for key, pairs in by_key(updates, weights).items():
        ref = pairs[0][0]
        if ref.is_floating_point():
            total = float(sum(w for _, w in pairs))
            if total <= 0:
                if previous is not None and key in previous:
                    continue  # nobody with data for this module: it keeps its value
                raise ValueError(f"weights of '{key}' must sum to a positive number")
            acc = torch.zeros_like(ref, dtype=torch.float64)
            for t, w in pairs:
                acc.add_(t.to(torch.float64), alpha=w / total)
            out[key] = acc.to(ref.dtype)
        else:
            out[key] = torch.stack([t for t, _ in pairs]).max(0).values
    return out


@AGGREGATION_RULES.register("mean", help="uniform mean of each key over the updates carrying it (data sizes ignored)")
def mean(updates: list[dict[str, Tensor]], weights: list[float | dict[str, float]] | None = None,
         previous: dict[str, Tensor] | None = None, **context: Any) -> dict[str, Tensor]:
    """``w_key = 1/|S_key| sum_{k in S_key} w_k,key`` (S_key: the updates carrying the key;
    any shape). Computed as ``sum_k (1/|S|) * w_k`` in the tensors' dtype (CreamFL's ``mean``:
    eq. 6 with uniform weights); integer tensors take the maximum."""
    out = dict(previous) if previous is not None else {}
    for key, pairs in by_key(updates).items():
        stack = torch.stack([t for t, _ in pairs])  # [C, *shape]
        if not stack.is_floating_point():
            out[key] = stack.max(0).values
            continue
        w = torch.full((stack.shape[0],), 1.0 / stack.shape[0], dtype=stack.dtype)
        out[key] = torch.einsum("c,c...->...", w, stack)
    return out


def scale_weight(w: float | dict[str, float], factor: float) -> float | dict[str, float]:
    """A data weight (number or ``{prefix: weight}``) times ``factor``."""
    return {k: v * factor for k, v in w.items()} if isinstance(w, dict) else w * factor


@AGGREGATION_RULES.register("iot", help="weighted_mean with multimodal clients' weights times multimodal_weight "
                                        "(FedIoT, Zhao et al. 2022; 100 in CreamFL's section 4.1)")
def iot_weighted_mean(updates: list[dict[str, Tensor]], weights: list[float | dict[str, float]],
                      previous: dict[str, Tensor] | None = None, multimodal: list[bool] | None = None,
                      multimodal_weight: float = 100.0, **context: Any) -> dict[str, Tensor]:
    """:func:`weighted_mean` after multiplying the weight of each update from a client holding
    several modalities (``multimodal[k]``) by ``multimodal_weight`` (FedIoT's larger weight)."""
    if multimodal is None:
        raise ValueError("the 'iot' rule needs multimodal=[bool per update] (a multimodal server gives it)")
    scaled = [scale_weight(w, multimodal_weight) if mm else w for w, mm in zip(weights, multimodal)]
    return weighted_mean(updates, scaled, previous)


def per_sample_mean(local: Tensor, w: Tensor) -> Tensor:
    """``sum_c w[c, p] * local[c, p]`` (CreamFL eq. 6): local ``[C, P, d]``, w ``[C, P]`` -> ``[P, d]``."""
    return torch.einsum("cp,cpd->pd", w.to(local.dtype), local)


def per_sample_rule(weights_of: Callable[..., Tensor]) -> Rule:
    """A rule from a per-sample weighting ``weights_of(local [C, P, d], **context) -> [C, P]``
    (columns summing to 1): each key's updates (``[P, d]`` each) are stacked and combined by
    eq. 6; ``info["weight_max/<key>"]`` gets the mean over samples of the largest weight
    (1/C = uniform, 1 = one client per sample)."""

    def rule(updates, weights=None, previous=None, info: dict | None = None, combine=per_sample_mean, **context):
        out = dict(previous) if previous is not None else {}
        for key, pairs in by_key(updates).items():
            local = torch.stack([t for t, _ in pairs])
            w = weights_of(local, key=key, **context)
            out[key] = combine(local, w)
            if info is not None:
                info[f"weight_max/{key}"] = float(w.max(0).values.mean())
        return out

    rule.__doc__ = weights_of.__doc__
    return rule
