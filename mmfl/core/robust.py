"""Robust aggregation rules (issue 15, item 1): entries of :data:`~mmfl.core.aggregation.AGGREGATION_RULES`.

Each rule has the table's signature ``rule(updates, weights, previous=None, **context)``; its
parameters arrive as keyword arguments from ``algorithm.aggregation_params`` (validated by the
rule's params dataclass, registered with it). What each guarantees: docs/robust.md.

- ``median``, ``trimmed_mean`` (Yin et al., ICML 2018, Def. 1-2): per key and coordinate, over
  the updates carrying the key. Both commute with a shift, so combining models equals
  combining updates ``w_k - previous`` and adding ``previous``.
- ``krum``, ``multi_krum`` (Blanchard et al., NeurIPS 2017): distances between the
  flattened updates; ``||(w_i - p) - (w_j - p)|| = ||w_i - w_j||``, so models serve. Keys are
  grouped by the set of updates carrying them (one group for a unimodal model; per module
  holders for a multimodal one) and each group is selected on its own.
- ``bulyan`` (El Mhamdi et al., ICML 2018): Krum repeatedly, then a coordinate-wise
  trimmed mean around the median, per holder group.
- ``norm_clip``, ``norm_clip_adaptive`` (Sun et al. 2019, "Can you really backdoor federated
  learning?", "norm thresholding"): each update ``w_k - previous`` scaled to norm at most
  ``M`` (fixed, or the round's median update norm), then FedAvg's data-weighted mean.
- ``rep_median``, ``rep_trimmed_mean`` (:mod:`mmfl.core.robust_reps`): the same coordinate-wise
  statistics over clients of per-sample representations ``[P, d]`` (CreamFL's family). The
  rules above are for model states only (``model_states``: refused on CreamFL's servers).

Data weights: only the clipping rules use them (FedAvg's mean of the clipped updates); the
others ignore them, as in their papers (an attacker controls its ``num_examples``). Integer
tensors (BatchNorm's ``num_batches_tracked``) take the maximum over holders, as in
``weighted_mean``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import sys
from typing import Any

import torch
from torch import Tensor

from mmfl.core.aggregation import AGGREGATION_RULES, by_key, weighted_mean
from mmfl.core.device import CPU
from mmfl.errors import ConfigError

WHERE = "algorithm.aggregation_params"


# ----------------------------------------------------------------------------- parameters

@dataclass
class TrimParams:
    trim_fraction: float = field(default=0.2, metadata={
        "help": "beta: the fraction of updates dropped at each end, per coordinate (floor(beta n) each side; "
                "Yin et al. 2018 Def. 2; Flower's FedTrimmedAvg default 0.2); in [0, 0.5)"})

    def __post_init__(self):
        if not 0 <= self.trim_fraction < 0.5:
            raise ConfigError(f"{WHERE}.trim_fraction: must be in [0, 0.5), got {self.trim_fraction}")

    def min_updates(self) -> int:
        return 1


@dataclass
class KrumParams:
    f: int = field(default=1, metadata={
        "help": "number of Byzantine updates tolerated (Blanchard et al. 2017); needs n > 2f + 2 updates"})

    def __post_init__(self):
        if self.f < 0:
            raise ConfigError(f"{WHERE}.f: must be >= 0, got {self.f}")

    def min_updates(self) -> int:
        return 2 * self.f + 3


@dataclass
class MultiKrumParams(KrumParams):
    m: int = field(default=0, metadata={
        "help": "updates averaged: the m with the lowest Krum scores (1 = Krum; 0 = n - f)"})

    def __post_init__(self):
        super().__post_init__()
        if self.m < 0:
            raise ConfigError(f"{WHERE}.m: must be >= 0 (0 = n - f), got {self.m}")

    def min_updates(self) -> int:
        return max(2 * self.f + 3, self.m)


@dataclass
class BulyanParams:
    f: int = field(default=1, metadata={
        "help": "number of Byzantine updates tolerated (El Mhamdi et al. 2018); needs n >= 4f + 3 updates"})

    def __post_init__(self):
        if self.f < 0:
            raise ConfigError(f"{WHERE}.f: must be >= 0, got {self.f}")

    def min_updates(self) -> int:
        return 4 * self.f + 3


@dataclass
class ClipParams:
    clip_norm: float = field(default=1.0, metadata={
        "help": "M: each update w_k - w is scaled to L2 norm at most M (over all its keys; Sun et al. 2019)"})

    def __post_init__(self):
        if not self.clip_norm > 0:
            raise ConfigError(f"{WHERE}.clip_norm: must be > 0, got {self.clip_norm}")

    def min_updates(self) -> int:
        return 1


# ----------------------------------------------------------------------------- coordinate-wise statistics

def coordinate_median(stack: Tensor) -> Tensor:
    """Yin et al. 2018, Def. 1: the median over dim 0 of ``[n, *shape]`` -> ``[*shape]``; for even n
    the mean of the two middle values (the usual median, not torch's lower one)."""
    n = stack.shape[0]
    s = stack.sort(0).values
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def coordinate_trimmed_mean(stack: Tensor, beta: float) -> Tensor:
    """Yin et al. 2018, Def. 2: per coordinate, drop the ``floor(beta n)`` largest and smallest of
    ``[n, *shape]`` and average the rest -> ``[*shape]`` (beta in [0, 0.5))."""
    n = stack.shape[0]
    k = int(beta * n)
    return stack.sort(0).values[k:n - k].mean(0)


def per_key(combine, updates: list[dict[str, Tensor]], previous: dict[str, Tensor] | None,
            dtype: torch.dtype | None = torch.float64) -> dict[str, Tensor]:
    """``combine([n, *shape]) -> [*shape]`` on each key's stack over the updates carrying it, in
    ``dtype`` (None: the tensors' own) and cast back; integer tensors take the maximum."""
    out = dict(previous) if previous is not None else {}
    for key, pairs in by_key(updates).items():
        stack = torch.stack([t for t, _ in pairs])
        if not stack.is_floating_point():
            out[key] = stack.max(0).values
            continue
        out[key] = combine(stack if dtype is None else stack.to(dtype)).to(stack.dtype)
    return out


@AGGREGATION_RULES.register("median", help="coordinate-wise median per key over its holders, data weights "
                                           "ignored (Yin et al. 2018)")
def median(updates: list[dict[str, Tensor]], weights: Any = None, previous: dict[str, Tensor] | None = None,
           **context: Any) -> dict[str, Tensor]:
    """Each key: :func:`coordinate_median` over the updates carrying it (float64, cast back)."""
    return per_key(coordinate_median, updates, previous)


@AGGREGATION_RULES.register("trimmed_mean", TrimParams, help="coordinate-wise beta-trimmed mean per key over "
                                                             "its holders, data weights ignored (Yin et al. 2018)")
def trimmed_mean(updates: list[dict[str, Tensor]], weights: Any = None, previous: dict[str, Tensor] | None = None,
                 trim_fraction: float = 0.2, **context: Any) -> dict[str, Tensor]:
    """Each key: :func:`coordinate_trimmed_mean` over the updates carrying it (float64, cast back)."""
    return per_key(lambda s: coordinate_trimmed_mean(s, trim_fraction), updates, previous)


# ----------------------------------------------------------------------------- Krum, Multi-Krum, Bulyan

def holder_groups(updates: list[dict[str, Tensor]]) -> list[tuple[list[int], list[str]]]:
    """The floating keys grouped by the updates carrying them: ``(update indices, keys)`` in
    first-seen order (one group when every update carries every key)."""
    holders: dict[str, list[int]] = {}
    for i, u in enumerate(updates):
        for key, t in u.items():
            if t.is_floating_point():
                holders.setdefault(key, []).append(i)
    groups: dict[tuple[int, ...], list[str]] = {}
    for key, idx in holders.items():
        groups.setdefault(tuple(idx), []).append(key)
    return [(list(idx), keys) for idx, keys in groups.items()]


def flatten(updates: list[dict[str, Tensor]], idx: list[int], keys: list[str]) -> Tensor:
    """``[len(idx), D]`` float64: the keys of each chosen update, flattened and concatenated."""
    return torch.stack([torch.cat([updates[i][k].reshape(-1).to(torch.float64) for k in keys]) for i in idx])


def unflatten(vec: Tensor, like: dict[str, Tensor], keys: list[str]) -> dict[str, Tensor]:
    """The inverse of :func:`flatten` for one vector ``[D]``, in each key's shape and dtype."""
    out, s = {}, 0
    for k in keys:
        n = like[k].numel()
        out[k] = vec[s:s + n].reshape(like[k].shape).to(like[k].dtype)
        s += n
    return out


def pairwise_sq_dists(x: Tensor) -> Tensor:
    """``||x_i - x_j||^2`` for ``x`` ``[n, D]`` -> ``[n, n]``, as ``|x_i|^2 + |x_j|^2 - 2 x_i . x_j``
    (one ``[n, D] x [D, n]`` product, no ``[n, D]`` temporaries; in ``x``'s float64 the cancellation
    error is ~1e-16 of the squared norms), clamped at 0, exact zeros on the diagonal."""
    sq = (x * x).sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)).clamp_min_(0.0)
    return d2.fill_diagonal_(0.0)


def krum_scores(d2: Tensor, f: int) -> Tensor:
    """Blanchard et al. 2017 (Krum): ``s(i) = sum of ||V_i - V_j||^2 over the n - f - 2 closest
    j != i``; ``d2`` ``[n, n]`` squared distances -> ``[n]``. At least one neighbour is counted
    (Bulyan's last selections run Krum on fewer than 2f + 3 updates)."""
    n = d2.shape[0]
    if n == 1:
        return torch.zeros(1, dtype=d2.dtype, device=d2.device)
    k = min(n - 1, max(1, n - f - 2))
    off = d2 + torch.diag(torch.full((n,), float("inf"), dtype=d2.dtype, device=d2.device))
    return off.topk(k, dim=1, largest=False).values.sum(1)


def integer_max(updates: list[dict[str, Tensor]], out: dict[str, Tensor]) -> None:
    """Integer keys (``num_batches_tracked``) into ``out``: the maximum over the updates carrying them."""
    for key, pairs in by_key(updates).items():
        if not pairs[0][0].is_floating_point():
            out[key] = torch.stack([t for t, _ in pairs]).max(0).values


def fit_f(f: int, n: int, need) -> int | None:
    """The largest ``g <= f`` with ``n >= need(g)`` (None: not even ``g = 0`` fits)."""
    for g in range(f, -1, -1):
        if n >= need(g):
            return g
    return None


def select_rule(name: str, combine, updates, previous, need, condition, info=None, f: int = 0) -> dict[str, Tensor]:
    """Apply ``combine(x [n, D], info, f) -> [D]`` to every holder group. A group with fewer
    updates than ``need(f)`` (replies dropped by validation, a module few clients hold) never
    stops the run: ``f`` is lowered to the largest value ``n`` allows, or, when not even
    ``f = 0`` fits, the group keeps its previous values (the round is skipped for it); either
    with one warning line (docs/robust.md, "Too few updates")."""
    out = dict(previous) if previous is not None else {}
    for idx, keys in holder_groups(updates):
        n = len(idx)
        g = fit_f(f, n, need)
        if g != f:
            what = f"'{keys[0]}'" + (f" and {len(keys) - 1} more keys" if len(keys) > 1 else "")
            if g is None and previous is not None:
                degrade_line(name, f, n, need(0), what, condition, "the previous values kept (round skipped)")
                continue
            g = 0 if g is None else g
            degrade_line(name, f, n, need(f), what, condition, f"f lowered to {g} for this round")
            if info is not None:
                info.setdefault(f"{name}/f", []).append(g)
        vec = combine(flatten(updates, idx, keys), info, g)
        out.update(unflatten(vec, updates[idx[0]], keys))
    integer_max(updates, out)
    return out


def degrade_line(name: str, f: int, n: int, need: int, what: str, condition: str, action: str) -> None:
    """The one warning line of a rule that got fewer updates than its ``f`` needs."""
    print(f"mmfl: warning: aggregation rule '{name}' (f = {f}) got {n} updates of {what}, fewer than "
          f"{condition} needs (at least {need}): {action}", file=sys.stderr, flush=True)


def multi_krum_combine(x: Tensor, f: int, m: int, info: dict | None = None) -> Tensor:
    """Multi-Krum (Blanchard et al. 2017): the uniform mean of the ``m``
    rows of ``x`` ``[n, D]`` with the lowest Krum scores -> ``[D]`` (m = 1: Krum)."""
    chosen = krum_scores(pairwise_sq_dists(x), f).argsort()[:m]
    if info is not None:
        info.setdefault("krum/selected", []).append(chosen.tolist())
    return x[chosen].mean(0)


@AGGREGATION_RULES.register("krum", KrumParams, help="the one update with the smallest Krum score (sum of squared "
                                                     "distances to its n - f - 2 nearest), weights ignored "
                                                     "(Blanchard et al. 2017)")
def krum(updates: list[dict[str, Tensor]], weights: Any = None, previous: dict[str, Tensor] | None = None,
         f: int = 1, info: dict | None = None, **context: Any) -> dict[str, Tensor]:
    """Per holder group: the update ``argmin_i s(i)`` (:func:`krum_scores`); needs ``n > 2f + 2``."""
    return select_rule("krum", lambda x, inf, g: multi_krum_combine(x, g, 1, inf), updates, previous,
                       lambda g: 2 * g + 3, "n > 2f + 2", info, f)


@AGGREGATION_RULES.register("multi_krum", MultiKrumParams, help="uniform mean of the m updates with the smallest "
                                                                "Krum scores, weights ignored (Blanchard et al. 2017)")
def multi_krum(updates: list[dict[str, Tensor]], weights: Any = None, previous: dict[str, Tensor] | None = None,
               f: int = 1, m: int = 0, info: dict | None = None, **context: Any) -> dict[str, Tensor]:
    """Per holder group: :func:`multi_krum_combine` with ``m`` (0, or more than the group's n: ``n - f``);
    needs ``n > 2f + 2``."""
    def combine(x: Tensor, inf: dict | None, g: int) -> Tensor:
        n = x.shape[0]
        return multi_krum_combine(x, g, m if 0 < m <= n else n - g, inf)  # m > n: the n - f of m = 0

    return select_rule("multi_krum", combine, updates, previous, lambda g: 2 * g + 3, "n > 2f + 2", info, f)


def bulyan_combine(x: Tensor, f: int, info: dict | None = None) -> Tensor:
    """El Mhamdi et al. 2018 (Bulyan), on ``x`` ``[n, D]`` -> ``[D]``: (1) theta = n - 2f times, Krum on
    the remaining rows picks one, which moves to the selection S; (2) per coordinate, the mean of the
    beta = theta - 2f values of S closest to S's median."""
    d2 = pairwise_sq_dists(x)
    remaining, selected = list(range(x.shape[0])), []
    theta = x.shape[0] - 2 * f
    while len(selected) < theta:
        sub = d2[remaining][:, remaining]
        selected.append(remaining.pop(int(krum_scores(sub, f).argmin())))
    s = x[selected]  # [theta, D]
    beta = theta - 2 * f
    closest = (s - coordinate_median(s)).abs().topk(beta, dim=0, largest=False).indices  # [beta, D]
    if info is not None:
        info.setdefault("bulyan/selected", []).append(selected)
    return s.gather(0, closest).mean(0)


@AGGREGATION_RULES.register("bulyan", BulyanParams, help="Krum selection of n - 2f updates, then a coordinate-wise "
                                                         "mean of the n - 4f closest to the median, weights ignored "
                                                         "(El Mhamdi et al. 2018)")
def bulyan(updates: list[dict[str, Tensor]], weights: Any = None, previous: dict[str, Tensor] | None = None,
           f: int = 1, info: dict | None = None, **context: Any) -> dict[str, Tensor]:
    """Per holder group: :func:`bulyan_combine`; needs ``n >= 4f + 3``."""
    return select_rule("bulyan", lambda x, inf, g: bulyan_combine(x, g, inf), updates, previous,
                       lambda g: 4 * g + 3, "n >= 4f + 3", info, f)


# ----------------------------------------------------------------------------- norm clipping

def device_of(tree: dict[str, Tensor]) -> torch.device:
    """The device of the first tensor of ``tree`` (the CPU for an empty one): where a sum over it lives."""
    return next(iter(tree.values())).device if tree else CPU

def clip_scales(norms: Tensor, threshold: float) -> Tensor:
    """Sun et al. 2019 (norm thresholding): ``1 / max(1, ||dw_k|| / M)`` per update, ``[n] -> [n]``."""
    return 1.0 / torch.clamp(norms / threshold, min=1.0)


def update_norms(updates: list[dict[str, Tensor]], previous: dict[str, Tensor]) -> Tensor:
    """``||w_k - previous||_2`` over each update's floating keys, float64 ``[n]``."""
    return torch.stack([torch.sqrt(sum(((t.to(torch.float64) - previous[k].to(torch.float64)) ** 2).sum()
                                       for k, t in u.items() if t.is_floating_point())
                                   + torch.zeros((), dtype=torch.float64, device=device_of(previous)))
                        for u in updates])


def clipped_mean(name: str, updates, weights, previous, threshold_of, info=None) -> dict[str, Tensor]:
    """``previous + sum_k p_k c_k dw_k / sum_k p_k`` per key over its holders (:func:`weighted_mean`
    of the clipped updates, float64), ``c_k`` from :func:`clip_scales` with ``threshold_of(norms)``."""
    if previous is None:
        raise ValueError(f"aggregation rule '{name}' clips updates relative to the global values: it needs previous")
    for u in updates:
        missing = [k for k in u if k not in previous]
        if missing:
            raise ValueError(f"aggregation rule '{name}': key '{missing[0]}' has no previous value")
    norms = update_norms(updates, previous)
    threshold = float(threshold_of(norms))
    scales = clip_scales(norms, threshold) if threshold > 0 else torch.ones_like(norms)
    deltas = [{k: ((t.to(torch.float64) - previous[k].to(torch.float64)) * scales[i]) if t.is_floating_point() else t
               for k, t in u.items()} for i, u in enumerate(updates)]
    zero = {k: torch.zeros_like(v, dtype=torch.float64) if v.is_floating_point() else v for k, v in previous.items()}
    mean_delta = weighted_mean(deltas, weights, zero)
    out = dict(previous)
    for k, d in mean_delta.items():
        out[k] = (previous[k].to(torch.float64) + d).to(previous[k].dtype) if previous[k].is_floating_point() else d
    if info is not None:
        info["clip/threshold"] = threshold
        info["clip/clipped"] = int((scales < 1).sum())
    return out


@AGGREGATION_RULES.register("norm_clip", ClipParams, help="data-weighted mean of the updates w_k - w clipped to "
                                                          "L2 norm clip_norm (Sun et al. 2019)")
def norm_clip(updates: list[dict[str, Tensor]], weights: list[float | dict[str, float]],
              previous: dict[str, Tensor] | None = None, clip_norm: float = 1.0, info: dict | None = None,
              **context: Any) -> dict[str, Tensor]:
    """:func:`clipped_mean` with the fixed threshold ``M = clip_norm``."""
    return clipped_mean("norm_clip", updates, weights, previous, lambda norms: clip_norm, info)


@AGGREGATION_RULES.register("norm_clip_adaptive", help="norm_clip with M = the median update norm of the round "
                                                       "(Sun et al. 2019)")
def norm_clip_adaptive(updates: list[dict[str, Tensor]], weights: list[float | dict[str, float]],
                       previous: dict[str, Tensor] | None = None, info: dict | None = None,
                       **context: Any) -> dict[str, Tensor]:
    """:func:`clipped_mean` with ``M = median_k ||w_k - previous||`` (:func:`coordinate_median` of the
    norms): at least half the updates pass unchanged, none weighs more than the median."""
    return clipped_mean("norm_clip_adaptive", updates, weights, previous, coordinate_median, info)


# CreamFL's family takes rep_median / rep_trimmed_mean (mmfl.core.robust_reps); the model rules are refused
# there (check_rule), and the representation rules on model-averaging servers.
for _rule in (median, trimmed_mean, krum, multi_krum, bulyan, norm_clip, norm_clip_adaptive):
    _rule.model_states = True
