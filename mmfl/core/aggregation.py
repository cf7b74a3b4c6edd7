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

from dataclasses import asdict
from typing import Any, Callable

import torch
from torch import Tensor

from mmfl.errors import ConfigError
from mmfl.registry import Registry, build_params

Rule = Callable[..., dict[str, Tensor]]
AGGREGATION_RULES: Registry[Rule] = Registry("aggregation rule", plugins=(
    "mmfl.core.robust",  # registers the robust rules: median, krum, bulyan, ...
    "mmfl.core.robust_reps",  # and their per-sample versions for representations (CreamFL's family)
    "mmfl.core.streaming",  # declares which rules fold one update at a time: rule.fold
))


def aggregate(rule: str, updates: list[dict[str, Tensor]], weights: list[float | dict[str, float]],
              previous: dict[str, Tensor] | None = None, **context: Any) -> dict[str, Tensor]:
    """Apply the rule named ``rule`` (see the module docstring for the arguments)."""
    return AGGREGATION_RULES.get(rule).factory(updates, weights, previous, **context)


def per_sample(name: str) -> bool:
    """Whether rule ``name`` combines per-sample representations ``[P, d]`` (CreamFL's family)
    rather than model states."""
    return bool(getattr(AGGREGATION_RULES.get(name).factory, "per_sample", False))


def check_rule(name: str, where: str = "algorithm.aggregation", representations: bool = False) -> str:
    """``name`` if it is a registered rule this algorithm can use, else a ConfigError naming the
    field: a rule over per-sample representations only where ``representations`` (CreamFL's
    family), a rule marked ``model_states`` (the robust model rules) only where not; the other
    per-key rules serve both."""
    if name not in AGGREGATION_RULES:
        raise ConfigError(f"{where}: unknown aggregation rule {name!r} "
                          f"(known: {', '.join(AGGREGATION_RULES.names())})")
    if per_sample(name) and not representations:
        usable = [n for n in AGGREGATION_RULES.names() if not per_sample(n)]
        raise ConfigError(f"{where}: rule {name!r} combines per-sample representations (CreamFL-family "
                          f"servers); this algorithm averages model states: one of {', '.join(usable)}")
    if representations and getattr(AGGREGATION_RULES.get(name).factory, "model_states", False):
        usable = [n for n in AGGREGATION_RULES.names() if per_sample(n)]
        raise ConfigError(f"{where}: rule {name!r} combines model states (FedAvg-family servers); this algorithm "
                          f"combines per-sample representations: one of {', '.join(usable)}")
    return name


def rule_params(name: str, values: dict[str, Any] | None, where: str = "algorithm.aggregation_params"):
    """The validated parameters of rule ``name`` (its registered params dataclass, or None when it
    takes none) from the table ``values``; a bad key or value is a ConfigError naming ``where.key``."""
    return build_params(where, name, AGGREGATION_RULES.get(name).params, dict(values or {}))


def rule_kwargs(name: str, values: dict[str, Any] | None) -> dict[str, Any]:
    """The keyword arguments rule ``name`` gets from ``algorithm.aggregation_params`` (defaults filled)."""
    params = rule_params(name, values)
    return asdict(params) if params is not None else {}


def check_cohort(name: str, values: dict[str, Any] | None, n: int, where: str = "algorithm.aggregation_params") -> None:
    """ConfigError when a round of ``n`` updates is fewer than rule ``name`` needs with these
    parameters (its params' ``min_updates()``: Krum 2f + 3, Bulyan 4f + 3)."""
    params = rule_params(name, values, where)
    need = params.min_updates() if hasattr(params, "min_updates") else 1
    if n < need:
        raise ConfigError(f"{where}: rule '{name}' with {asdict(params)} needs at least {need} updates per round, "
                          f"but a round has {n} clients (clients_per_round / sample_fraction)")


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
        w = torch.full((stack.shape[0],), 1.0 / stack.shape[0], dtype=stack.dtype, device=stack.device)
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


def per_sample_mean(local: Tensor, w: Tensor, chunk: int = 8192) -> Tensor:
    """``sum_c w[c, p] * local[c, p]`` (CreamFL eq. 6): local ``[C, P, d]``, w ``[C, P]`` -> ``[P, d]``,
    in ``local``'s dtype, ``chunk`` rows at a time."""
    C, P, d = local.shape
    out = torch.empty(P, d, dtype=local.dtype, device=local.device)
    for s in range(0, P, chunk):
        e = min(P, s + chunk)
        out[s:e] = torch.einsum("cp,cpd->pd", w[:, s:e].to(local.dtype), local[:, s:e])
    return out


def per_sample_rule(weights_of: Callable[..., Tensor]) -> Rule:
    """A rule over representations from a per-sample weighting
    ``weights_of(local [C, P, d], key=, data_weights=[C floats], **context) -> [C, P]`` (columns
    summing to 1): each key's updates (``[P, d]`` each, e.g. CreamFL's representations of the
    public set) are stacked in their dtype and combined by eq. 6 (:func:`per_sample_mean`);
    ``info["weight_max/<key>"]`` gets the mean over samples of the largest weight (1/C =
    uniform, 1 = one client per sample)."""

    def rule(updates, weights=None, previous=None, info: dict | None = None, **context):
        out = dict(previous) if previous is not None else {}
        for key, pairs in by_key(updates, weights).items():
            local = torch.stack([t for t, _ in pairs])  # [C, P, d]
            w = weights_of(local, key=key, data_weights=[dw for _, dw in pairs], **context)
            out[key] = per_sample_mean(local, w)
            if info is not None:
                info[f"weight_max/{key}"] = float(w.max(0).values.mean())
        return out

    rule.__doc__ = weights_of.__doc__
    rule.per_sample = True  # combines representations [P, d], not model states (check_rule)
    return rule


# Representation rules (CreamFL's reamFL baselines, FedMD): per-sample weights in the
# representations' dtype (float32), unlike weighted_mean / mean / iot above (float64 / per key).

def uniform_weights(local: Tensor, **context: Any) -> Tensor:
    """``1/C`` for every client and sample (reamFL+Mean, FedMD's consensus). ``[C, P, d] -> [C, P]``."""
    return torch.full((local.shape[0], local.shape[1]), 1.0 / local.shape[0], device=local.device)


def data_weights_per_sample(local: Tensor, data_weights: list[float], **context: Any) -> Tensor:
    """Each client's data weight over their sum, the same for every sample (float32; reamFL+Avg:
    ``n_c / sum_c n_c``). ``[C, P, d] -> [C, P]``."""
    raw = torch.tensor(data_weights, dtype=torch.float32, device=local.device)
    return (raw / raw.sum()).unsqueeze(1).expand(-1, local.shape[1])


AGGREGATION_RULES.register("rep_mean", help="representations [P, d]: uniform per-sample mean in float32 "
                                            "(CreamFL's reamFL+Mean, FedMD's consensus)")(per_sample_rule(uniform_weights))
rep_avg = AGGREGATION_RULES.register("rep_avg", help="representations [P, d]: data-weighted mean in float32 "
                                                     "(CreamFL's reamFL+Avg)")(per_sample_rule(data_weights_per_sample))


@AGGREGATION_RULES.register("rep_iot", help="representations [P, d]: rep_avg with multimodal clients' weights times "
                                            "multimodal_weight (CreamFL's reamFL+IoT)")
def rep_iot(updates: list[dict[str, Tensor]], weights: list[float | dict[str, float]],
            previous: dict[str, Tensor] | None = None, multimodal: list[bool] | None = None,
            multimodal_weight: float = 100.0, **context: Any) -> dict[str, Tensor]:
    """``rep_avg`` after multiplying the weight of each update from a client holding several
    modalities (``multimodal[k]``) by ``multimodal_weight`` (reamFL+IoT: 100)."""
    if multimodal is None:
        raise ValueError("the 'rep_iot' rule needs multimodal=[bool per update] (CreamFL's server gives it)")
    scaled = [scale_weight(w, multimodal_weight) if mm else w for w, mm in zip(weights, multimodal)]
    return rep_avg(updates, scaled, previous, **context)


rep_iot.per_sample = True

