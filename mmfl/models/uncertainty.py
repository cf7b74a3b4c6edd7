"""PCME's learnable parts that live in a model (Chun et al., "Probabilistic Embeddings for
Cross-Modal Retrieval", CVPR 2021): a log-variance head per modality and the two scalars
``a``, ``b`` of the match probability. The math that uses them is in
:mod:`mmfl.algorithms.pcme`; a :class:`~mmfl.models.multimodal.MultimodalModel` built with
``uncertainty = true`` holds one :class:`UncertaintyHeads` as ``model.uncertainty``
(state-dict keys ``uncertainty.logvar.<m>.weight|bias``, ``uncertainty.a``, ``uncertainty.b``).

Each modality's embedding is a Gaussian ``N(mu, diag(sigma^2))`` (PCME sec. 3.2.1, eq. 6):
``mu`` is the model's L2-normalised projector output (the representation every algorithm
already uses), and ``log sigma^2 = logvar[m](f)`` is read from the same encoder feature ``f``
the projector reads (PCME's h^sigma beside h^mu on the shared backbone feature). As in PCME
("Module for mu versus sigma"), the variance head has no sigmoid, LayerNorm or L2
projection: a plain ``Linear(feat_dim, feat_dim)``.

Its initial scale (the paper prints none): PyTorch's default init, which the PCME and CreamFL
authors' heads have, gives ``log sigma^2`` around 0, i.e. samples about ``sqrt(feat_dim)``
away from a unit-norm mean -- noise that swamps every distance until the heads have learnt
to shrink it, which takes the authors' ~10^5 steps but more than a few hundred. With
``init_noise = s > 0`` the heads' bias starts at ``log(s^2 / feat_dim)``, so the samples
start at distance about ``s`` from their mean (weights keep the default init, so the variance
still differs per item). The default ``s = 0.1`` and the measurement behind it are on
``docs/algorithms/creamfl.md`` (PCME section); ``s = 0`` keeps the authors' init.
"""

from __future__ import annotations

import math

import torch
from torch import nn

# Initial a, b of p(m | z, z') = sigmoid(-a ||z - z'|| + b) (PCME eq. 5). The authors' COCO and
# CreamFL configs start at init_negative_scale = init_shift = 15 with sigma(x) = e^x / (e^x + e^-x)
# = sigmoid(2x); with the logistic sigmoid the paper writes, a = b = 30 gives the same initial
# match probabilities (0.5 at distance 1, i.e. at orthogonal unit means).
INIT_A = 30.0
INIT_B = 30.0
INIT_NOISE = 0.1  # initial distance of a sample from its unit-norm mean (see the module doc)

__all__ = ["INIT_A", "INIT_B", "INIT_NOISE", "UncertaintyHeads"]


class UncertaintyHeads(nn.Module):
    """``logvar[m]``: ``[B, dim] -> [B, dim]`` (log sigma^2 per entry) for each modality ``m``;
    ``a``, ``b``: scalar parameters of the match probability (PCME eq. 5)."""

    def __init__(self, modalities, dim: int, init_noise: float = INIT_NOISE, init_a: float = INIT_A,
                 init_b: float = INIT_B):
        super().__init__()
        self.logvar = nn.ModuleDict({m: nn.Linear(dim, dim) for m in modalities})
        if init_noise > 0:
            for head in self.logvar.values():
                nn.init.constant_(head.bias, math.log(init_noise ** 2 / dim))
        self.a = nn.Parameter(torch.tensor(float(init_a)))
        self.b = nn.Parameter(torch.tensor(float(init_b)))

    def drop(self, modality: str) -> None:
        """Delete the head of a modality the model does not hold."""
        if modality in self.logvar:
            del self.logvar[modality]
