"""Differential privacy for what the non-averaging algorithms send (issue 27; docs/dp.md): the
per-row Gaussian mechanism (``[dp] mode = "rows"``) and DP-SGD with batch-level clipping
(``mode = "sample"`` for losses that couple the rows of a batch).

**Per-row Gaussian mechanism** (:func:`privatize_rows`). An algorithm that sends one vector per
private row (PartialFL's shared rows and embeddings, split learning's cut activations and the
U-shaped gradients) releases, for each row i, ``clip(v_i, C) + N(0, (z C)^2 I)`` with
``clip(v, C) = v min(1, C / ||v||_2)`` (the row flattened). Neighbouring data sets differ in one
row's content (replace one row); any two clipped vectors differ by at most 2C, so each release
is the Gaussian mechanism with sensitivity 2C and std z C, i.e. multiplier z / 2 (as local DP,
:func:`mmfl.core.dp.local_epsilon`). A row released k times (rounds, epochs, routes) composes k
such mechanisms without amplification (the server sees which row it gets):
:func:`row_epsilon`, Opacus's RDP accountant with (z / 2, q = 1, k).

**DP-SGD with batch-level clipping** (:func:`batch_private_gradients`). When a loss couples the
rows of a batch (FedCMI's eq. 4 ratio over the batch, CreamFL's in-batch InfoNCE negatives),
a row's "own" gradient is not defined, so per-sample clipping (Abadi et al. 2016) does not
bound one row's influence. Instead the whole Poisson batch's gradient g_B of the mean loss is
clipped to C and ``N(0, (z C)^2 I)`` added (the "microbatch = batch" case of TF Privacy's
microbatches). Removing or adding one row changes only the batch it falls in, and both clipped
gradients have norm at most C, so the step is the subsampled Gaussian mechanism at rate q with
sensitivity 2C: multiplier z / 2 in the accountant (:mod:`mmfl.core.dpsgd`'s history with
z / 2). The price: the noise is about the batch size times larger relative to the signal than
with per-sample clipping.

BatchNorm keeps running statistics computed from the rows outside the gradient; under either
mode they would reach the server unprotected, so :class:`fixed_batchnorm` runs every BatchNorm
layer in eval mode during private training: normalisation by the running statistics the client
received (or the initial ones), never updated from private rows.

Noise is drawn on the CPU from a ``torch.Generator`` seeded with a derived seed (the same noise
on every device and after a resume).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmfl.core.dp import rdp_epsilon


def clip_rows(x: Tensor, clip_norm: float) -> Tensor:
    """Each row of ``x`` ``[n, ...]`` (flattened) scaled by ``min(1, C / ||x_i||)``, in float64."""
    flat = x.reshape(x.shape[0], -1).to(torch.float64)
    norms = flat.norm(dim=1, keepdim=True)
    scale = (clip_norm / norms.clamp_min(1e-12)).clamp(max=1.0)
    return (flat * scale).reshape(x.shape)


def privatize_rows(x: Tensor, clip_norm: float, noise_multiplier: float, seed: int) -> Tensor:
    """The per-row Gaussian mechanism: ``clip(x_i, C) + N(0, (z C)^2 I)`` for every row of ``x``
    (a floating tensor ``[n, ...]``), cast back to ``x``'s dtype and device. The noise comes from a
    CPU generator seeded with ``seed``; z = 0: clipping only."""
    out = clip_rows(x, clip_norm)
    if noise_multiplier > 0:
        gen = torch.Generator(device="cpu").manual_seed(int(seed))
        noise = torch.randn(out.shape, generator=gen, dtype=torch.float64, device="cpu") * (noise_multiplier * clip_norm)
        out = out + noise.to(out.device)
    return out.to(x.dtype)


def row_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """Epsilon at ``delta`` of a row released ``releases`` times by :func:`privatize_rows` (or in a
    model update clipped to C with noise z C, the same mechanism): ``releases`` compositions of the
    Gaussian mechanism with multiplier z / 2 (sensitivity 2C), no sampling amplification."""
    return rdp_epsilon(1.0, noise_multiplier / 2.0, int(releases), delta)


def batch_private_gradients(loss: Tensor | None, params: list[Tensor], clip_norm: float, noise_multiplier: float,
                            generator: torch.Generator) -> list[Tensor]:
    """The private gradient of one step with batch-level clipping: ``g_B min(1, C / (||g_B|| +
    1e-6)) + N(0, (z C)^2 I)``, g_B the gradient of the batch's (mean) ``loss`` over all ``params``
    flattened together. ``loss`` None (an empty Poisson batch): the noise alone. The noise is
    drawn parameter by parameter with ``torch.normal`` from ``generator`` (CPU) and moved to the
    parameters' device."""
    if loss is None:
        grads = [torch.zeros_like(p) for p in params]
    else:
        got = torch.autograd.grad(loss, params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g.detach() for g, p in zip(got, params)]
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
        factor = float((clip_norm / (norm + 1e-6)).clamp(max=1.0))
        grads = [g * factor for g in grads]
    std = noise_multiplier * clip_norm
    if std > 0:
        grads = [g + torch.normal(mean=0, std=std, size=g.shape, generator=generator, dtype=g.dtype,
                                  device="cpu").to(g.device) for g in grads]
    return grads


def private_step(opt: torch.optim.Optimizer, params: list[Tensor], loss: Tensor | None, clip_norm: float,
                 noise_multiplier: float, generator: torch.Generator) -> None:
    """One optimizer step on :func:`batch_private_gradients` (the optimizer sees only the private
    gradient: post-processing)."""
    grads = batch_private_gradients(loss, params, clip_norm, noise_multiplier, generator)
    opt.zero_grad(set_to_none=True)
    for p, g in zip(params, grads):
        p.grad = g
    opt.step()


class fixed_batchnorm:
    """``with fixed_batchnorm(model):`` every BatchNorm module normalises by its running statistics
    and never updates them, whatever mode the model is put in meanwhile (its ``forward`` replaced by
    eval-mode ``F.batch_norm``); restored on exit."""

    def __init__(self, model: nn.Module):
        self.bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]

    def __enter__(self):
        for m in self.bns:
            m.forward = (lambda x, m=m: F.batch_norm(x, m.running_mean, m.running_var, m.weight, m.bias,
                                                     False, 0.0, m.eps))
        return self

    def __exit__(self, *exc):
        for m in self.bns:
            m.__dict__.pop("forward", None)
        return False


def batch_dpsgd_train(model: nn.Module, data, train, clip_norm: float, noise_multiplier: float,
                      generator: torch.Generator, noise_generator: torch.Generator, loss_fn,
                      epochs: int | None = None) -> dict:
    """DP-SGD with batch-level clipping on ``data``: ``train.local_epochs`` epochs of
    ``ceil(n / B)`` Poisson batches (rate q = min(1, B / n), :func:`mmfl.core.dpsgd.poisson_batches`
    from ``generator``), each a :func:`private_step` on ``loss_fn(model, inputs, labels)`` (the
    batch's mean loss, a scalar) with ``train``'s optimizer; BatchNorm fixed
    (:class:`fixed_batchnorm`). An empty batch, or one of a single row (a contrastive loss needs
    two), is a step of noise alone.

    Returns ``train_loss`` (mean over the steps with a loss), ``steps`` and ``sample_rate`` q;
    the accountant takes (z / 2, q, steps) (sensitivity 2C, module docstring)."""
    from mmfl.core.dpsgd import dp_loop, poisson_batches

    n = len(data)
    q, steps, params, opt = dp_loop(model, n, train, epochs)
    total, seen = 0.0, 0
    with fixed_batchnorm(model):
        for rows in poisson_batches(n, q, steps, generator):
            loss = None
            if rows.numel() >= 2:
                inputs, labels = data.get(rows.to(data.labels.device))
                loss = loss_fn(model, inputs, labels)
                total += loss.detach().double()
                seen += 1
            private_step(opt, params, loss, clip_norm, noise_multiplier, noise_generator)
    return {"train_loss": float(total) / max(seen, 1), "steps": steps, "sample_rate": q}
