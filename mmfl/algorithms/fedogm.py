"""FedOGM: multimodal FedAvg with OGM-GE in local training (FedCMI section 4.1, baseline 2).

OGM-GE (Peng et al., CVPR 2022, "Balanced multimodal learning via on-the-fly
gradient modulation") slows down the modality that dominates a mini-batch.
Per local step, on the batch's samples that hold all of the client's modalities:

    s_m   = sum_k softmax(out_m(x_k))[y_k]                       (OGM-GE eq. 9)
    rho   = s_dom / mean_{m != dom} s_m,  dom = argmax_m s_m      (eq. 10; M = 2: s_a / s_v)
    k_dom = 1 - tanh(alpha * rho) if rho > 1,  k_m = 1 otherwise  (eq. 11, as OGM-GE and FedCMI's code)
    g_m  <- k_m * g_m  (+ N(0, std(g_m)^2) with GE)               (eq. 12 and the GE noise)

for the gradient ``g_m`` of each parameter tensor of modality ``m``'s encoder,
between backward and the optimizer step (:meth:`FedOGMClient.before_step`). The
server is MFedAvg's (module-wise FedAvg); a client holding one modality trains
exactly as in MFedAvg.

``out_m`` (the per-modality output). OGM-GE splits the weights of the joint
classifier of a concat fusion into the parts that multiply each modality's slot,
``out_m = z_m W_m^T + b / 2``. That split exists only for concat fusion (not for
sum / FiLM / gated). Here ``out_m`` is by default ``heads[m](z_m.detach())``, the
per-modality head trained as a linear probe by every multimodal baseline (see
:mod:`mmfl.algorithms.multimodal`). It works for every fusion and is the classifier
behind ``accuracy/<m>``. ``score = "classifier"`` uses OGM-GE's split instead,
``z_m W_m^T + b / M``, and needs concat fusion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from mmfl.algorithms.registry import register
from mmfl.algorithms.multimodal import MFedAvgClient, MFedAvgParams, MultimodalServer
from mmfl.errors import ConfigError

__all__ = ["FedOGMClient", "FedOGMParams", "FedOGMServer", "modality_outputs", "modulate_gradients",
           "ogm_coefficients", "true_class_scores"]

NOISE_STREAM = 0x06A1_0E6E  # mixed into ctx.seed for the GE noise generator (independent of batch shuffling)


@dataclass
class FedOGMParams(MFedAvgParams):
    alpha: float = field(default=0.8, metadata={
        "help": "modulation strength alpha (OGM-GE eq. 11); the authors recommend 0.8 for CREMA-D, 0.1 for VGGSound"})
    ge: bool = field(default=True, metadata={
        "help": "generalization enhancement: add N(0, std(grad)^2) noise to the modulated encoders' gradients"})
    score: Literal["head", "classifier"] = field(default="head", metadata={
        "help": "per-modality output for the scores s_m: 'head' = heads[m] on the detached z_m (any fusion), "
                "'classifier' = the joint classifier's slice for modality m + bias/M (OGM-GE's split; concat fusion)"})
    modulate_proj: bool = field(default=False, metadata={
        "help": "also modulate the projector proj[m] (OGM-GE modulates the encoder only)"})
    modulation_start_round: int = field(default=0, metadata={
        "help": "first round (0-based) with modulation"})
    modulation_end_round: int = field(default=0, metadata={
        "help": "modulate in rounds < this one (0 = no end); OGM-GE's modulation_starts/ends, in rounds"})

    def __post_init__(self):
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha >= 0:
            raise ConfigError(f"algorithm.alpha: must be >= 0, got {self.alpha!r}")
        if not isinstance(self.ge, bool):
            raise ConfigError(f"algorithm.ge: expected true or false, got {self.ge!r}")
        if self.score not in ("head", "classifier"):
            raise ConfigError(f"algorithm.score: must be 'head' or 'classifier', got {self.score!r}")
        if self.score == "head" and not self.probe:
            raise ConfigError("algorithm.score: 'head' reads the per-modality heads, which only train with "
                              "probe = true; set probe = true or score = \"classifier\"")
        for name in ("modulation_start_round", "modulation_end_round"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"algorithm.{name}: must be an integer >= 0, got {v!r}")
        if self.modulation_end_round and self.modulation_end_round <= self.modulation_start_round:
            raise ConfigError(f"algorithm.modulation_end_round: must be 0 (no end) or > modulation_start_round "
                              f"({self.modulation_start_round}), got {self.modulation_end_round}")


# ----------------------------------------------------------------------------- the arithmetic


def true_class_scores(logits: dict[str, Tensor], labels: Tensor, mask: Tensor | None = None) -> dict[str, float]:
    """``s_m = sum_k softmax(logits[m])_k[y_k]`` over the rows in ``mask`` (all if None) (OGM-GE eq. 9)."""
    out = {}
    for m in sorted(logits):
        lg, y = (logits[m], labels) if mask is None else (logits[m][mask], labels[mask])
        p = torch.softmax(lg.detach().double(), dim=1)
        out[m] = float(p.gather(1, y.long().view(-1, 1)).sum())
    return out


def ogm_coefficients(scores: dict[str, float], alpha: float) -> tuple[dict[str, float], str, float]:
    """``(k, dominant, ratio)`` from the scores ``s_m`` of two or more modalities.

    ``dominant = argmax_m s_m`` (first in sorted order on a tie), ``ratio = s_dom / mean of
    the others' s_m`` (OGM-GE eq. 10, where M = 2 gives ``s_a / s_v``), ``k[dominant] =
    1 - tanh(alpha * ratio)`` when ``ratio > 1`` and ``k[m] = 1`` otherwise (OGM-GE eq. 11,
    as printed and as both the OGM-GE and the FedCMI authors' code compute it). A batch
    with equal scores (``ratio == 1``) has no dominant modality and is not modulated.
    """
    if len(scores) < 2:
        raise ValueError(f"OGM-GE needs two or more modalities, got {sorted(scores)}")
    names = sorted(scores)
    dom = max(names, key=lambda m: scores[m])
    others = [scores[m] for m in names if m != dom]
    ratio = scores[dom] / max(sum(others) / len(others), 1e-12)
    k = {m: 1.0 for m in names}
    if ratio > 1.0:  # eq. 11: k = 1 - tanh(alpha * rho) for the dominant modality (rho > 1)
        k[dom] = 1.0 - math.tanh(alpha * ratio)
    return k, dom, ratio


@torch.no_grad()
def modulate_gradients(params: dict[str, list[nn.Parameter]], coeffs: dict[str, float], ge: bool,
                       generator: torch.Generator | None = None) -> None:
    """``grad <- k_m * grad`` for every parameter tensor of modality ``m`` (OGM-GE eq. 12); with ``ge``
    plus noise ``N(0, (std(grad) + 1e-8)^2)``, std of the unmodulated gradient (the authors' GE)."""
    for m in sorted(params):
        k = coeffs.get(m, 1.0)
        for p in params[m]:
            g = p.grad
            if g is None:
                continue
            if ge:
                std = float(g.std()) if g.numel() > 1 else 0.0
                noise = torch.empty_like(g).normal_(0.0, std + 1e-8, generator=generator)
                p.grad = g * k + noise
            elif k != 1.0:
                g.mul_(k)


def modality_outputs(model: nn.Module, out: dict, score: str = "head") -> dict[str, Tensor]:
    """The per-modality logits ``out_m`` OGM-GE's scores are computed from (no gradient).

    ``"head"``: ``heads[m](z_m.detach())``. ``"classifier"``: ``z_m W[:, slot_m]^T + b / M``,
    the joint classifier of a concat fusion split by slot (OGM-GE's ``out_a``, ``out_v``).
    """
    with torch.no_grad():
        reps = out["mod_reps"]
        if score == "head":
            return {m: model.heads[m](z.detach()) for m, z in reps.items()}
        if getattr(model, "fusion_kind", None) != "concat":
            raise ConfigError(f"algorithm.score: 'classifier' needs model.fusion = \"concat\", "
                              f"got {getattr(model, 'fusion_kind', None)!r}")
        w, b, d = model.classifier.weight, model.classifier.bias, model.feat_dim
        n = len(model.modalities)
        res = {}
        for m, z in reps.items():
            i = model.modalities.index(m)
            res[m] = z.detach() @ w[:, i * d:(i + 1) * d].T + (b / n if b is not None else 0.0)
        return res


# ----------------------------------------------------------------------------- server / client


class FedOGMServer(MultimodalServer):
    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        if params.score == "classifier" and self.model.fusion_kind != "concat":
            raise ConfigError(f"algorithm.score: 'classifier' needs model.fusion = \"concat\", "
                              f"got {self.model.fusion_kind!r}")

    def reported_scalars(self):
        return ("ogm_coeff", "ogm_ratio")


class FedOGMClient(MFedAvgClient):
    """MFedAvg's local training with the dominant modality's encoder gradients scaled by
    ``k`` (and GE noise) at every step with samples holding all the client's modalities."""

    def begin(self, model, msg):
        p = self.params
        rnd = self.ctx.rnd
        in_window = rnd >= p.modulation_start_round and (p.modulation_end_round == 0
                                                        or rnd < p.modulation_end_round)
        holds = list(getattr(model, "holds", self.ctx.modalities))
        self._active = in_window and len(holds) >= 2
        self._coeffs: dict[str, float] | None = None
        self._log: list[tuple[float, float]] = []  # (k of the dominant modality, ratio) per modulated step
        if not self._active:
            return
        modules = ("encoders", "proj") if p.modulate_proj else ("encoders",)
        named = list(model.named_parameters())
        self._params = {m: [prm for n, prm in named if prm.requires_grad
                            and any(n.startswith(f"{mod}.{m}.") for mod in modules)] for m in holds}
        device = model.classifier.weight.device
        self._noise = torch.Generator(device=device).manual_seed((self.ctx.seed ^ NOISE_STREAM) % (2 ** 63))

    def loss(self, model, inputs, labels, msg):
        out = model(inputs)
        if self._active:
            self._coeffs = self.measure(model, out, labels)
        return self.task_loss(model, out, labels) + self.probe_loss(model, out, labels)

    def measure(self, model, out: dict, labels: Tensor) -> dict[str, float] | None:
        """The step's coefficients (None: no sample of the batch holds every modality)."""
        present = out["present"]
        both = None
        for m in sorted(out["mod_reps"]):
            both = present[m] if both is None else both & present[m]
        if both is None or len(out["mod_reps"]) < 2 or not bool(both.any()):
            return None
        scores = true_class_scores(modality_outputs(model, out, self.params.score), labels, both)
        k, dom, ratio = ogm_coefficients(scores, self.params.alpha)
        self._log.append((k[dom], ratio))
        return k

    def before_step(self):
        if self._active and self._coeffs is not None:
            modulate_gradients(self._params, self._coeffs, self.params.ge, self._noise)
        self._coeffs = None

    def reply_scalars(self, model, stats):
        out = super().reply_scalars(model, stats)
        if self._log:
            out["ogm_coeff"] = sum(k for k, _ in self._log) / len(self._log)
            out["ogm_ratio"] = sum(r for _, r in self._log) / len(self._log)
        return out


register("fedogm", FedOGMParams, FedOGMServer, FedOGMClient,
         help="FedOGM: MFedAvg + OGM-GE gradient modulation of the dominant modality's encoder (Peng et al. 2022)")
