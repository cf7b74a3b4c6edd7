"""An MLP over one or more feature-vector modalities (flattened and concatenated)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from mmfl.data.base import DatasetMeta
from mmfl.errors import ConfigError
from mmfl.models import MODELS
from mmfl.models.cnn import RepClassifier


class MLP(RepClassifier):
    """Inputs ``{m: [B, *shape_m]}`` -> concat ``[B, sum prod(shape_m)]`` -> (Linear, ReLU, Dropout) x len(hidden).

    Outputs: logits ``[B, num_classes]``; features ``[B, hidden[-1]]`` (the
    input itself if ``hidden`` is empty); rep = features, or ``[B, out_dim]``
    with the projection head.
    """

    def __init__(self, modalities: list[str], in_dim: int, num_classes: int, hidden: list[int],
                 dropout: float = 0.0, projection_head: bool = False, out_dim: int = 128):
        dims = [in_dim, *hidden]
        super().__init__(dims[-1], num_classes, projection_head, out_dim)
        self.modalities = list(modalities)
        layers: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()] + ([nn.Dropout(dropout)] if dropout > 0 else [])
        self.features = nn.Sequential(*layers)

    def take(self, inputs: dict[str, Tensor]) -> Tensor:
        return torch.cat([inputs[m].flatten(1).float() for m in self.modalities], dim=1)


@dataclass
class MLPParams:
    modalities: list[str] = field(default_factory=list,
                                  metadata={"help": "modalities to concatenate; empty = all, sorted by name"})
    hidden: list[int] = field(default_factory=lambda: [256, 128], metadata={"help": "hidden layer sizes"})
    dropout: float = field(default=0.0, metadata={"help": "dropout after each hidden layer"})
    projection_head: bool = field(default=False, metadata={"help": "add MOON's 2-layer projection head"})
    out_dim: int = field(default=128, metadata={"help": "projection-head output size (rep)"})

    def __post_init__(self):
        if any(h < 1 for h in self.hidden):
            raise ConfigError(f"model.hidden: sizes must be >= 1, got {self.hidden}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout: must be in [0, 1), got {self.dropout}")
        if self.out_dim < 1:
            raise ConfigError(f"model.out_dim: must be >= 1, got {self.out_dim}")


@MODELS.register("mlp", MLPParams, help="MLP over the concatenated (flattened) feature modalities")
def mlp(params: MLPParams, meta: DatasetMeta) -> MLP:
    mods = list(params.modalities) or sorted(meta.modalities)
    unknown = [m for m in mods if m not in meta.modalities]
    if unknown:
        raise ConfigError(f"model.modalities: unknown modality {unknown[0]!r} for data set "
                          f"'{meta.name}' (has: {', '.join(sorted(meta.modalities)) or 'none'})")
    if len(set(mods)) != len(mods):
        raise ConfigError(f"model.modalities: listed twice in {mods}")
    if not mods:
        raise ConfigError(f"model.modalities: data set '{meta.name}' has no modalities")
    in_dim = sum(math.prod(meta.modalities[m]) for m in mods)
    return MLP(mods, in_dim, meta.num_classes, params.hidden, params.dropout, params.projection_head, params.out_dim)
