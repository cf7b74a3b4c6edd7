"""Fusion modules of the multimodal model: how the per-modality representations of a
sample (some possibly absent) become one joint representation."""

from __future__ import annotations


import torch
from torch import Tensor, nn



# Every fusion module maps the list of slots ([B, feat_dim] each, sorted modality
# order) to [B, out_dim].


class ConcatFusion(nn.Module):
    """Concatenation of the slots (no parameters): ``out_dim = M * feat_dim``."""

    def __init__(self, feat_dim: int, num: int):
        super().__init__()
        self.out_dim = num * feat_dim

    def forward(self, slots: list[Tensor]) -> Tensor:
        return torch.cat(slots, dim=1)


class SumFusion(nn.Module):
    """Sum of the slots (no parameters): ``out_dim = feat_dim``."""

    def __init__(self, feat_dim: int, num: int):
        super().__init__()
        self.out_dim = feat_dim

    def forward(self, slots: list[Tensor]) -> Tensor:
        return torch.stack(slots, dim=0).sum(dim=0)


class FiLMFusion(nn.Module):
    """FiLM (Perez et al. 2018) as in OGM-GE: ``x = slot0``, ``y = cat(other slots)``;
    ``gamma, beta = fc(y).chunk(2)``; ``out = gamma * x + beta`` (``feat_dim``)."""

    def __init__(self, feat_dim: int, num: int):
        super().__init__()
        self.out_dim = feat_dim
        self.fc = nn.Linear((num - 1) * feat_dim, 2 * feat_dim)

    def forward(self, slots: list[Tensor]) -> Tensor:
        x, y = slots[0], torch.cat(slots[1:], dim=1)
        gamma, beta = self.fc(y).chunk(2, dim=1)
        return gamma * x + beta


class GatedFusion(nn.Module):
    """Gated fusion (Kiela et al. 2018) as in OGM-GE: ``x = slot0``, ``y = cat(other slots)``;
    ``out = sigmoid(fc_y(y)) * fc_x(x)`` (``feat_dim``)."""

    def __init__(self, feat_dim: int, num: int):
        super().__init__()
        self.out_dim = feat_dim
        self.fc_x = nn.Linear(feat_dim, feat_dim)
        self.fc_y = nn.Linear((num - 1) * feat_dim, feat_dim)

    def forward(self, slots: list[Tensor]) -> Tensor:
        x, y = slots[0], torch.cat(slots[1:], dim=1)
        return torch.sigmoid(self.fc_y(y)) * self.fc_x(x)


FUSIONS = {"concat": ConcatFusion, "sum": SumFusion, "film": FiLMFusion, "gated": GatedFusion}
