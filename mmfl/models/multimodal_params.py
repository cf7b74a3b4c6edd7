"""The multimodal model's config table ``[model]`` (``name = "multimodal"``): its fields and checks.
The model itself is :mod:`mmfl.models.multimodal`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mmfl.errors import ConfigError
from mmfl.models.uncertainty import INIT_A, INIT_NOISE

ENCODER_KINDS = ("cnn", "mlp", "conv1d", "gru", "tokens")
PROJECTOR_KINDS = ("mlp", "linear", "none")
FUSION_KINDS = ("concat", "sum", "film", "gated")


@dataclass
class MultimodalParams:
    feat_dim: int = field(default=128, metadata={"help": "encoder / projector output size per modality"})
    encoders: dict[str, str] = field(default_factory=dict, metadata={
        "help": "modality -> 'cnn' | 'mlp' | 'conv1d' | 'gru' | 'tokens'; default: 'tokens' for token ids "
                "(the data set gives a vocabulary size), 'cnn' for (C, H, W) shapes, 'conv1d' for "
                "(channels, time), else 'mlp'"})
    cnn_channels: list[int] = field(default_factory=lambda: [32, 64], metadata={
        "help": "CNN encoder: channels of the conv3x3-BN-ReLU-maxpool blocks"})
    mlp_hidden: list[int] = field(default_factory=lambda: [256], metadata={
        "help": "MLP encoder: hidden layer sizes"})
    conv1d_channels: list[int] = field(default_factory=lambda: [64, 64], metadata={
        "help": "1-D conv encoder: channels of the conv-ReLU-maxpool2 blocks (masked mean+max pooling at the end)"})
    conv1d_kernel: int = field(default=5, metadata={"help": "1-D conv encoder: kernel size (odd)"})
    gru_hidden: int = field(default=128, metadata={"help": "GRU encoder: hidden units"})
    gru_layers: int = field(default=1, metadata={"help": "GRU encoder: stacked layers"})
    token_dim: int = field(default=64, metadata={"help": "token encoder: embedding size"})
    projector: str = field(default="mlp", metadata={
        "help": "projector kind: 'mlp' (2 layers, the paper's), 'linear' or 'none'"})
    two_projector: bool = field(default=False, metadata={
        "help": "add FedCMI's infiltration projectors (infil); their output fills missing slots"})
    fusion: str = field(default="concat", metadata={"help": "'concat' | 'sum' | 'film' | 'gated'"})
    dropout: float = field(default=0.0, metadata={"help": "dropout before the joint classifier"})
    uncertainty: bool = field(default=False, metadata={
        "help": "add PCME's per-modality log-variance heads and match scalars a, b (Chun et al. 2021; "
                "used by CreamFL's algorithm.multimodal_loss = 'pcme'); the representation stays the mean"})
    uncertainty_init_noise: float = field(default=INIT_NOISE, metadata={
        "help": "uncertainty: the samples' initial distance from their unit-norm mean (the log-variance heads' "
                "bias starts at log(s^2 / feat_dim)); 0 = PyTorch's default init, as the PCME authors' code"})
    uncertainty_init_ab: float = field(default=INIT_A, metadata={
        "help": "uncertainty: initial a = b of PCME's sigmoid(-a ||z - z'|| + b) (30: the authors' COCO and CreamFL "
                "15 under their sigma(x) = sigmoid(2x); their CUB 5 is 10 here)"})

    def __post_init__(self):
        if isinstance(self.feat_dim, bool) or not isinstance(self.feat_dim, int) or self.feat_dim < 1:
            raise ConfigError(f"model.feat_dim: must be an integer >= 1, got {self.feat_dim!r}")
        if not isinstance(self.encoders, dict):
            raise ConfigError(f"model.encoders: expected a table modality -> kind, got {self.encoders!r}")
        for m, kind in self.encoders.items():
            if kind not in ENCODER_KINDS:
                raise ConfigError(f"model.encoders: {m} must be one of {list(ENCODER_KINDS)}, got {kind!r}")
        if not self.cnn_channels or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                        for c in self.cnn_channels):
            raise ConfigError(f"model.cnn_channels: need one or more sizes >= 1, got {self.cnn_channels!r}")
        if any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in self.mlp_hidden):
            raise ConfigError(f"model.mlp_hidden: sizes must be >= 1, got {self.mlp_hidden!r}")
        if not self.conv1d_channels or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                           for c in self.conv1d_channels):
            raise ConfigError(f"model.conv1d_channels: need one or more sizes >= 1, got {self.conv1d_channels!r}")
        k = self.conv1d_kernel
        if isinstance(k, bool) or not isinstance(k, int) or k < 1 or k % 2 == 0:
            raise ConfigError(f"model.conv1d_kernel: must be an odd integer >= 1, got {k!r}")
        for name in ("gru_hidden", "gru_layers", "token_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"model.{name}: must be an integer >= 1, got {v!r}")
        if self.projector not in PROJECTOR_KINDS:
            raise ConfigError(f"model.projector: must be one of {list(PROJECTOR_KINDS)}, got {self.projector!r}")
        if not isinstance(self.two_projector, bool):
            raise ConfigError(f"model.two_projector: expected true or false, got {self.two_projector!r}")
        if self.fusion not in FUSION_KINDS:
            raise ConfigError(f"model.fusion: must be one of {list(FUSION_KINDS)}, got {self.fusion!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout: must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.uncertainty, bool):
            raise ConfigError(f"model.uncertainty: expected true or false, got {self.uncertainty!r}")
        v = self.uncertainty_init_noise
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"model.uncertainty_init_noise: must be a number >= 0, got {v!r}")
        v = self.uncertainty_init_ab
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"model.uncertainty_init_ab: must be a number > 0, got {v!r}")
