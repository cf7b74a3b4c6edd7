"""Prototype-based FedCMI baselines (FedCMI section 4.1): MFedProto and FedPMR.

Both run on the multimodal model (:mod:`mmfl.models.multimodal`) and average its
weights module-wise as MFedAvg does (:class:`~mmfl.algorithms.multimodal.MultimodalServer`);
they differ from MFedAvg only in what else crosses the network and in the local loss.

- ``mfedproto``: FedProto (Tan et al., AAAI 2022) per modality. A class prototype
  is the mean representation of the class; for modality m the representation is
  the self projector's output z_m (``out["mod_reps"][m]``). The local loss adds
  lambda * ||z_m - C_m[y]||^2 toward the *global* prototype of the sample's class
  (FedProto eq. 6); after training each client uploads its local prototypes and
  per-class counts (arrays ``proto/<m>`` [C, d] and ``proto_count/<m>`` [C]), and
  the server averages them per modality and class, weighted by the counts (eq. 8).
- ``fedpmr``: FedAvg + PMR (Fan et al., CVPR 2023, "Prototypical Modal Rebalance")
  in local training. At the start of each local epoch the client computes class
  prototypes P_m of the encoder output f_m (``out["mod_feats"][m]``) from its own
  data; on each batch, the modality whose prototype classifier (logits
  -||f_m - P_m[c]||^2) gives the true class the larger total probability is the
  dominant one, and the others get a prototypical cross-entropy alpha * CE
  (PMR's rebalance of the weak modality), optionally with an entropy regulariser
  on the dominant modality (beta).

The PMR paper is not among the papers of this project (``/work/shared/papers``):
its equation numbers are not cited; see ``docs/algorithms/fedpmr.md`` for what is
taken from where. FedProto's numbers (eq. 6, 8) follow that paper's numbering.

Only samples holding modality m (``out["present"][m]``) contribute to m's
prototypes, scores and losses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmfl.algorithms.registry import register
from mmfl.algorithms.multimodal import MFedAvgClient, MFedAvgParams, MultimodalServer
from mmfl.core.state import record, tensors
from mmfl.core.message import Message
from mmfl.core.replies import ReplySchema, specs_of
from mmfl.errors import ConfigError

PROTO = "proto/"  # message array "proto/<m>": prototypes of modality m, [C, d]
PROTO_COUNT = "proto_count/"  # message array "proto_count/<m>": samples behind each row, [C]
STATE = "mfedproto/"  # server state: "mfedproto/proto/<m>", "mfedproto/proto_count/<m>"
PROTO_BATCH = 500  # batch size of the no-grad prototype passes (eval mode: any size gives the same means)


# ----------------------------------------------------------------------------- shared


@torch.no_grad()
def class_means(model: nn.Module, data, key: str, num_classes: int,
                modalities=None, batch_size: int = PROTO_BATCH) -> dict[str, tuple[Tensor, Tensor]]:
    """Per modality m: ``(means [C, d], counts [C])`` of ``out[key][m]`` per class over the
    samples of ``data`` that hold m (eval mode, no grad; the model's mode is restored).

    ``key``: ``"mod_reps"`` (z_m, FedProto's local prototypes) or ``"mod_feats"``
    (f_m, PMR's prototypes). A class with no such sample has a zero row and count 0.
    """
    was_training = model.training
    model.eval()
    sums: dict[str, Tensor] = {}
    counts: dict[str, Tensor] = {}
    try:
        for inputs, labels in data.batches(batch_size, shuffle=False):
            out = model(inputs)
            for m, v in out[key].items():
                if modalities is not None and m not in modalities:
                    continue
                mask = out["present"][m]
                y = labels[mask]
                if m not in sums:
                    sums[m] = torch.zeros(num_classes, v.shape[1], dtype=torch.float64, device=v.device)
                    counts[m] = torch.zeros(num_classes, dtype=torch.float64, device=v.device)
                sums[m].index_add_(0, y, v[mask].double())
                counts[m].index_add_(0, y, torch.ones_like(y, dtype=torch.float64))
    finally:
        model.train(was_training)
    return {m: ((sums[m] / counts[m].clamp(min=1.0)[:, None]).float(), counts[m].float()) for m in sums}


# ----------------------------------------------------------------------------- MFedProto: the equations


def aggregate_prototypes(protos: list[Tensor], counts: list[Tensor],
                         previous: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """Global prototypes of one modality from the clients' local ones (FedProto eq. 8).

    C[c] = sum_i |D_i,c| C_i[c] / sum_i |D_i,c| over the clients i that reported class c
    (|D_i,c|: client i's samples of class c holding the modality). Returns
    ``(prototypes [C, d], counts [C])`` with counts = sum_i |D_i,c|. A class nobody
    reported keeps its ``previous`` prototype and count (zeros without ``previous``).
    """
    n = torch.stack([c.double() for c in counts])  # [K, C]
    p = torch.stack([t.double() for t in protos])  # [K, C, d]
    total = n.sum(0)  # [C]
    mean = (n[:, :, None] * p).sum(0) / total.clamp(min=1.0)[:, None]
    seen = total > 0
    if previous is not None:
        prev_p, prev_n = previous
        mean = torch.where(seen[:, None], mean, prev_p.double())
        total = torch.where(seen, total, prev_n.double())
    return mean.to(protos[0].dtype), total.to(counts[0].dtype)


def fedproto_term(reps: dict[str, Tensor], present: dict[str, Tensor], labels: Tensor,
                  arrays: dict[str, Tensor]) -> Tensor:
    """sum_m mean_{i,d} (z_m,i,d - C_m[y_i],d)^2 (FedProto eq. 6's regulariser, per modality).

    Squared distance averaged over the feature dimensions as well, like FedProto's code
    (``nn.MSELoss()``); summing over the 64 dimensions instead made lam = 1 pull every
    representation onto its prototype and collapsed training (10% on mfeat_pair).
    The mean runs over the samples i that hold m and whose class has a global
    prototype (``proto_count/<m>[y_i] > 0``); a modality with no such sample, or
    with no global prototypes in ``arrays``, adds nothing.
    """
    ref = next(iter(reps.values()))
    total = ref.new_zeros(())
    for m, z in reps.items():
        if PROTO + m not in arrays:
            continue
        protos, counts = arrays[PROTO + m], arrays[PROTO_COUNT + m]
        mask = present[m] & (counts[labels] > 0)
        if not bool(mask.any()):
            continue
        target = protos[labels[mask]].to(z.dtype)
        total = total + ((z[mask] - target) ** 2).mean()
    return total


# ----------------------------------------------------------------------------- MFedProto: server and client


@dataclass
class MFedProtoParams(MFedAvgParams):
    lam: float = field(default=1.0, metadata={
        "help": "weight lambda of the prototype distance ||z_m - C_m[y]||^2 (FedProto eq. 6)"})

    def __post_init__(self):
        if self.lam < 0:
            raise ConfigError(f"algorithm.lam: must be >= 0, got {self.lam}")


class MFedProtoServer(MultimodalServer):
    """MFedAvg's module-wise model averaging plus FedProto's global prototypes (eq. 8),
    kept per modality in the server state and sent to the clients holding the modality."""

    state_fields = {"mfedproto": record(proto=tensors(), proto_count=tensors())}  # prototypes and their counts

    @property
    def mfedproto(self) -> dict[str, dict[str, Tensor]]:
        return {"proto": self.protos, "proto_count": self.counts}

    @mfedproto.setter
    def mfedproto(self, value: dict[str, dict[str, Tensor]]) -> None:
        self.protos, self.counts = value["proto"], value["proto_count"]

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        c, d = self.ctx.meta.num_classes, self.model.feat_dim
        dev = self.ctx.device
        self.protos = {m: torch.zeros(c, d, device=dev) for m in sorted(self.ctx.meta.modalities)}
        self.counts = {m: torch.zeros(c, device=dev) for m in sorted(self.ctx.meta.modalities)}

    def extra_reply_arrays(self):
        """A reply also carries its prototypes ``proto/<m>`` [C, d] and their counts ``proto_count/<m>`` [C]."""
        return ReplySchema({**specs_of({PROTO + m: t for m, t in self.protos.items()}),
                            **specs_of({PROTO_COUNT + m: t for m, t in self.counts.items()})})

    def round_arrays(self, rnd):
        """The global prototypes of each modality that has any (none before the first aggregation)."""
        out = {}
        for m in self.protos:
            if bool((self.counts[m] > 0).any()):
                out[PROTO + m], out[PROTO_COUNT + m] = self.protos[m], self.counts[m]
        return out

    def configure_train(self, rnd, cohort):
        """As MultimodalServer's, but a client receives the prototypes of its own modalities only."""
        out = super().configure_train(rnd, cohort)
        trimmed: dict[int, Message] = {}  # id of the shared message of a modality set -> its trimmed copy
        for cid, msg in out.items():
            if id(msg) not in trimmed:
                holds = set(self.ctx.modalities_of(cid))
                keep = {k: v for k, v in msg.arrays.items()
                        if not (k.startswith((PROTO, PROTO_COUNT)) and k.split("/", 1)[1] not in holds)}
                trimmed[id(msg)] = Message(arrays=keep, scalars=msg.scalars)
            out[cid] = trimmed[id(msg)]
        return out

    def aggregate_train(self, rnd, replies):
        metrics = super().aggregate_train(rnd, replies)  # model weights: module-wise FedAvg
        for m in self.protos:
            got = [(replies[c].arrays[PROTO + m], replies[c].arrays[PROTO_COUNT + m])
                   for c in sorted(replies) if PROTO + m in replies[c].arrays]
            if got:
                self.protos[m], self.counts[m] = aggregate_prototypes(
                    [p for p, _ in got], [n for _, n in got], previous=(self.protos[m], self.counts[m]))
        return metrics


class MFedProtoClient(MFedAvgClient):
    """Local loss CE + lambda * FedProto's prototype term (eq. 6) + the linear probes;
    the reply adds the local prototypes of z_m with their per-class counts."""

    def loss(self, model, inputs, labels, msg):
        out = model(inputs)
        loss = self.task_loss(model, out, labels) + self.probe_loss(model, out, labels)
        if self.params.lam > 0:
            loss = loss + self.params.lam * fedproto_term(out["mod_reps"], out["present"], labels, msg.arrays)
        return loss

    def finish(self, model, msg, stats):
        reply = super().finish(model, msg, stats)
        local = class_means(model, self.ctx.data, "mod_reps", self.ctx.meta.num_classes, self.ctx.modalities)
        for m, (protos, counts) in local.items():
            if bool((counts > 0).any()):
                reply.arrays[PROTO + m], reply.arrays[PROTO_COUNT + m] = protos, counts
        return reply


# ----------------------------------------------------------------------------- FedPMR: the equations


def prototype_logits(feats: Tensor, protos: Tensor, distance: str = "squared") -> Tensor:
    """-d(f_i, P[c]) for each sample i and prototype row c: ``[B, C]``.

    ``distance``: ``"squared"`` (||f - P_c||^2) or ``"euclidean"`` (||f - P_c||)."""
    d2 = ((feats[:, None, :] - protos[None, :, :].to(feats.dtype)) ** 2).sum(dim=2)
    return -(d2 if distance == "squared" else d2.clamp(min=1e-12).sqrt())


def restrict_classes(protos: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """The prototype rows of the classes that have one and a map class -> row (-1: none)."""
    idx = (counts > 0).nonzero().squeeze(1)
    lookup = torch.full((counts.shape[0],), -1, dtype=torch.long, device=counts.device)
    lookup[idx] = torch.arange(idx.numel(), device=counts.device)
    return protos[idx], lookup


@dataclass
class PMRStep:
    """What :func:`pmr_terms` found on one batch."""

    loss: Tensor  # alpha * sum_weak CE_proto - beta * H(dominant), 0 when not rebalanced
    scores: dict[str, float]  # s_m over the samples holding every modality
    dominant: str | None
    weak: list[str]


def pmr_terms(feats: dict[str, Tensor], present: dict[str, Tensor], labels: Tensor,
              protos: dict[str, tuple[Tensor, Tensor]], alpha: float, beta: float = 0.0,
              distance: str = "squared") -> PMRStep:
    """PMR's rebalancing terms on one batch.

    ``feats[m]``: encoder outputs f_m ``[B, d]``; ``protos[m]``: ``(P_m [C, d], counts [C])``
    from the client's data (classes with count 0 have no prototype and are left out of
    m's prototype classifier). With p_m = softmax over classes of -d(f_m, P_m[c]):

    - s_m = sum_i p_m,i[y_i] over the samples holding every modality in ``feats``
      (detached: a score, not a loss);
    - dominant = argmax_m s_m; weak = the m with s_m < s_dominant (rho = s_dom / s_m > 1);
    - loss = alpha * sum_{m weak} CE(-d(f_m, P_m), y) over the samples holding m
      (PMR's prototypical cross-entropy on the weak modality; gradient into f_m only,
      P_m is a constant) - beta * mean H(p_dominant) over the samples holding it
      (entropy regularisation: maximising the dominant modality's prototype entropy
      slows it down).

    With fewer than two modalities, or no sample holding them all, nothing is rebalanced.
    """
    ref = next(iter(feats.values()))
    zero = ref.sum() * 0.0
    mods = [m for m in feats if m in protos]
    if len(mods) < 2:
        return PMRStep(zero, {}, None, [])
    rows = {m: restrict_classes(*protos[m]) for m in mods}
    logits = {m: prototype_logits(feats[m], rows[m][0], distance) for m in mods}
    targets = {m: rows[m][1][labels] for m in mods}  # label -> prototype row (-1: class has none)
    both = torch.stack([present[m] & (targets[m] >= 0) for m in mods]).all(dim=0)
    if not bool(both.any()):
        return PMRStep(zero, {}, None, [])
    scores = {}
    for m in mods:
        p = logits[m].detach()[both].softmax(dim=1)
        scores[m] = float(p.gather(1, targets[m][both][:, None]).sum())
    dominant = max(mods, key=lambda m: scores[m])
    weak = [m for m in mods if scores[m] < scores[dominant]]
    loss = zero
    if not weak:  # rho == 1: balanced, no rebalancing
        return PMRStep(loss, scores, dominant, weak)
    for m in weak:
        mask = present[m] & (targets[m] >= 0)
        loss = loss + alpha * F.cross_entropy(logits[m][mask], targets[m][mask])
    if beta > 0:
        mask = present[dominant]
        logp = logits[dominant][mask].log_softmax(dim=1)
        entropy = -(logp.exp() * logp).sum(dim=1).mean()
        loss = loss - beta * entropy
    return PMRStep(loss, scores, dominant, weak)


# ----------------------------------------------------------------------------- FedPMR: server and client


@dataclass
class FedPMRParams(MFedAvgParams):
    alpha: float = field(default=1.0, metadata={
        "help": "weight of the prototypical cross-entropy on the weak modality (PMR's alpha)"})
    beta: float = field(default=0.0, metadata={
        "help": "weight of the entropy regulariser on the dominant modality's prototype distribution (0 = off)"})
    distance: Literal["squared", "euclidean"] = field(default="euclidean", metadata={
        "help": "prototype logits: -||f - P_c||^2 ('squared') or -||f - P_c|| ('euclidean')"})

    def __post_init__(self):
        for name in ("alpha", "beta"):
            if getattr(self, name) < 0:
                raise ConfigError(f"algorithm.{name}: must be >= 0, got {getattr(self, name)}")


class FedPMRServer(MultimodalServer):
    def reported_scalars(self):
        return ("pmr_ratio", *(f"pmr_weak/{m}" for m in sorted(self.ctx.meta.modalities)))


class FedPMRClient(MFedAvgClient):
    """MFedAvg's loss plus :func:`pmr_terms` on a client holding two or more modalities;
    prototypes of f_m are recomputed from the client's data at the start of each epoch."""

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.multi = len(ctx.modalities) >= 2
        self.local_model: nn.Module | None = None
        self.protos: dict[str, tuple[Tensor, Tensor]] = {}
        self.ratios: list[float] = []
        self.weak_steps = {m: 0 for m in ctx.modalities}

    def begin(self, model, msg):
        self.local_model = model

    def on_epoch(self, epoch):
        if self.multi and self.params.alpha + self.params.beta > 0:
            self.protos = class_means(self.local_model, self.ctx.data, "mod_feats", self.ctx.meta.num_classes,
                                      self.ctx.modalities)

    def loss(self, model, inputs, labels, msg):
        out = model(inputs)
        loss = self.task_loss(model, out, labels) + self.probe_loss(model, out, labels)
        if not self.multi or not self.protos:
            return loss  # a unimodal client: MFedAvg
        p = self.params
        step = pmr_terms(out["mod_feats"], out["present"], labels, self.protos, p.alpha, p.beta, p.distance)
        if step.dominant is not None:
            s = step.scores
            mods = sorted(s)
            # rho = s_m0 / s_m1 in modality order (PMR's ratio, FedCMI's cmi_rho); > 2 modalities:
            # s_dominant / mean of the others' (FedOGM's generalisation)
            if len(mods) == 2:
                num, den = s[mods[0]], s[mods[1]]
            else:
                num = s[step.dominant]
                den = sum(v for m, v in s.items() if m != step.dominant) / (len(mods) - 1)
            self.ratios.append(num / max(den, 1e-12))
            for m in step.weak:
                self.weak_steps[m] += 1
        return loss + step.loss

    def reply_scalars(self, model, stats):
        out = super().reply_scalars(model, stats)
        if self.ratios:
            out["pmr_ratio"] = sum(self.ratios) / len(self.ratios)
            for m, k in self.weak_steps.items():
                out[f"pmr_weak/{m}"] = k / len(self.ratios)
        return out


register("mfedproto", MFedProtoParams, MFedProtoServer, MFedProtoClient,
         help="MFedProto: MFedAvg + FedProto's per-modality global class prototypes (Tan et al. 2022)")
register("fedpmr", FedPMRParams, FedPMRServer, FedPMRClient,
         help="FedPMR: MFedAvg + PMR's prototypical rebalancing of the weak modality (Fan et al. 2023)")
