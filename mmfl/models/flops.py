"""FLOPs of one forward pass (for simulated client latency)."""

from __future__ import annotations

import math

import torch
from torch import nn


def count_flops(model: nn.Module, inputs) -> int:
    """2 x multiply-accumulates of every ``nn.Conv2d`` / ``nn.Linear`` in ``model(inputs)``.

    ``inputs`` is whatever the model takes (a modality dict, or a tensor); the
    count is for the whole batch given (divide by B for per-sample). Biases,
    activations, norms and pooling are not counted. Runs under ``no_grad`` in
    eval mode (restoring the previous mode), so BatchNorm statistics are untouched.
    Linear: ``2 * in * out`` per output row; Conv2d: ``2 * (C_in / groups) * kH * kW``
    per output element.
    """
    total = 0

    def linear_hook(mod: nn.Linear, _inp, out):
        nonlocal total
        total += 2 * mod.in_features * out.numel()

    def conv_hook(mod: nn.Conv2d, _inp, out):
        nonlocal total
        total += 2 * (mod.in_channels // mod.groups) * math.prod(mod.kernel_size) * out.numel()

    handles = []
    for m in model.modules():
        if isinstance(m, nn.Linear):
            handles.append(m.register_forward_hook(linear_hook))
        elif isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook))
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(inputs)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return int(total)
