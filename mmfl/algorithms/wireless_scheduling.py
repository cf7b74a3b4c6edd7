"""Scheduling of uploads under the wireless latency model (paper 004, Algorithm 1): how many
devices upload a parameter group (K^), the value that ranks them (the coefficient mass they
would contribute against their latency), and the selection with age-of-update priority.
Pure functions on arrays; the server calls them with the latencies of
:class:`~mmfl.core.system.WirelessSystem`."""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor



def scheduled_count(k_hat: float, n: int) -> int:
    """K^ for a round of ``n`` devices: ``round(k_hat * n)`` (at least 1) for a fraction
    ``k_hat`` in (0, 1], else the count ``k_hat``."""
    if k_hat <= 1:
        return max(1, int(math.floor(k_hat * n + 0.5)))
    return int(k_hat)


def ranking_values(one_minus_self: np.ndarray, latency: np.ndarray, mode: str, alpha: float) -> np.ndarray:
    """Alg. 1 line 6 (``"ratio"``): (1 - xi~_kk) / latency; Table III (``"linear"``):
    1 - xi~_kk - alpha * latency. ``latency``: seconds, T^ParD + T^cmp + the upload term."""
    one_minus_self = np.asarray(one_minus_self, dtype=np.float64)
    latency = np.asarray(latency, dtype=np.float64)
    if mode == "ratio":
        return one_minus_self / np.maximum(latency, 1e-12)
    if mode == "linear":
        return one_minus_self - alpha * latency
    raise ValueError(f"unknown schedule {mode!r}")


def select_devices(values, eligible: list[int], count: int, age: Tensor,
                   a_th: int) -> tuple[list[int], list[int], Tensor]:
    """Alg. 1 lines 7-8 for one group: the ``count`` eligible devices with the largest
    ``values`` (ties: the lower id) are scheduled and their A_k reset to 0; the others' A_k
    grows by 1, and any with A_k >= ``a_th`` (> 0) is scheduled too and reset.
    Returns ``(scheduled, forced, new age)``; devices not eligible keep their A_k."""
    age = age.clone()
    order = sorted(range(len(eligible)), key=lambda i: (-float(values[i]), eligible[i]))
    top = {eligible[i] for i in order[:count]}
    forced = []
    for c in eligible:
        if c in top:
            age[c] = 0
            continue
        age[c] += 1
        if a_th > 0 and int(age[c]) >= a_th:
            forced.append(c)
            age[c] = 0
    return sorted(top | set(forced)), forced, age
