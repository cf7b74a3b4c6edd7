"""Client-level differential privacy (issue 15, item 3; docs/dp.md): clipping, Gaussian noise and
the privacy accountant, as small pure functions.

- Central DP (DP-FedAvg, McMahan et al., ICLR 2018, Algorithm 1 with fixed clipping): the server
  clips every update ``dw_k = w_k - w^t`` to L2 norm C, sums them, adds ``N(0, (z C)^2 I)`` and
  divides by the fixed cohort size n (uniform weights, :func:`central_dp_mean`). One client's
  presence changes the sum by at most C, so the round is the Gaussian mechanism with noise
  multiplier z on a subsample of rate q = n / N; epsilon comes from the RDP accountant of the
  subsampled Gaussian mechanism (:func:`central_epsilon`).
- Local DP: each client clips its own update and adds ``N(0, (z C)^2 I)`` to it before sending
  (:func:`local_privatize`). Any two updates of one client differ by at most 2C after clipping,
  so each report is the Gaussian mechanism with noise multiplier z / 2, without amplification by
  sampling (the server sees who sent); epsilon composes over the rounds a client took part in
  (:func:`local_epsilon`).

The noise is drawn from a ``torch.Generator`` seeded by the caller with a derived seed
(:func:`mmfl.seeds.derive_seed`), key by key in sorted order, so a resumed run draws the same.
Updates are computed in float64 and the result cast back to each key's dtype; integer tensors
(BatchNorm's ``num_batches_tracked``) take the maximum over the updates, as in ``weighted_mean``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mmfl.core.robust import clip_scales, device_of, integer_max


def update_deltas(updates: list[dict[str, Tensor]], previous: dict[str, Tensor]) -> list[dict[str, Tensor]]:
    """``w_k - w^t`` in float64 for each update's floating keys (``previous``: ``w^t``); every update
    must carry the same floating keys, all of them in ``previous``."""
    keys = None
    out = []
    for u in updates:
        own = sorted(k for k, t in u.items() if t.is_floating_point())
        if keys is None:
            keys = own
        elif own != keys:
            raise ValueError("differential privacy needs every update to carry the same keys "
                             f"({len(own)} vs {len(keys)}); clients holding only some modules are not supported")
        missing = [k for k in own if k not in previous]
        if missing:
            raise ValueError(f"differential privacy: key '{missing[0]}' has no global value")
        out.append({k: u[k].to(torch.float64) - previous[k].to(torch.float64) for k in own})
    return out


def flat_norm(delta: dict[str, Tensor]) -> Tensor:
    """The L2 norm of a whole update (all its keys flattened together), a float64 scalar."""
    return torch.sqrt(sum((t ** 2).sum() for t in delta.values())
                      + torch.zeros((), dtype=torch.float64, device=device_of(delta)))


def clip_update(delta: dict[str, Tensor], clip_norm: float) -> tuple[dict[str, Tensor], float]:
    """McMahan et al. 2018, ``ClipFn`` (flat clipping): ``dw * min(1, C / ||dw||)`` over all the keys
    together -> (clipped update, the norm before clipping). Scaling from ``mmfl.core.robust.clip_scales``."""
    norm = flat_norm(delta)
    scale = clip_scales(norm.reshape(1), clip_norm)[0]
    return {k: t * scale for k, t in delta.items()}, float(norm)


def gaussian_like(like: dict[str, Tensor], std: float, seed: int) -> dict[str, Tensor]:
    """``N(0, std^2)`` noise of each key's shape, float64, drawn key by key in sorted order from a
    generator seeded with ``seed``, on the CPU (the same noise on every device), then moved to
    ``like[k]``'s device."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    return {k: (torch.randn(like[k].shape, generator=gen, dtype=torch.float64, device="cpu") * std).to(like[k].device)
            for k in sorted(like)}


def _apply(previous: dict[str, Tensor], delta: dict[str, Tensor], updates: list[dict[str, Tensor]]
           ) -> dict[str, Tensor]:
    """``previous + delta`` per floating key (cast back to its dtype); integer keys: max over updates."""
    out = dict(previous)
    for k, d in delta.items():
        out[k] = (previous[k].to(torch.float64) + d).to(previous[k].dtype)
    integer_max(updates, out)
    return out


def central_dp_mean(updates: list[dict[str, Tensor]], previous: dict[str, Tensor], clip_norm: float,
                    noise_multiplier: float, seed: int, denominator: int | None = None,
                    info: dict | None = None) -> dict[str, Tensor]:
    """DP-FedAvg's server step (McMahan et al. 2018, Alg. 1, with uniform weights and the fixed
    denominator n): ``w^t + (sum_k clip(dw_k, C) + N(0, (z C)^2 I)) / n``.

    ``denominator`` n: the cohort size the server sampled (default ``len(updates)``); a dropped
    reply counts as a zero update, so the sensitivity of the mean stays C / n. ``info`` gets
    ``dp/clipped`` (updates scaled down) and ``dp/update_norm`` (their mean norm before clipping;
    a diagnostic of the clients' raw updates, not private)."""
    n = denominator or len(updates)
    clipped, norms = [], []
    for d in update_deltas(updates, previous):
        c, norm = clip_update(d, clip_norm)
        clipped.append(c)
        norms.append(norm)
    keys = list(clipped[0]) if clipped else []
    total = {k: sum(c[k] for c in clipped) for k in keys}
    noise = gaussian_like(total, noise_multiplier * clip_norm, seed) if noise_multiplier > 0 else None
    mean = {k: (total[k] + (noise[k] if noise is not None else 0.0)) / n for k in keys}
    if info is not None:
        info["dp/clipped"] = sum(1 for x in norms if x > clip_norm)
        info["dp/update_norm"] = float(sum(norms) / max(1, len(norms)))
    return _apply(previous, mean, updates)


def local_privatize(update: dict[str, Tensor], previous: dict[str, Tensor], clip_norm: float,
                    noise_multiplier: float, seed: int) -> dict[str, Tensor]:
    """A client's local randomizer: ``w^t + clip(w_k - w^t, C) + N(0, (z C)^2 I)`` on the floating
    keys it shares with ``previous`` (the model it received); other keys pass unchanged."""
    shared = {k: t for k, t in update.items() if t.is_floating_point() and k in previous}
    (delta,) = update_deltas([shared], previous)
    clipped, _ = clip_update(delta, clip_norm)
    if noise_multiplier > 0:
        noise = gaussian_like(clipped, noise_multiplier * clip_norm, seed)
        clipped = {k: clipped[k] + noise[k] for k in clipped}
    out = dict(update)
    for k, d in clipped.items():
        out[k] = (previous[k].to(torch.float64) + d).to(update[k].dtype)
    return out


# ----------------------------------------------------------------------------- accounting (Opacus's RDP accountant)

def rdp_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    """Epsilon at ``delta`` after ``steps`` compositions of the Poisson-subsampled Gaussian mechanism
    with ``noise_multiplier`` at ``sample_rate`` (Mironov et al. 2019), by Opacus's RDP accountant
    (``opacus.accountants.RDPAccountant``, its default orders). 0 steps: 0; no noise: inf."""
    if steps <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    from opacus.accountants import RDPAccountant  # imported here: only runs with [dp] need it

    acc = RDPAccountant()
    acc.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    return float(acc.get_epsilon(delta=delta))


def central_epsilon(sample_rate: float, noise_multiplier: float, rounds: int, delta: float) -> float:
    """Central DP-FedAvg after ``rounds`` rounds, each sampling clients at rate q = n / N: the
    subsampled Gaussian mechanism with multiplier z (sensitivity C of the clipped sum, add/remove
    one client)."""
    return rdp_epsilon(sample_rate, noise_multiplier, rounds, delta)


def local_epsilon(noise_multiplier: float, participations: int, delta: float) -> float:
    """Local DP after a client sent ``participations`` noised updates: each is the Gaussian
    mechanism with sensitivity 2C (any two clipped updates) and std z C, i.e. multiplier z / 2,
    composed without sampling amplification (q = 1)."""
    return rdp_epsilon(1.0, noise_multiplier / 2.0, participations, delta)


def client_epsilon_metrics(dp, dp_epsilon) -> dict[str, float]:
    """The metrics row of the clients' own accountants (DP-SGD, ``mode = "rows"``): ``dp/epsilon``,
    the largest epsilon of any client so far, ``dp/epsilon_mean``, the mean over the clients that
    have trained (``dp_epsilon > 0``), and ``dp/delta``. With ``noise_multiplier = 0`` epsilon is
    inf (clients send none: a reply's scalars must be finite)."""
    trained = dp_epsilon[dp_epsilon > 0] if dp_epsilon is not None else torch.zeros(0, device="cpu")
    if dp.noise_multiplier == 0:
        eps = mean = float("inf")
    else:
        eps = float(trained.max()) if trained.numel() else 0.0
        mean = float(trained.mean()) if trained.numel() else 0.0
    return {"dp/epsilon": eps, "dp/epsilon_mean": mean, "dp/delta": dp.delta}
