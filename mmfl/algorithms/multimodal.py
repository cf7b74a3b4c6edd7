"""Multimodal FedAvg and what every multimodal algorithm shares (FedCMI's baselines).

The model is :mod:`mmfl.models.multimodal` (encoders, projectors and heads per
modality, a fusion module and a joint classifier). A client holding only some
modalities has only their branches; it receives and uploads only the modules it
holds, and the server averages each module over the clients that sent it,
weighted by the number of their samples that have that modality (the engine's
module-wise aggregation rule ``weighted_mean``, :mod:`mmfl.core.aggregation`;
``algorithm.aggregation`` names another).

Registered here:

- ``mfedavg``: FedAvg over a multimodal model (FedCMI section 4.1, baseline 1):
  local loss = cross-entropy of the joint output;
- ``mfedprox``: + FedProx's proximal term mu/2 ||w - w^t||^2 (FedProx eq. 2);
- ``fediot``: FedIoT (Zhao et al. 2022): multimodal FedAvg with a larger
  aggregation weight for multimodal clients.

Per-modality heads. The per-modality accuracy the issue asks for needs a
classifier per modality; algorithms that do not train one themselves (all but
FedCMI) train ``heads[m]`` as a *linear probe* on the detached projector output
``z_m``: its gradient never reaches the encoder, so the baseline trains exactly
as without it, and ``accuracy/<m>`` measures how much class information the
shared representation of modality ``m`` carries. (Set ``probe = false`` to skip it.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor, nn

from mmfl.algorithms.registry import register
from mmfl.algorithms.base import TrainingClient
from mmfl.algorithms.fedavg import MODULE_WEIGHT, FedAvgParams, FedAvgServer
from mmfl.data.base import PRESENT
from mmfl.core.message import Message
from mmfl.core.state import read, write
from mmfl.core.training import load_into, masked_ce, model_tensors, state_of
from mmfl.errors import ConfigError
from mmfl.models.multimodal import BRANCH_MODULES, branch_of


# ----------------------------------------------------------------------------- helpers


def only_held(arrays: dict[str, Tensor], holds: tuple[str, ...]) -> dict[str, Tensor]:
    """The entries of ``arrays`` a client holding ``holds`` has (branch keys of other modalities dropped)."""
    return {k: v for k, v in arrays.items() if (b := branch_of(k)) is None or b in holds}


def present_counts(data, modalities) -> dict[str, int]:
    """Samples of ``data`` that hold each modality (per-sample ``present/<m>`` masks)."""
    out = {}
    for m in modalities:
        key = PRESENT + m
        if key in data.features:
            mask = data.features[key] if data.indices is None else data.features[key][data.indices]
            out[m] = int(mask.sum())
        else:
            out[m] = len(data)
    return out


def require_multimodal_model(model: nn.Module, algorithm: str, two_projector: bool = False) -> None:
    if not all(hasattr(model, a) for a in ("encoders", "proj", "heads", "fusion", "classifier")):
        raise ConfigError(f"algorithm.name: '{algorithm}' needs model.name = \"multimodal\", "
                          f"got a {type(model).__name__}")
    if two_projector and getattr(model, "infil", None) is None:
        raise ConfigError(f"model.two_projector: '{algorithm}' needs the infiltration projectors; "
                          "set model.two_projector = true (or algorithm.projector = \"uni\")")


# ----------------------------------------------------------------------------- server


class MultimodalServer(FedAvgServer):
    """FedAvg server for multimodal models: each client receives only the modules it holds
    (and ``round_scalars``); aggregation is module-wise (the engine's rule)."""

    trains_modality_heads = True  # the probes (MultimodalClient.probe_loss; FedCMI: its TP too)
    runs_on = "multimodal"
    dp_capable = False  # modules held by some clients only: [dp]'s per-client sensitivity is not defined here

    private: tuple[str, ...] = ()  # key prefixes the clients keep to themselves: never sent either way

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        require_multimodal_model(self.model, self.algorithm_name(), self.needs_infiltration())

    def algorithm_name(self) -> str:
        return type(self).__name__.removesuffix("Server").lower()

    def needs_infiltration(self) -> bool:
        """Whether the model must have infiltration projectors (FedCMI)."""
        return False

    def aggregation_context(self, rnd, replies):
        """For the ``iot`` rule: which replies come from clients holding several modalities,
        and their weight factor (``multimodal_weight``; FedIoT's 100 when the params have none)."""
        return {"multimodal": [replies[c].scalars.get("num_modalities", 1) > 1 for c in sorted(replies)],
                "multimodal_weight": float(getattr(self.params, "multimodal_weight", FEDIOT_MULTIMODAL_WEIGHT))}

    def round_scalars(self, rnd: int) -> dict[str, float]:
        return {}

    def round_arrays(self, rnd: int) -> dict[str, Tensor]:
        """Extra arrays every client receives this round (global prototypes, ...)."""
        return {}

    def configure_train(self, rnd, cohort):
        full = {k: v for k, v in self.model.state_dict().items() if not k.startswith(self.private)}
        extra = self.round_arrays(rnd)
        scalars = self.round_scalars(rnd)
        by_holds: dict[tuple, Message] = {}
        out = {}
        for cid in cohort:
            holds = self.ctx.modalities_of(cid)
            if holds not in by_holds:  # one message object per modality set, counted per recipient
                by_holds[holds] = Message(arrays={**only_held(full, holds), **extra}, scalars=dict(scalars))
            out[cid] = by_holds[holds]
        return out


# ----------------------------------------------------------------------------- client


class MultimodalClient(TrainingClient):
    """Local training of a multimodal model (the hooks of
    :class:`~mmfl.algorithms.base.TrainingClient`). Subclasses change :meth:`loss` (and may
    use ``begin`` / ``before_step`` / ``on_epoch``); ``private`` names key prefixes kept on
    the client (in ``ctx.state``) and never uploaded (FedCMI's infiltration projectors)."""

    private: tuple[str, ...] = ()
    probe = True

    def load_model(self, msg: Message) -> nn.Module:
        model = self.ctx.model("local")
        own = model_tensors(model)
        saved = read(self.ctx.state, "private")
        if self.private and not saved:  # first round: the run's initial weights
            init = state_of(self.ctx.init_model())
            saved = {k: v for k, v in init.items() if self.is_private(k)}
        arrays = {k: msg.arrays[k] for k in own if k in msg.arrays}
        arrays.update({k: v for k, v in saved.items() if k in own})
        missing = [k for k in own if k not in arrays]
        if missing:
            raise RuntimeError(f"client {self.ctx.cid}: the server sent no value for {missing[0]}")
        return load_into(model, arrays)

    def is_private(self, key: str) -> bool:
        return any(key.startswith(p) for p in self.private)

    # --- the local objective ---------------------------------------------------
    def loss(self, model: nn.Module, inputs: dict[str, Tensor], labels: Tensor, msg: Message) -> Tensor:
        out = model(inputs)
        return self.task_loss(model, out, labels) + self.probe_loss(model, out, labels)

    def task_loss(self, model, out: dict, labels: Tensor) -> Tensor:
        """Cross-entropy of the joint output (MFedAvg's objective), over the rows that hold at
        least one modality (a row with none would train the classifier on the empty fusion)."""
        return masked_ce(out["logits"], labels, out.get("any_present"))  # None: every row

    def probe_loss(self, model, out: dict, labels: Tensor) -> Tensor:
        """Linear probes: each ``heads[m]`` on the detached ``z_m`` (no gradient to the encoders)."""
        if not self.probe:
            return out["logits"].sum() * 0.0
        total = out["logits"].new_zeros(())
        for m, z in out["mod_reps"].items():
            total = total + masked_ce(model.heads[m](z.detach()), labels, out["present"][m])
        return total

    # --- the reply ---------------------------------------------------------------
    def finish(self, model: nn.Module, msg: Message, stats: dict) -> Message:
        state = state_of(model)
        if self.private:
            write(self.ctx.state, "private", {k: state.pop(k) for k in [k for k in state if self.is_private(k)]})
        self.after_train(model, msg, stats)
        return Message(arrays=state, scalars={**self.reply_scalars(model, stats),
                                              "train_loss": stats["train_loss"], "steps": stats["steps"]})

    def reply_scalars(self, model, stats) -> dict[str, float]:
        """``num_examples`` plus each branch module's own weight: the samples holding its modality."""
        counts = present_counts(self.ctx.data, self.ctx.modalities)
        out = {"num_examples": len(self.ctx.data), "num_modalities": len(self.ctx.modalities)}
        for m, n in counts.items():
            for mod in BRANCH_MODULES:
                out[f"{MODULE_WEIGHT}{mod}.{m}."] = n
        return out


# ----------------------------------------------------------------------------- MFedAvg / MFedProx / FedIoT


@dataclass
class MFedAvgParams(FedAvgParams):
    probe: bool = field(default=True, metadata={
        "help": "train the per-modality heads as linear probes on detached features (for per-modality accuracy)"})


class MFedAvgServer(MultimodalServer):
    secagg_capable = True  # it uses only the weighted mean of the models (SecAgg+ on Flower, mmfl.flower.secagg)


class MFedAvgClient(MultimodalClient):
    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.probe = getattr(params, "probe", True)


@dataclass
class MFedProxParams(MFedAvgParams):
    mu: float = field(default=0.01, metadata={"help": "proximal weight mu (FedProx eq. 2)"})

    def __post_init__(self):
        super().__post_init__()
        if self.mu < 0:
            raise ConfigError(f"algorithm.mu: must be >= 0, got {self.mu}")


def proximal(model: nn.Module, anchor: dict[str, Tensor], skip: Callable[[str], bool] = lambda k: False) -> Tensor:
    """||w - w^t||^2 over the trainable parameters present in ``anchor`` (FedProx eq. 2)."""
    terms = [((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters()
             if p.requires_grad and n in anchor and not skip(n)]
    if terms:
        return torch.stack(terms).sum()
    p = next(model.parameters(), None)
    return torch.zeros((), device=p.device if p is not None else "cpu")


class MFedProxServer(MultimodalServer):
    secagg_capable = True  # it uses only the weighted mean of the models (SecAgg+ on Flower, mmfl.flower.secagg)


class MFedProxClient(MFedAvgClient):
    def loss(self, model, inputs, labels, msg):
        base = super().loss(model, inputs, labels, msg)
        if self.params.mu == 0:
            return base
        return base + self.params.mu / 2 * proximal(model, msg.arrays, skip=lambda n: n.startswith("heads."))


# FedIoT's aggregation weight of a multimodal client relative to a uni-modal one: "higher weights
# (set to 100 following Zhao et al. (2022)) are assigned to multimodal clients" (CreamFL, Yu et al.
# 2023, section 4.1, baseline 7). The one published value; fediot, reamfl_iot and creamfl_fediot use it.
FEDIOT_MULTIMODAL_WEIGHT = 100.0


@dataclass
class FedIoTParams(MFedAvgParams):
    multimodal_weight: float = field(default=FEDIOT_MULTIMODAL_WEIGHT, metadata={
        "help": "aggregation weight factor of a client holding several modalities (FedIoT's larger weight; "
                "100 as CreamFL's paper gives it, following Zhao et al. 2022)"})
    aggregation: str = field(default="iot", kw_only=True, metadata={
        "help": "the server's aggregation rule, by name (`mmfl list aggregation`); iot = weighted_mean with "
                "multimodal clients' weights times multimodal_weight"})

    def __post_init__(self):
        super().__post_init__()
        if not self.multimodal_weight > 0:
            raise ConfigError(f"algorithm.multimodal_weight: must be > 0, got {self.multimodal_weight}")


class FedIoTServer(MultimodalServer):
    default_aggregation = "iot"


register("mfedavg", MFedAvgParams, MFedAvgServer, MFedAvgClient,
         help="MFedAvg: FedAvg of a multimodal model, module-wise over the clients holding each module")
register("mfedprox", MFedProxParams, MFedProxServer, MFedProxClient,
         help="MFedProx: MFedAvg + FedProx's proximal term mu/2 ||w - w_global||^2")
register("fediot", FedIoTParams, FedIoTServer, MFedAvgClient,
         help="FedIoT: multimodal FedAvg with a larger aggregation weight for multimodal clients (Zhao et al. 2022)")
