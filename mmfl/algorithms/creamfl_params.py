"""CreamFL's settings (:mod:`mmfl.algorithms.creamfl` has the round): ``[algorithm]`` of the
representation-exchange family (CreamFL, reamFL, FedMD, FedET, FedGEMS: presets of
:class:`CreamFLParams`) and its checks, and CreamFL's names for its aggregation rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from mmfl.algorithms.multimodal import FEDIOT_MULTIMODAL_WEIGHT
from mmfl.algorithms.pcme import SAMPLES, VIB_WEIGHT
from mmfl.algorithms.public_terms import DEFAULT_CHUNK
from mmfl.core.aggregation import AGGREGATION_RULES, check_rule, rule_params
from mmfl.errors import ConfigError

# algorithm.aggregation: CreamFL's names for its rules in mmfl.core.aggregation.AGGREGATION_RULES (any
# other registered rule may be named directly)
AGGREGATIONS = {"gca": "gca", "mean": "rep_mean", "avg": "rep_avg", "iot": "rep_iot",
                "variance": "fedet_variance", "entropy": "fedgems_entropy"}


@dataclass
class CreamFLParams:
    aggregation: str = field(default="gca", metadata={
        "help": "representation aggregation: gca (eq. 4-6), mean (rule rep_mean), avg (rep_avg: by sample "
                "count), iot (rep_iot: image-text clients x iot_weight), variance (fedet_variance: FedET), "
                "entropy (fedgems_entropy: FedGEMS), or another rule of `mmfl list aggregation`"})
    aggregation_params: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "the rule's parameters, a table checked against that rule (`mmfl list aggregation`), e.g. "
                "{trim_fraction = 0.2} for rep_trimmed_mean"})
    inter: bool = field(default=True, metadata={"help": "inter-modal contrastive regularization (eq. 1)"})
    intra: bool = field(default=True, metadata={"help": "intra-modal contrastive regularization (eq. 2)"})
    gamma: float = field(default=0.5, metadata={"help": "LCR coefficient (eq. 3; the authors' 0.5)"})
    lcr_temperature: float = field(default=0.5, metadata={
        "help": "temperature of eq. 1-2 (the authors' code divides by 0.5; the paper prints none)"})
    temperature: float = field(default=0.1, metadata={
        "help": "InfoNCE temperature of the image-text task (clients' pairs, the server's public epoch)"})
    multimodal_loss: Literal["infonce", "pcme"] = field(default="infonce", metadata={
        "help": "the image-text task of image-text clients and of the server's public epoch: infonce (CLIP's "
                "symmetric InfoNCE) or pcme (Chun et al., CVPR 2021, the authors' choice; needs "
                "model.uncertainty = true)"})
    pcme_samples: int = field(default=SAMPLES, metadata={
        "help": "pcme: Monte-Carlo samples J per embedding (eq. 4/7; the PCME authors' 7); 0 = the means only, "
                "no KL (what the CreamFL authors' code runs)"})
    pcme_vib_weight: float = field(default=VIB_WEIGHT, metadata={
        "help": "pcme: weight beta of the KL-to-N(0, I) (VIB) term, on the authors' sum scale (their COCO 1e-5)"})
    kd_weight: float = field(default=0.3, metadata={"help": "weight of the distillation MSE (eq. 7)"})
    iot_weight: float = field(default=FEDIOT_MULTIMODAL_WEIGHT, metadata={
        "help": "aggregation 'iot': weight of image-text clients (100, the CreamFL paper's FedIoT weight)"})
    entropy_temperature: float = field(default=1.0, metadata={
        "help": "aggregation 'entropy': softmax temperature over a representation's entries"})
    local_distill: Literal["none", "consensus", "global"] = field(default="none", metadata={
        "help": "before private training, fit the public set's representations to: none, the last "
                "consensus (FedMD's digest), or the server's global ones (FedET/FedGEMS)"})
    local_distill_weight: float = field(default=1.0, metadata={"help": "weight of that MSE"})
    server_lr: float = field(default=1e-3, metadata={
        "help": "server Adam learning rate (the paper: AdamP 2e-4 for ~390 steps per epoch on 50,000 public "
                "pairs; an epoch of mmfl's public sets is 5-10 steps)"})
    server_optimizer: Literal["restart", "per_phase", "shared"] = field(default="restart", metadata={
        "help": "restart: one Adam whose first moment (momentum) restarts as each server phase begins, the "
                "second moment shared (kd_weight keeps its meaning); per_phase: a separate Adam per phase "
                "(scale-free distillation steps); shared: one Adam for both phases (the authors' code; at a "
                "few steps per epoch the public epoch's momentum overshoots during distillation); "
                "see docs/algorithms/creamfl.md"})
    server_lr_schedule: Literal["cosine", "constant"] = field(default="cosine", metadata={
        "help": "server learning rate over rounds: cosine to 0 over the run's rounds (the paper's cosine "
                "scheduler; the authors step it once per round) or constant"})
    server_batch_size: int = field(default=128, metadata={"help": "server batch size on the public set"})
    server_public_epochs: int = field(default=1, metadata={
        "help": "server epochs on the public pairs per round, before the clients (Alg. 1 l. 18; 0 = off)"})
    distill_epochs: int = field(default=1, metadata={"help": "server distillation epochs per round (eq. 7)"})
    distill_norm: Literal["eval", "train"] = field(default="eval", metadata={
        "help": "normalisation layers (BatchNorm) during the distillation (eq. 7): eval = running statistics, "
                "frozen (the targets' own mode, so distilling toward the server's own representations leaves "
                "it unchanged); train = batch statistics, running ones updated (the authors' code); "
                "see docs/algorithms/creamfl.md"})
    public_size: int = field(default=0, metadata={
        "help": "use this many public pairs (a seeded subset; 0 = all): the Fig. 4 trade-off"})
    chunk: int = field(default=DEFAULT_CHUNK, metadata={"help": "rows per chunk of the |P| x |P| GCA scores"})
    exclude_positive: bool = field(default=False, metadata={
        "help": "eq. 4 as printed (denominator over j != k) instead of the authors' log-softmax"})

    def __post_init__(self):
        if self.aggregation not in AGGREGATIONS and self.aggregation not in AGGREGATION_RULES:
            raise ConfigError(f"algorithm.aggregation: unknown aggregation rule {self.aggregation!r} (CreamFL's: "
                              f"{', '.join(AGGREGATIONS)}; any of `mmfl list aggregation`)")
        check_rule(AGGREGATIONS.get(self.aggregation, self.aggregation), representations=True)
        rule_params(AGGREGATIONS.get(self.aggregation, self.aggregation), self.aggregation_params)
        if self.server_optimizer not in ("per_phase", "restart", "shared"):
            raise ConfigError(f"algorithm.server_optimizer: must be 'per_phase', 'restart' or 'shared', "
                              f"got {self.server_optimizer!r}")
        if self.server_lr_schedule not in ("cosine", "constant"):
            raise ConfigError(f"algorithm.server_lr_schedule: must be 'cosine' or 'constant', "
                              f"got {self.server_lr_schedule!r}")
        if self.local_distill not in ("none", "consensus", "global"):
            raise ConfigError(f"algorithm.local_distill: must be none, consensus or global, "
                              f"got {self.local_distill!r}")
        for key in ("gamma", "kd_weight", "local_distill_weight", "server_lr"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise ConfigError(f"algorithm.{key}: must be a number >= 0, got {v!r}")
        for key in ("lcr_temperature", "temperature", "iot_weight", "entropy_temperature"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
                raise ConfigError(f"algorithm.{key}: must be a number > 0, got {v!r}")
        for key in ("server_batch_size", "chunk"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"algorithm.{key}: must be >= 1, got {getattr(self, key)!r}")
        for key in ("server_public_epochs", "distill_epochs", "public_size"):
            if int(getattr(self, key)) < 0:
                raise ConfigError(f"algorithm.{key}: must be >= 0, got {getattr(self, key)!r}")
        for key in ("inter", "intra", "exclude_positive"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"algorithm.{key}: expected true or false, got {getattr(self, key)!r}")
        if self.distill_norm not in ("eval", "train"):
            raise ConfigError(f"algorithm.distill_norm: must be 'eval' or 'train', got {self.distill_norm!r}")
        if self.multimodal_loss not in ("infonce", "pcme"):
            raise ConfigError(f"algorithm.multimodal_loss: must be 'infonce' or 'pcme', got {self.multimodal_loss!r}")
        if isinstance(self.pcme_samples, bool) or not isinstance(self.pcme_samples, int) or self.pcme_samples < 0:
            raise ConfigError(f"algorithm.pcme_samples: must be an integer >= 0, got {self.pcme_samples!r}")
        v = self.pcme_vib_weight
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise ConfigError(f"algorithm.pcme_vib_weight: must be a number >= 0, got {v!r}")
