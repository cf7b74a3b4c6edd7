"""The math of personalized multimodal FL over wireless networks (paper 004): the learned
per-modality aggregation coefficients (softmax rows of xi^, masked to the uploads), the
personalized aggregate of a coefficient row, and the coefficients' gradient from the
pseudo-gradient of the round. Pure functions on tensors; the equation table is in
:mod:`mmfl.algorithms.pfedwireless`."""

from __future__ import annotations


import torch
from torch import Tensor

from mmfl.models.multimodal import branch_of

SHARED = "shared"  # group M+1: fusion + joint classifier


def exchange_group(key: str, probe: bool = True) -> str | None:
    """The parameter group of a state-dict key: its modality for a branch key, ``"shared"``
    (group M+1) otherwise; None for ``heads.<m>`` when the probes are off (never trained,
    never exchanged)."""
    b = branch_of(key)
    if b is None:
        return SHARED
    if not probe and key.startswith("heads."):
        return None
    return b


def softmax_rows(xi_hat: Tensor) -> Tensor:
    """Eq. 4: xi~_{k,k'} = exp(xi^_{k,k'}) / sum_k'' exp(xi^_{k,k''}), row by row."""
    return torch.softmax(xi_hat.to(torch.float64), dim=1)


def mask_matrix(uploaded: Tensor) -> Tensor:
    """I~ of eq. 5 from I_k (bool ``[K]``): for a device with I_k = 0, I~_kk = 1 and
    I~_{k,k'} = I~_{k',k} = 0 (k' != k); every other entry 1. So I~ = u u^T with a unit diagonal."""
    u = uploaded.to(torch.float64)
    m = torch.outer(u, u)
    m.fill_diagonal_(1.0)
    return m


def masked_coefficients(xi_hat: Tensor, uploaded: Tensor) -> Tensor:
    """Eq. 4 + 5: the aggregation coefficients xi_{k,k'} (``[K, K]``, float64). Row k of an
    uploader is the softmax renormalised over the uploaders (itself included); row k of a
    device that did not upload is e_k, and no other row gives it weight."""
    num = mask_matrix(uploaded) * softmax_rows(xi_hat)
    return num / num.sum(dim=1, keepdim=True)


def aggregate_row(coeff: Tensor, uploads: dict[int, dict[str, Tensor]]) -> dict[str, Tensor]:
    """Eq. 2: W_k = sum_k' xi_{k,k'} w_k' over the uploads (``{k': {key: tensor}}``) with
    ``coeff`` = row k of :func:`masked_coefficients`. Floating tensors are combined in float64
    and cast back; integer ones (BatchNorm's ``num_batches_tracked``) take the maximum."""
    srcs = [c for c in sorted(uploads) if float(coeff[c]) > 0]
    out = {}
    for key in uploads[srcs[0]]:
        ref = uploads[srcs[0]][key]
        if ref.is_floating_point():
            acc = torch.zeros_like(ref, dtype=torch.float64)
            for c in srcs:
                acc.add_(uploads[c][key].to(torch.float64), alpha=float(coeff[c]))
            out[key] = acc.to(ref.dtype)
        else:
            out[key] = torch.stack([uploads[c][key] for c in srcs]).max(0).values
    return out


def flat(tensors: dict[str, Tensor], keys: list[str]) -> Tensor:
    """The tensors named ``keys`` (in that order) as one float64 vector."""
    if not keys:
        return torch.zeros(0, dtype=torch.float64, device=next(iter(tensors.values())).device if tensors else "cpu")
    return torch.cat([tensors[k].reshape(-1).to(torch.float64) for k in keys])


def pseudo_gradient(w_start: Tensor, w_end: Tensor) -> Tensor:
    """The estimate of grad_W F_k(w^0) from the device's parameter change (sec. III-A):
    w^0 - w^N = eta sum_n grad F_k(w^{n-1}) by eq. 1, so a positive multiple of the gradient
    (exactly eta * grad F_k(w^0) for a single SGD step). The factor 1/(eta N_k) is left to eta^."""
    return w_start - w_end


def coefficient_gradient(coeff: Tensor, uploads: dict[int, Tensor], w_agg: Tensor, grad_w: Tensor) -> Tensor:
    """Eq. 6 for row k: ``[K]`` with entry k' = (dW_k / d xi^_{k,k'})^T grad_W.

    W_k = sum_j xi_j w_j with xi = the softmax of xi^_{k,.} over the uploaders S (eq. 4-5; the
    full softmax's denominator cancels), so dxi_j/dxi^_i = xi_j (delta_ij - xi_i) and
    dW_k/dxi^_i = xi_i (w_i - W_k) for i in S, 0 outside S. ``coeff``: row k of
    :func:`masked_coefficients`; ``uploads``: ``{k': flat w_k'}`` (the k' in S); ``w_agg``:
    flat W_k; ``grad_w``: flat grad_W F_k (:func:`pseudo_gradient`)."""
    out = torch.zeros(coeff.shape[0], dtype=torch.float64, device=coeff.device)
    for c, w in uploads.items():
        out[c] = float(coeff[c]) * float(torch.dot(w.to(torch.float64) - w_agg, grad_w))
    return out
