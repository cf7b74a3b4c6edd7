"""MOON's simple CNN (QinbinLi/MOON ``ModelFedCon`` with the ``SimpleCNN`` base).

Also holds the pieces every image/vector model here shares: picking the input
modality from a :class:`~mmfl.data.base.DatasetMeta`, the 2-layer projection
head and the ``features -> projection -> classifier`` wrapper.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from mmfl.data.base import DatasetMeta
from mmfl.errors import ConfigError
from mmfl.models import MODELS


def image_modality(meta: DatasetMeta, name: str, kind: str = "model") -> tuple[str, tuple[int, int, int]]:
    """The image-like modality to use and its shape as ``(C, H, W)``.

    ``name == ""`` picks the data set's only image-like modality (per-sample
    shape ``(C, H, W)`` or ``(H, W)``; the latter gets one channel).
    Raises ConfigError when ``name`` is unknown / not image-like, or when
    ``name`` is empty and there is no or more than one candidate.
    """
    images = {m: s for m, s in meta.modalities.items() if len(s) in (2, 3)}
    if name:
        if name not in meta.modalities:
            raise ConfigError(f"{kind}.modality: unknown modality {name!r} for data set "
                              f"'{meta.name}' (has: {', '.join(sorted(meta.modalities)) or 'none'})")
        if name not in images:
            raise ConfigError(f"{kind}.modality: {name!r} has shape {tuple(meta.modalities[name])}, "
                              f"not an image (C, H, W) or (H, W)")
    else:
        if len(images) != 1:
            what = "no image-like modality" if not images else f"several image-like modalities ({', '.join(sorted(images))})"
            raise ConfigError(f"{kind}.modality: data set '{meta.name}' has {what}; set modality")
        name = next(iter(images))
    shape = tuple(int(d) for d in images[name])
    return name, (shape if len(shape) == 3 else (1, *shape))  # type: ignore[return-value]


class ProjectionHead(nn.Module):
    """MOON's head: ``[B, d] -> l1 (d->d) -> ReLU -> l2 (d->out_dim) -> [B, out_dim]``."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.l1 = nn.Linear(in_dim, in_dim)
        self.l2 = nn.Linear(in_dim, out_dim)

    def forward(self, h: Tensor) -> Tensor:
        return self.l2(torch.relu(self.l1(h)))


class RepClassifier(nn.Module):
    """``features`` (input -> ``[B, d]``), optional ``projection`` (``[B, d] -> [B, out_dim]``),
    ``classifier`` (rep -> ``[B, num_classes]``).

    ``forward(inputs: dict[str, Tensor])`` returns ``{"logits", "rep", "features"}``.
    Subclasses set ``self.features`` and implement :meth:`take` (the input tensor).
    """

    def __init__(self, feat_dim: int, num_classes: int, projection_head: bool, out_dim: int):
        super().__init__()
        if projection_head and out_dim < 1:
            raise ConfigError(f"model.out_dim: must be >= 1, got {out_dim}")
        self.feat_dim = feat_dim
        self.projection = ProjectionHead(feat_dim, out_dim) if projection_head else None
        self.classifier = nn.Linear(out_dim if projection_head else feat_dim, num_classes)

    def take(self, inputs: dict[str, Tensor]) -> Tensor:
        raise NotImplementedError

    def forward(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        h = self.features(self.take(inputs))
        rep = self.projection(h) if self.projection is not None else h
        return {"logits": self.classifier(rep), "rep": rep, "features": h}


class ImageModel(RepClassifier):
    """A :class:`RepClassifier` reading one image modality, ``[B, C, H, W]`` (or ``[B, H, W]``)."""

    def __init__(self, modality: str, shape: tuple[int, int, int], *args):
        super().__init__(*args)
        self.modality, self.shape = modality, tuple(shape)

    def take(self, inputs: dict[str, Tensor]) -> Tensor:
        x = inputs[self.modality]
        return x.unsqueeze(1) if x.dim() == 3 else x


def _conv_out(n: int) -> int:
    """Spatial size after conv 5 (valid) then maxpool 2."""
    return (n - 4) // 2


class SimpleCNNBase(nn.Module):
    """``[B, C, H, W] -> [B, 84]``: conv(C,6,5) ReLU pool2 conv(6,16,5) ReLU pool2 fc120 ReLU fc84 ReLU."""

    def __init__(self, c: int, h: int, w: int):
        super().__init__()
        fh, fw = _conv_out(_conv_out(h)), _conv_out(_conv_out(w))
        if fh < 1 or fw < 1:
            raise ConfigError(f"model 'simple_cnn': input {h}x{w} is too small (needs at least 16x16)")
        self.conv1 = nn.Conv2d(c, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(16 * fh * fw, 120)
        self.fc2 = nn.Linear(120, 84)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.relu(self.fc1(x.flatten(1)))
        return torch.relu(self.fc2(x))


class SimpleCNN(ImageModel):
    """MOON's ``ModelFedCon(simple-cnn)``: logits ``[B, C]``, rep ``[B, out_dim]``, features ``[B, 84]``."""

    def __init__(self, modality: str, shape: tuple[int, int, int], num_classes: int,
                 projection_head: bool = True, out_dim: int = 256):
        super().__init__(modality, shape, 84, num_classes, projection_head, out_dim)
        self.features = SimpleCNNBase(*shape)


@dataclass
class SimpleCNNParams:
    modality: str = field(default="", metadata={"help": "image modality; empty = the data set's only image-like one"})
    out_dim: int = field(default=256, metadata={"help": "projection-head output size (rep)"})
    projection_head: bool = field(default=True, metadata={"help": "false: rep = the 84-d features"})

    def __post_init__(self):
        if self.out_dim < 1:
            raise ConfigError(f"model.out_dim: must be >= 1, got {self.out_dim}")


@MODELS.register("simple_cnn", SimpleCNNParams,
                 help="MOON's simple CNN (2 conv + fc 120/84) with a 2-layer projection head")
def simple_cnn(params: SimpleCNNParams, meta: DatasetMeta) -> SimpleCNN:
    name, shape = image_modality(meta, params.modality)
    return SimpleCNN(name, shape, meta.num_classes, params.projection_head, params.out_dim)
