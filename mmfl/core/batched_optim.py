"""Stacked optimizers: SGD and Adam over parameters stacked ``[K, *shape]``, one row per client.

Each client's optimizer state is a row of the stack, like its parameters: SGD's momentum
buffer; Adam's ``exp_avg``, ``exp_avg_sq`` and step count. A step updates the rows ``sel`` of
the stack (a slice: the active prefix, updated in place through views; an index tensor: the
rows of one batch width when BatchNorm steps clients apart, gathered and written back), so a
client that has finished, or that steps in another width's group, is left untouched.

The arithmetic is that of :mod:`mmfl.core.optim` (torch's own ``SGD`` and ``Adam``,
single-tensor path) applied to every row:

- SGD (dampening 0, no Nesterov): ``g += wd * p``; ``b = momentum * b + g`` (first step
  ``b = g``); ``p -= lr * b``.
- Adam (Kingma & Ba 2015, Algorithm 1; ``weight_decay`` is torch's L2 term added to the
  gradient, not AdamW's decoupled decay): ``t += 1``; ``g += wd * p``;
  ``m = beta1 * m + (1 - beta1) * g``; ``v = beta2 * v + (1 - beta2) * g^2``;
  ``p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``.

Adam's bias correction depends on each client's own step count ``t``: counts are kept per
(parameter, client) as torch keeps ``state["step"]`` per parameter (a parameter without a
gradient at a step is not stepped, as torch skips it). Rows stepped together normally share
their count (the active clients are a prefix that has stepped at every earlier step), so
the correction is a Python float, exactly torch's; rows with different counts get a per-row
correction (the same formula, row by row).

State is created fresh for every stack, as :func:`~mmfl.core.training.local_train` makes a
fresh optimizer for every local training: nothing is carried between rounds.
"""

from __future__ import annotations

import torch
from torch import Tensor

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, which make_optimizer keeps
ADAM_EPS = 1e-8
OPTIMIZERS = ("sgd", "adam")  # the train.optimizer values stacked training implements


def state_copies(train) -> int:
    """Stacked tensors the optimizer keeps per parameter (for memory sizing)."""
    if train.optimizer == "adam":
        return 2  # exp_avg, exp_avg_sq
    return 1 if train.momentum else 0


def make_stacked_optimizer(stacked: dict[str, Tensor], trainable: list[str], train):
    """The stacked optimizer of ``train.optimizer`` over ``stacked[n]`` for ``n`` in ``trainable``."""
    if train.optimizer == "adam":
        return StackedAdam(stacked, trainable, lr=train.lr, weight_decay=train.weight_decay)
    if train.optimizer == "sgd":
        return StackedSGD(stacked, trainable, lr=train.lr, momentum=train.momentum,
                          weight_decay=train.weight_decay)
    raise ValueError(f"stacked training implements {' and '.join(OPTIMIZERS)}, not {train.optimizer!r}")


def _rows(state: dict[str, Tensor], names, sel) -> dict[str, Tensor]:
    """Rows ``sel`` of each state tensor: views for a slice, copies for an index tensor."""
    return {n: state[n][sel] for n in names}


def _write_back(state: dict[str, Tensor], part: dict[str, Tensor], sel) -> None:
    if not isinstance(sel, slice):
        for n, t in part.items():
            state[n][sel] = t


class StackedSGD:
    """``torch.optim.SGD`` (momentum, weight decay; dampening 0, no Nesterov) per row."""

    def __init__(self, stacked: dict[str, Tensor], trainable: list[str], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0):
        self.lr, self.momentum, self.wd = lr, momentum, weight_decay
        self.bufs = {n: torch.zeros_like(stacked[n]) for n in trainable} if momentum else {}

    def step(self, sel, rows, params: dict[str, Tensor], grads: dict[str, Tensor]) -> None:
        """Update ``params[n]`` (the stack rows ``sel``, in place) with ``grads[n]``; ``rows``
        is ``sel`` on the CPU (unused by SGD)."""
        mom = _rows(self.bufs, grads, sel) if self.momentum else {}
        for n, g in grads.items():
            p = params[n]
            if self.wd:
                g = g.add(p, alpha=self.wd)
            if self.momentum:
                b = mom[n]
                b.mul_(self.momentum).add_(g)  # first step: 0 * momentum + g == g, as SGD's clone
                g = b
            p.add_(g, alpha=-self.lr)
        _write_back(self.bufs, mom, sel)


class StackedAdam:
    """``torch.optim.Adam`` (L2 ``weight_decay``, no AMSGrad) per row, each row with its own
    moments and step count."""

    def __init__(self, stacked: dict[str, Tensor], trainable: list[str], lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = ADAM_BETAS, eps: float = ADAM_EPS):
        self.lr, self.wd, self.eps = lr, weight_decay, eps
        self.beta1, self.beta2 = betas
        self.names = list(trainable)
        self.exp_avg = {n: torch.zeros_like(stacked[n]) for n in trainable}
        self.exp_avg_sq = {n: torch.zeros_like(stacked[n]) for n in trainable}
        k = next(iter(stacked.values())).shape[0] if stacked else 0
        # step counts [parameter, client] on the CPU (bias corrections are host arithmetic, as
        # torch's Adam reads its CPU step tensor)
        self.steps = torch.zeros(len(self.names), k, dtype=torch.long, device="cpu")

    def step(self, sel, rows, params: dict[str, Tensor], grads: dict[str, Tensor]) -> None:
        """Update ``params[n]`` (the stack rows ``sel``, in place) with ``grads[n]``; ``rows``
        is ``sel`` on the CPU (a slice, or an index tensor)."""
        if len(grads) == len(self.names):
            self.steps[:, rows] += 1
        else:  # a parameter without a gradient is not stepped (torch's Adam skips it)
            self.steps[:, rows] += torch.tensor([n in grads for n in self.names], device="cpu").long()[:, None]
        counts = self.steps[:, rows]
        lo, hi = counts.amin(1).tolist(), counts.amax(1).tolist()
        m1, m2 = _rows(self.exp_avg, grads, sel), _rows(self.exp_avg_sq, grads, sel)
        b1, b2 = self.beta1, self.beta2
        for i, n in enumerate(self.names):
            g = grads.get(n)
            if g is None:
                continue
            p, exp_avg, exp_avg_sq = params[n], m1[n], m2[n]
            if self.wd:
                g = g.add(p, alpha=self.wd)
            exp_avg.lerp_(g, 1 - b1)
            exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)
            if lo[i] == hi[i]:  # one step count for every row: torch's scalar arithmetic
                t = float(lo[i])
                bias_correction2_sqrt = (1 - b2 ** t) ** 0.5
                denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
                p.addcdiv_(exp_avg, denom, value=-(self.lr / (1 - b1 ** t)))
            else:  # rows at different counts: the same formula with per-row corrections
                t = counts[i].double()
                shape = (-1,) + (1,) * (p.dim() - 1)
                bias_correction2_sqrt = ((1 - b2 ** t) ** 0.5).to(p.dtype).to(p.device).view(shape)
                neg_step = (-(self.lr / (1 - b1 ** t))).to(p.dtype).to(p.device).view(shape)
                denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
                p.add_(exp_avg.mul(neg_step).div_(denom))  # addcdiv: p + (value * m) / denom
        _write_back(self.exp_avg, m1, sel)
        _write_back(self.exp_avg_sq, m2, sel)
