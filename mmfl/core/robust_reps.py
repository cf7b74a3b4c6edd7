"""Robust rules over per-sample representations (CreamFL's family): entries of
:data:`~mmfl.core.aggregation.AGGREGATION_RULES`, the coordinate-wise statistics of
:mod:`mmfl.core.robust` over clients of ``[P, d]`` representations, in their dtype, weights
ignored (docs/robust.md)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from mmfl.core.aggregation import AGGREGATION_RULES
from mmfl.core.robust import TrimParams, coordinate_median, coordinate_trimmed_mean, per_key


@AGGREGATION_RULES.register("rep_median", help="representations [P, d]: coordinate-wise median over clients per "
                                               "sample, in their dtype, weights ignored (robust baseline to GCA)")
def rep_median(updates: list[dict[str, Tensor]], weights: Any = None, previous: dict[str, Tensor] | None = None,
               **context: Any) -> dict[str, Tensor]:
    """Each modality's ``[C, P, d]`` stack -> ``[P, d]``: :func:`coordinate_median` over clients."""
    return per_key(coordinate_median, updates, previous, dtype=None)


@AGGREGATION_RULES.register("rep_trimmed_mean", TrimParams, help="representations [P, d]: coordinate-wise trimmed "
                                                                 "mean over clients per sample, weights ignored")
def rep_trimmed_mean(updates: list[dict[str, Tensor]], weights: Any = None, previous: dict[str, Tensor] | None = None,
                     trim_fraction: float = 0.2, **context: Any) -> dict[str, Tensor]:
    """Each modality's ``[C, P, d]`` stack -> ``[P, d]``: :func:`coordinate_trimmed_mean` over clients."""
    return per_key(lambda s: coordinate_trimmed_mean(s, trim_fraction), updates, previous, dtype=None)


rep_median.per_sample = True
rep_trimmed_mean.per_sample = True
