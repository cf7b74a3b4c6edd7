"""A small CIFAR-style ResNet (He et al. 2016, the 6n+2 layout) with MOON's projection head.

``depth`` 8 / 14 / 20 gives n = 1 / 2 / 3 BasicBlocks in each of three stages
of widths ``16w / 32w / 64w`` (strides 1 / 2 / 2) after a 3x3 stem; then
global average pooling, so any input H x W works.

Normalisation (``norm``): ``"batch"`` is the usual choice but its running
statistics are local to each client and averaging them under non-IID data
hurts (Hsieh et al., 2020, "The Non-IID Data Quagmire"); ``"group"``
(GroupNorm with ``norm_groups`` groups, no running state) is the FL-friendly
choice; ``"none"`` drops normalisation (convolutions then get biases).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from mmfl.data.base import DatasetMeta
from mmfl.errors import ConfigError
from mmfl.models import MODELS
from mmfl.models.cnn import ImageModel, image_modality

Norm = Literal["batch", "group", "none"]


def _norm(kind: str, channels: int, groups: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(groups, channels)
    return nn.Identity()


class BasicBlock(nn.Module):
    """``[B, c_in, H, W] -> [B, c_out, H/stride, W/stride]``: two 3x3 convs + (1x1 conv) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: str, groups: int):
        super().__init__()
        bias = norm == "none"
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=bias)
        self.bn1 = _norm(norm, c_out, groups)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=bias)
        self.bn2 = _norm(norm, c_out, groups)
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=bias), _norm(norm, c_out, groups))

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNetBase(nn.Module):
    """``[B, C, H, W] -> [B, 64 * width]``: stem, 3 stages of n blocks, global avg pool."""

    def __init__(self, c_in: int, depth: int, width: int, norm: str, groups: int):
        super().__init__()
        n = (depth - 2) // 6
        widths = [16 * width, 32 * width, 64 * width]
        bias = norm == "none"
        self.stem = nn.Sequential(nn.Conv2d(c_in, widths[0], 3, 1, 1, bias=bias), _norm(norm, widths[0], groups),
                                  nn.ReLU())
        blocks, c = [], widths[0]
        for i, wd in enumerate(widths):
            for j in range(n):
                blocks.append(BasicBlock(c, wd, 2 if (i > 0 and j == 0) else 1, norm, groups))
                c = wd
        self.blocks = nn.Sequential(*blocks)
        self.out_dim = c

    def forward(self, x: Tensor) -> Tensor:
        return self.blocks(self.stem(x)).mean(dim=(2, 3))


class ResNet(ImageModel):
    """logits ``[B, num_classes]``, rep ``[B, out_dim]`` (or ``[B, 64w]``), features ``[B, 64w]``."""

    def __init__(self, modality: str, shape: tuple[int, int, int], num_classes: int, depth: int = 8,
                 width: int = 1, norm: str = "batch", norm_groups: int = 2, projection_head: bool = True,
                 out_dim: int = 256):
        super().__init__(modality, shape, 64 * width, num_classes, projection_head, out_dim)
        self.features = ResNetBase(shape[0], depth, width, norm, norm_groups)


@dataclass
class ResNetParams:
    modality: str = field(default="", metadata={"help": "image modality; empty = the data set's only image-like one"})
    depth: int = field(default=8, metadata={"help": "6n+2 layers: 8, 14 or 20"})
    width: int = field(default=1, metadata={"help": "channel multiplier (stages 16w/32w/64w)"})
    norm: Norm = field(default="batch", metadata={"help": "batch | group (FL-friendly, no running stats) | none"})
    norm_groups: int = field(default=2, metadata={"help": "GroupNorm groups (norm = group); must divide 16*width"})
    out_dim: int = field(default=256, metadata={"help": "projection-head output size (rep)"})
    projection_head: bool = field(default=True, metadata={"help": "false: rep = the pooled 64w-d features"})

    def __post_init__(self):
        if self.depth not in (8, 14, 20):
            raise ConfigError(f"model.depth: must be 8, 14 or 20, got {self.depth}")
        if self.width < 1:
            raise ConfigError(f"model.width: must be >= 1, got {self.width}")
        if self.norm == "group" and (self.norm_groups < 1 or (16 * self.width) % self.norm_groups):
            raise ConfigError(f"model.norm_groups: must divide {16 * self.width}, got {self.norm_groups}")
        if self.out_dim < 1:
            raise ConfigError(f"model.out_dim: must be >= 1, got {self.out_dim}")


@MODELS.register("resnet", ResNetParams,
                 help="small CIFAR-style ResNet-8/14/20 (batch/group/no norm) with a 2-layer projection head")
def resnet(params: ResNetParams, meta: DatasetMeta) -> ResNet:
    name, shape = image_modality(meta, params.modality)
    return ResNet(name, shape, meta.num_classes, params.depth, params.width, params.norm, params.norm_groups,
                  params.projection_head, params.out_dim)
