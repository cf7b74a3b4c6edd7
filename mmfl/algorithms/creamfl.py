"""CreamFL (Yu et al., ICLR 2023): a larger server model learns from heterogeneous
image, text and image-text clients by exchanging representations of a public
paired set; and the baselines of its Tables 1 and 3.

The run's data set is a *pair* data set with two modalities (``emoji_pairs``:
``image`` + ``text``; ``mfeat_pair``: ``image`` + ``features``; ``coco_captions``
and ``flickr30k`` with ``public_images``) with a public split (``Federation.public``). Clients from ``[[client_data]]`` hold one of the
two modalities (image clients on ``fashion_mnist_features`` or ``mnist_pix``,
text clients on ``bbc_news``), each
with a model of its own size (``[[client_models]]``); ``[model]`` is the
server's model. Every model is :mod:`mmfl.models.multimodal`; the
representation of modality ``m`` is the L2-normalised projector output
``normalize(proj[m](encoders[m](x)))`` of size ``d = model.feat_dim``.

One round (Algorithm 1; the order of the authors' ``MMFL.train``):

1. the server trains one epoch on the public pairs (Alg. 1 line 18; the
   authors train with PCME; here the symmetric InfoNCE of CLIP, or PCME with
   ``multimodal_loss = "pcme"``, :mod:`mmfl.algorithms.pcme`);
2. it computes the global representations ``i_global``, ``t_global`` of the
   public set and sends each client what its regularization needs;
3. each client trains ``train.local_epochs`` epochs on its private task:
   image/text clients classification (cross-entropy of ``heads[m]``),
   image-text clients contrastive retrieval (symmetric InfoNCE on their
   pairs, or PCME as the server); after every epoch one pass over the public set adds
   the local contrastive regularization (LCR), eq. 3:
   ``gamma * (l_inter + l_intra)`` with

   - inter-modal (eq. 1): ``CE(i_local @ t_global.T / tau, k)`` -- the
     local representation of public sample k against *all* |P| global
     representations of the other modality, a ``[batch, |P|]`` block at a
     time (never ``|P| x |P|``);
   - intra-modal (eq. 2): ``CE([i_local.i_global, i_local.i_prev] / tau, 0)``
     with ``i_prev`` the client's representation at the start of the round;

4. the client uploads its representations of the public set, only for the
   modalities it holds (``rep/<m>``, ``[|P|, d]`` each);
5. the server aggregates them per modality (``aggregation``):
   ``gca`` = global-local contrastive aggregation, eq. 4-6
   (:mod:`mmfl.algorithms.public_terms`, chunked); ``mean``; ``avg`` (weights
   = the clients' sample counts); ``iot`` (sample counts, image-text clients'
   times ``iot_weight`` = 100, FedIoT's); ``variance`` (FedET); ``entropy`` (FedGEMS);
6. the server distills, eq. 7: ``kd_weight * sum_m MSE(f_m(x^(k)), agg_m^(k))``
   over the public set (the authors' ``kd_weight`` 0.3, MSE).

Registered names (presets of :class:`CreamFLParams`):

- ``creamfl``: GCA + inter + intra (Table 1/3, "CreamFL");
- ``reamfl_mean`` / ``reamfl_avg`` / ``reamfl_iot``: no GCA, no LCR, mean /
  sample-count / FedIoT-weighted representation averaging (Table 3);
- ``fedmd``: FedMD (Li & Wang 2019) with CreamFL's server model: mean
  consensus, and each client first *digests* the consensus of the previous
  round (MSE to it on the public set) before it revisits its private data;
- ``fedet``: FedET (Cho et al. 2022), adapted: ensemble weights from the
  variance of each client's representation, clients distill from the
  server's global representations (MSE) before private training;
- ``fedgems``: FedGEMS (Cheng et al. 2021), adapted: per sample the clients
  whose representation has at most the mean entropy (softmax over the
  representation's entries) are selected and averaged; local distillation as
  FedET;
- ``creamfl_fedavg`` / ``creamfl_fediot`` (see :class:`WeightSharingServer`):
  FedAvg / FedIoT in the paper's homogeneous setting, every client with the
  server's architecture, weights (held encoders and projectors) averaged, the
  public pairs given to the image-text clients as extra training pairs.

All switches (``aggregation``, ``inter``, ``intra``, ``local_distill``, ...) can
be combined by hand: Table 3's GCA, GCA+inter and GCA+intra rows are
``creamfl`` with ``inter``/``intra`` switched off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmfl.algorithms.registry import preset, register
from mmfl.algorithms.base import Client, Server
from mmfl.algorithms.fedavg import reply_weights, weighted_average, weighted_mean_scalar
from mmfl.algorithms.multimodal import FEDIOT_MULTIMODAL_WEIGHT, only_held
from mmfl.algorithms.pcme import SAMPLES, VIB_WEIGHT, pcme_pair_loss
from mmfl.algorithms.public_terms import DEFAULT_CHUNK, aggregate_representations, global_local_contrastive_scores
from mmfl.core.message import Message
from mmfl.core.retrieval import evaluate_retrieval, pairs_to_retrieval
from mmfl.core.training import (cosine_lr, load_into, load_optimizer_state, make_optimizer, optimizer_state,
                                 set_lr, shuffled_batches, state_of)
from mmfl.errors import ConfigError
from mmfl.seeds import derive_seed

AGGREGATIONS = ("gca", "mean", "avg", "iot", "variance", "entropy")
GLOBAL = "global/"  # server -> client: global representations of the public set
CONSENSUS = "consensus/"  # server -> client (FedMD): last round's aggregated representations
REP = "rep/"  # client -> server: the client's representations of the public set
MODEL = "model/"  # client state: its own model
OPT = "opt/"  # server checkpoint: the public epoch's persistent Adam state (both phases' if shared)
OPT_KD = "opt_kd/"  # server checkpoint: the distillation's persistent Adam state (per_phase)


@dataclass
class CreamFLParams:
    aggregation: Literal["gca", "mean", "avg", "iot", "variance", "entropy"] = field(default="gca", metadata={
        "help": "representation aggregation: gca (eq. 4-6), mean, avg (by sample count), iot (image-text "
                "clients x iot_weight), variance (FedET), entropy (FedGEMS)"})
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
    public_size: int = field(default=0, metadata={
        "help": "use this many public pairs (a seeded subset; 0 = all): the Fig. 4 trade-off"})
    chunk: int = field(default=DEFAULT_CHUNK, metadata={"help": "rows per chunk of the |P| x |P| GCA scores"})
    exclude_positive: bool = field(default=False, metadata={
        "help": "eq. 4 as printed (denominator over j != k) instead of the authors' log-softmax"})

    def __post_init__(self):
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(f"algorithm.aggregation: must be one of {list(AGGREGATIONS)}, got {self.aggregation!r}")
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
        if self.multimodal_loss not in ("infonce", "pcme"):
            raise ConfigError(f"algorithm.multimodal_loss: must be 'infonce' or 'pcme', got {self.multimodal_loss!r}")
        if isinstance(self.pcme_samples, bool) or not isinstance(self.pcme_samples, int) or self.pcme_samples < 0:
            raise ConfigError(f"algorithm.pcme_samples: must be an integer >= 0, got {self.pcme_samples!r}")
        v = self.pcme_vib_weight
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise ConfigError(f"algorithm.pcme_vib_weight: must be a number >= 0, got {v!r}")


# ----------------------------------------------------------------------------- shared pieces


def reps_of(model: nn.Module, inputs: dict[str, Tensor], modalities) -> dict[str, Tensor]:
    """L2-normalised representations ``[B, d]`` of ``modalities`` (those the model holds)."""
    out = {}
    for m in modalities:
        if m in inputs and m in model.holds:
            out[m] = F.normalize(model.proj[m](model.encoders[m](inputs[m])), dim=-1)
    return out


@torch.no_grad()
def public_reps(model: nn.Module, public, modalities, batch_size: int = 512) -> dict[str, Tensor]:
    """The model's normalised representations of the whole public set, per held modality."""
    was = model.training
    model.eval()
    parts: dict[str, list[Tensor]] = {}
    for inputs, _ in public.batches(batch_size, shuffle=False):
        for m, z in reps_of(model, inputs, modalities).items():
            parts.setdefault(m, []).append(z)
    model.train(was)
    return {m: torch.cat(v) for m, v in parts.items()}


def info_nce(a: Tensor, b: Tensor, temperature: float) -> Tensor:
    """Symmetric InfoNCE (CLIP) of paired, normalised ``a``, ``b`` ``[B, d]``: row k's positive is row k."""
    logits = a @ b.t() / temperature
    target = torch.arange(a.shape[0])
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))


def pair_loss(model: nn.Module, inputs: dict[str, Tensor], z: dict[str, Tensor] | None, pair, params,
              generator: torch.Generator | None = None) -> Tensor:
    """The image-text task on a batch of pairs (``pair`` = the two modalities): InfoNCE of the
    representations ``z`` (``params.multimodal_loss = "infonce"``), or PCME (``"pcme"``, which
    reads the encoders itself for its variance heads; ``z`` is not used)."""
    if params.multimodal_loss == "pcme":  # Chun et al. 2021, eq. 3-7 (mmfl.algorithms.pcme)
        return pcme_pair_loss(model, inputs, pair, params.pcme_samples, params.pcme_vib_weight, generator)
    return info_nce(z[pair[0]], z[pair[1]], params.temperature)


def inter_loss(local: Tensor, global_other: Tensor, rows: Tensor, tau: float) -> Tensor:
    """Eq. 1, mean over the batch: ``-log softmax_j(local_k . other_j / tau)[j = k]`` over all |P| j.

    local ``[B, d]`` (public rows ``rows``), global_other ``[P, d]``. Memory ``B x P``."""
    return F.cross_entropy(local @ global_other.t() / tau, rows)


def intra_loss(local: Tensor, global_same: Tensor, prev: Tensor, tau: float) -> Tensor:
    """Eq. 2, mean over the batch: ``-log e^{l.g/tau} / (e^{l.g/tau} + e^{l.p/tau})``; all ``[B, d]``."""
    logits = torch.stack([(local * global_same).sum(-1), (local * prev).sum(-1)], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(local.shape[0], dtype=torch.long))


def variance_weights(local: Tensor) -> Tensor:
    """FedET's ensemble weights, on representations: per sample, each client's share of the
    summed variance of its representation entries. ``[C, P, d] -> [C, P]``."""
    v = local.var(dim=-1)
    return v / v.sum(0, keepdim=True).clamp_min(1e-12)


def entropy_selection_weights(local: Tensor, temperature: float = 1.0) -> Tensor:
    """FedGEMS's selection, on representations: per sample, the clients whose entropy of
    ``softmax(rep / T)`` is at most the mean over clients, uniformly. ``[C, P, d] -> [C, P]``."""
    p = torch.softmax(local / temperature, dim=-1)
    h = -(p * torch.log(p.clamp_min(1e-12))).sum(-1)  # [C, P]
    # at or below the mean, up to float rounding (near-equal entropies can all round above their
    # mean); the lowest-entropy client is always kept, so no sample is left without a teacher
    mean = h.mean(0, keepdim=True)
    keep = (h <= mean + 1e-6 * mean.abs().clamp_min(1.0)) | (h == h.min(0, keepdim=True).values)
    keep = keep.to(local.dtype)
    return keep / keep.sum(0, keepdim=True)


def target_quality(glob: dict[str, Tensor], agg: dict[str, Tensor], pair: tuple[str, str]) -> dict[str, float]:
    """How good a teacher eq. 7's targets are: the R@1 sum (i2t + t2i, row k paired with row k) on
    the public set of the server's own representations (``server_public_r1_sum``) and of the
    aggregated client representations it distills toward (``target_public_r1_sum``), and their
    mean cosine per modality (``target_cos/<m>``). A target set that retrieves worse than the
    server's own representations can only pull the server toward worse retrieval."""
    a, b = pair
    out = {}
    if a in glob and b in glob and glob[a].shape[0] == glob[b].shape[0]:
        r = evaluate_retrieval(glob[a], glob[b], torch.arange(glob[a].shape[0]), "plain")
        out["server_public_r1_sum"] = r["i2t_r1"] + r["t2i_r1"]
        if a in agg and b in agg:
            r = evaluate_retrieval(F.normalize(agg[a], dim=-1), F.normalize(agg[b], dim=-1),
                                   torch.arange(agg[a].shape[0]), "plain")
            out["target_public_r1_sum"] = r["i2t_r1"] + r["t2i_r1"]
    for m, t in agg.items():
        out[f"target_cos/{m}"] = float(F.cosine_similarity(t, glob[m], dim=-1).mean())
    return out


def pair_modalities(meta) -> tuple[str, str]:
    mods = sorted(meta.modalities)
    if len(mods) != 2:
        raise ConfigError(f"data.name: CreamFL needs a paired data set with two modalities, "
                          f"'{meta.name}' has {mods}")
    return mods[0], mods[1]


def retrieval_metrics(model: nn.Module, test, meta, modalities: tuple[str, str], batch_size: int = 512) -> dict:
    """Image-to-text and text-to-image Recall@1/5/10 of ``model`` on ``test`` (see
    :func:`mmfl.core.retrieval.evaluate_retrieval`): the 1K protocol for 5,000 test
    images, else plain; rows paired by instance (or several captions per image via
    ``meta.info["image_index"]``), or by class for class-paired sets."""
    reps = public_reps(model, test, modalities, batch_size)
    a, b = modalities
    img, txt = (reps["image"], reps[b if a == "image" else a]) if "image" in modalities else (reps[a], reps[b])
    pairing = (meta.info or {}).get("pairing", "instance")
    index = ((meta.info or {}).get("image_index") or {}).get("test")
    if pairing == "class":
        labels = test.get()[1]
        out = evaluate_retrieval(img, txt, None, "plain", class_level=True, img_labels=labels, txt_labels=labels)
    elif index is not None and int(index.numel()) == len(test):
        img, txt, t2i = pairs_to_retrieval(img, txt, index)
        out = evaluate_retrieval(img, txt, t2i)
    else:
        out = evaluate_retrieval(img, txt, torch.arange(len(test)))
        if meta.num_classes > 1:  # also by class: a hit is an item of the query's class
            labels = test.get()[1]
            by_class = evaluate_retrieval(img, txt, None, "plain", class_level=True, img_labels=labels,
                                          txt_labels=labels)
            out.update({f"class_{k}": v for k, v in by_class.items() if isinstance(v, float)})
    return {k: v for k, v in out.items() if isinstance(v, float)}


# ----------------------------------------------------------------------------- server


class CreamFLServer(Server):
    """Server of the representation-exchange family (CreamFL, reamFL, FedMD, FedET, FedGEMS)."""

    def __init__(self, params: CreamFLParams, ctx):
        super().__init__(params, ctx)
        self.pair = pair_modalities(ctx.meta)
        if ctx.public is None or len(ctx.public) == 0:
            raise ConfigError(f"data: '{ctx.meta.name}' has no public set; CreamFL-style algorithms need "
                              "one (data.public_fraction for emoji_pairs / mfeat_pair, data.public_images for "
                              "coco_captions / flickr30k)")
        missing = [m for m in self.pair if m not in ctx.public.features]
        if missing:
            raise ConfigError(f"data: the public set lacks modality {missing[0]!r}")
        if not all(hasattr(self.model, a) for a in ("encoders", "proj", "heads")):
            raise ConfigError("model.name: CreamFL-style algorithms need model.name = \"multimodal\", "
                              f"got a {type(self.model).__name__}")
        self.public = select_public(ctx.public, params.public_size)
        # Alg. 1's two server phases (public epoch, distillation eq. 7), each with its own persistent,
        # checkpointed Adam state ("per_phase"), or one Adam for both ("shared", the authors' code)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=params.server_lr)
        self.opt_kd = torch.optim.Adam(self.model.parameters(), lr=params.server_lr) \
            if params.server_optimizer == "per_phase" else self.opt
        self.consensus: dict[str, Tensor] = {}

    # what each client receives
    def needs(self, holds: tuple[str, ...]) -> list[str]:
        """The global representations a client holding ``holds`` needs for its regularization."""
        p = self.params
        need = set()
        for m in holds:
            if m not in self.pair:
                continue
            other = self.pair[1] if m == self.pair[0] else self.pair[0]
            if p.inter:
                need.add(other)
            if p.intra or p.local_distill == "global":
                need.add(m)
        return sorted(need)

    def server_lr(self, rnd: int) -> float:
        """The server's learning rate in round ``rnd``: ``server_lr`` under the paper's cosine schedule
        (T = the run's rounds, to 0) or constant."""
        p = self.params
        if p.server_lr_schedule == "constant" or self.ctx.rounds < 1:
            return p.server_lr
        return cosine_lr(p.server_lr, rnd, self.ctx.rounds)

    def round(self, rnd, cohort, transport):
        p = self.params
        metrics: dict = {"server_lr": self.server_lr(rnd)}
        for opt in (self.opt, self.opt_kd):
            set_lr(opt, metrics["server_lr"])
        if p.server_public_epochs:
            metrics["server_public_loss"] = self.train_public(rnd)
        glob = public_reps(self.model, self.public, self.pair)
        by_holds: dict[tuple, Message] = {}
        msgs = {}
        for cid in cohort:
            holds = self.ctx.modalities_of(cid)
            if holds not in by_holds:  # one message object per modality set, counted per recipient
                arrays = {GLOBAL + m: glob[m] for m in self.needs(holds)}
                if p.local_distill == "consensus":
                    arrays.update({CONSENSUS + m: self.consensus[m] for m in holds if m in self.consensus})
                by_holds[holds] = Message(arrays=arrays)
            msgs[cid] = by_holds[holds]
        replies = transport.send("train", msgs)
        if not replies:
            return {**metrics, "clients_replied": 0}
        agg, info = self.aggregate_reps(replies, glob)
        metrics.update(info)
        metrics.update(target_quality(glob, agg, self.pair))
        if p.local_distill == "consensus":
            self.consensus = {m: agg[m].clone() for m in agg}
        metrics["distill_loss"] = self.distill(agg, rnd)
        for key in ("train_loss", "task_loss", "lcr_loss"):
            v = weighted_mean_scalar(replies, key)
            if v is not None:
                metrics[key] = v
        metrics["clients_replied"] = len(replies)
        return metrics

    def aggregate_reps(self, replies: dict[int, Message], glob: dict[str, Tensor]) -> tuple[dict, dict]:
        """Eq. 4-6 (or the chosen rule) per modality, over the replies carrying it."""
        p = self.params
        agg, info = {}, {}
        for m in self.pair:
            cids = [c for c in sorted(replies) if REP + m in replies[c].arrays]
            if not cids:
                continue
            local = torch.stack([replies[c].arrays[REP + m].float() for c in cids])  # [C, P, d]
            other = self.pair[1] if m == self.pair[0] else self.pair[0]
            if p.aggregation == "gca":
                w = torch.softmax(global_local_contrastive_scores(  # eq. 4, then eq. 5
                    local, glob[other], p.chunk, p.exclude_positive), dim=0)
            elif p.aggregation == "mean":
                w = torch.full((len(cids), local.shape[1]), 1.0 / len(cids))
            elif p.aggregation in ("avg", "iot"):
                raw = torch.tensor([self.client_weight(replies[c], c) for c in cids], dtype=torch.float32)
                w = (raw / raw.sum()).unsqueeze(1).expand(-1, local.shape[1])
            elif p.aggregation == "variance":
                w = variance_weights(local)
            else:
                w = entropy_selection_weights(local, p.entropy_temperature)
            agg[m] = aggregate_representations(local, w)  # eq. 6
            info[f"clients/{m}"] = len(cids)
            info[f"weight_max/{m}"] = float(w.max(0).values.mean())  # 1/C = uniform, 1 = one client per sample
        return agg, info

    def client_weight(self, reply: Message, cid: int) -> float:
        """avg: the client's sample count; iot: the same, times ``iot_weight`` for image-text
        clients (reamFL+IoT is "similar to [reamFL+Avg] except that higher weights (set to
        100 ...) are assigned to multimodal clients")."""
        n = float(reply.scalars["num_examples"])
        if self.params.aggregation == "iot" and set(self.pair) <= set(self.ctx.modalities_of(cid)):
            return n * float(self.params.iot_weight)
        return n

    def begin_phase(self, opt: torch.optim.Optimizer) -> None:
        """``restart``: zero Adam's first moment as a server phase begins, so no phase steps along
        the other phase's momentum; the second moment (the gradient scale both losses share) stays."""
        if self.params.server_optimizer == "restart":
            for st in opt.state.values():
                if "exp_avg" in st:
                    st["exp_avg"].zero_()

    def train_public(self, rnd: int) -> float:
        """Alg. 1 line 18: one epoch of the image-text task on the public pairs."""
        a, b = self.pair
        gen = torch.Generator().manual_seed(derive_seed(self.ctx.seed, rnd, "server-public"))
        total, steps = 0.0, 0
        self.begin_phase(self.opt)
        self.model.train()
        for _ in range(self.params.server_public_epochs):
            for inputs, _ in self.public.batches(self.params.server_batch_size, shuffle=True, generator=gen):
                if inputs[a].shape[0] < 2:
                    continue
                z = reps_of(self.model, inputs, self.pair)
                loss = pair_loss(self.model, inputs, z, self.pair, self.params, gen)  # InfoNCE or PCME
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
                total, steps = total + float(loss.detach()), steps + 1
        return total / max(steps, 1)

    def distill(self, agg: dict[str, Tensor], rnd: int) -> float:
        """Eq. 7: ``kd_weight * sum_m MSE(f_m(x^(k)), agg_m^(k))`` over the public set."""
        if not agg or not self.params.distill_epochs or not self.params.kd_weight:
            return 0.0
        gen = torch.Generator().manual_seed(derive_seed(self.ctx.seed, rnd, "server-distill"))
        n = len(self.public)
        total, steps = 0.0, 0
        self.begin_phase(self.opt_kd)
        self.model.train()
        for rows in shuffled_batches(n, self.params.server_batch_size, gen, self.params.distill_epochs):
            inputs, _ = self.public.get(rows)
            z = reps_of(self.model, inputs, list(agg))
            loss = self.params.kd_weight * sum(F.mse_loss(z[m], agg[m][rows]) for m in z)
            self.opt_kd.zero_grad(set_to_none=True)
            loss.backward()
            self.opt_kd.step()
            total, steps = total + float(loss.detach()), steps + 1
        return total / max(steps, 1)

    def evaluate(self, rnd, test, transport):
        return retrieval_metrics(self.model, test, self.ctx.meta, self.pair)

    def state_dict(self):
        out = super().state_dict()
        names = {id(p): n for n, p in self.model.named_parameters()}
        out.update(optimizer_state(self.opt, names, OPT))
        if self.opt_kd is not self.opt:
            out.update(optimizer_state(self.opt_kd, names, OPT_KD))
        out.update({CONSENSUS + m: t for m, t in self.consensus.items()})
        return out

    def load_state_dict(self, sd):
        super().load_state_dict(sd)
        load_optimizer_state(self.opt, dict(self.model.named_parameters()), sd, OPT)
        if self.opt_kd is not self.opt:
            load_optimizer_state(self.opt_kd, dict(self.model.named_parameters()), sd, OPT_KD)
        self.consensus = {k[len(CONSENSUS):]: v for k, v in sd.items() if k.startswith(CONSENSUS)}


def select_public(public, size: int):
    """The first ``size`` rows of a fixed permutation of the public set (all if 0): the
    server and every client pick the same rows without exchanging them."""
    if not size or size >= len(public):
        return public
    gen = torch.Generator().manual_seed(derive_seed("public-subset", len(public)))
    return public.subset(torch.randperm(len(public), generator=gen)[:size].sort().values)


# ----------------------------------------------------------------------------- client


class CreamFLClient(Client):
    """A client of the representation-exchange family: keeps its own model (any size),
    trains its private task with LCR, uploads representations of the public set."""

    def pair(self) -> list[str]:
        if self.ctx.public is None:
            raise ConfigError(f"client {self.ctx.cid}: no public set (CreamFL-style algorithms need one)")
        return sorted(self.ctx.public.modalities)

    def own_model(self) -> nn.Module:
        model = self.ctx.model("local")
        own = {k[len(MODEL):]: v for k, v in self.ctx.state.items() if k.startswith(MODEL)}
        return load_into(model, own if own else self.ctx.init_model().state_dict())

    def task_loss(self, model: nn.Module, inputs: dict[str, Tensor], labels: Tensor, pair: list[str]) -> Tensor:
        """Image-text clients: symmetric InfoNCE (or PCME) on their pairs; uni-modal: cross-entropy of ``heads[m]``."""
        held = [m for m in pair if m in inputs and m in model.holds]
        if len(held) == 2:
            z = reps_of(model, inputs, held) if self.params.multimodal_loss == "infonce" else None
            return pair_loss(model, inputs, z, held, self.params)
        m = held[0] if held else next(m for m in model.holds if m in inputs)
        return F.cross_entropy(model.heads[m](model.proj[m](model.encoders[m](inputs[m]))), labels)

    def train(self, msg: Message) -> Message:
        p, ctx = self.params, self.ctx
        public = select_public(ctx.public, p.public_size)
        pair = self.pair()
        held = [m for m in pair if m in ctx.modalities]
        model = self.own_model()
        self.before_training(model, msg)
        glob = {k[len(GLOBAL):]: v for k, v in msg.arrays.items() if k.startswith(GLOBAL)}
        prev = public_reps(model, public, held) if p.intra and glob else {}
        gen = ctx.generator()
        opt = make_optimizer([q for q in model.parameters() if q.requires_grad], ctx.train)
        model.train()
        stats = {"task": [0.0, 0], "lcr": [0.0, 0], "kd": [0.0, 0]}
        target = {}
        if p.local_distill == "consensus":
            target = {k[len(CONSENSUS):]: v for k, v in msg.arrays.items() if k.startswith(CONSENSUS)}
        elif p.local_distill == "global":
            target = {m: glob[m] for m in held if m in glob}
        if target and p.local_distill_weight:  # FedMD's digest / FedET-FedGEMS's local distillation
            self.public_pass(model, opt, public, gen, stats["kd"], lambda z, rows: p.local_distill_weight * sum(
                F.mse_loss(z[m], target[m][rows]) for m in z if m in target))
        for _ in range(ctx.train.local_epochs):
            for inputs, labels in ctx.data.batches(ctx.train.batch_size, shuffle=True, generator=gen):
                if labels.shape[0] < 2:
                    continue
                loss = self.task_loss(model, inputs, labels, pair)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                stats["task"][0] += float(loss.detach())
                stats["task"][1] += 1
            self.extra_epoch(model, opt, public, gen, stats["task"], pair)
            if glob and (p.inter or p.intra):  # LCR: one pass over the public set after every epoch (eq. 3)
                self.public_pass(model, opt, public, gen, stats["lcr"],
                                 lambda z, rows: p.gamma * self.lcr(z, rows, glob, prev, pair))
        ctx.state.update({MODEL + k: v for k, v in state_of(model).items()})
        out = self.reply_arrays(model, public, held)
        mean = {k: v[0] / max(v[1], 1) for k, v in stats.items()}
        scalars = {"num_examples": len(ctx.data), "train_loss": mean["task"] + mean["lcr"] + mean["kd"],
                   "task_loss": mean["task"]}
        if stats["lcr"][1]:
            scalars["lcr_loss"] = mean["lcr"]
        return Message(arrays=out, scalars=scalars)

    def lcr(self, z: dict[str, Tensor], rows: Tensor, glob: dict[str, Tensor], prev: dict[str, Tensor],
            pair: list[str]) -> Tensor:
        p = self.params
        loss = 0.0
        for m, zm in z.items():
            other = pair[1] if m == pair[0] else pair[0]
            if p.inter and other in glob:
                loss = loss + inter_loss(zm, glob[other], rows, p.lcr_temperature)  # eq. 1
            if p.intra and m in glob and m in prev:
                loss = loss + intra_loss(zm, glob[m][rows], prev[m][rows], p.lcr_temperature)  # eq. 2
        return loss

    def public_pass(self, model, opt, public, gen, stat, loss_of) -> None:
        held = [m for m in self.pair() if m in model.holds]
        for rows in shuffled_batches(len(public), self.ctx.train.batch_size, gen):
            inputs, _ = public.get(rows)
            z = reps_of(model, inputs, held)
            loss = loss_of(z, rows)
            if not isinstance(loss, Tensor):
                continue
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            stat[0] += float(loss.detach())
            stat[1] += 1

    # hooks of the weight-sharing baselines
    def before_training(self, model: nn.Module, msg: Message) -> None:
        pass

    def extra_epoch(self, model, opt, public, gen, stat, pair) -> None:
        pass

    def reply_arrays(self, model: nn.Module, public, held: list[str]) -> dict[str, Tensor]:
        """Step 4: the representations of the public set, only for the modalities held."""
        return {REP + m: t for m, t in public_reps(model, public, held).items()}


# ----------------------------------------------------------------------------- weight sharing (FedAvg, FedIoT)


@dataclass
class WeightSharingParams:
    iot: bool = field(default=False, metadata={
        "help": "FedIoT: image-text clients' weights count iot_weight times in the average"})
    iot_weight: float = field(default=FEDIOT_MULTIMODAL_WEIGHT, metadata={
        "help": "iot: weight of image-text clients (100, the CreamFL paper's FedIoT weight)"})
    public_to_multimodal: bool = field(default=True, metadata={
        "help": "give the public pairs to the image-text clients as extra training pairs (the paper's setting)"})
    temperature: float = field(default=0.1, metadata={"help": "InfoNCE temperature of the image-text task"})
    public_size: int = field(default=0, metadata={"help": "use this many public pairs (0 = all)"})
    # not settable: the weight-sharing baselines neither regularize nor distill
    inter = intra = False
    local_distill = "none"
    local_distill_weight = 0.0
    multimodal_loss = "infonce"  # CreamFLClient.task_loss: the image-text task is InfoNCE here
    server_lr = 0.0  # the server does not train: its model is the average
    server_optimizer = "shared"
    server_lr_schedule = "constant"

    def __post_init__(self):
        if not isinstance(self.iot, bool) or not isinstance(self.public_to_multimodal, bool):
            raise ConfigError("algorithm.iot / public_to_multimodal: expected true or false")
        for key in ("iot_weight", "temperature"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
                raise ConfigError(f"algorithm.{key}: must be a number > 0, got {v!r}")
        if int(self.public_size) < 0:
            raise ConfigError(f"algorithm.public_size: must be >= 0, got {self.public_size!r}")


SHARED = ("encoders.", "proj.")  # what the weight-sharing baselines average; heads etc. stay on the client


class WeightSharingServer(CreamFLServer):
    """FedAvg / FedIoT in CreamFL's homogeneous setting: every client has the server's
    architecture; the held encoders and projectors are averaged module-wise (by sample
    count; FedIoT: image-text clients x ``iot_weight``); the server's model *is* the
    average (it does not train). Heads stay on the clients (their classes differ)."""

    def round(self, rnd, cohort, transport):
        full = {k: v for k, v in self.model.state_dict().items() if k.startswith(SHARED)}
        by_holds: dict[tuple, Message] = {}
        msgs = {}
        for cid in cohort:
            holds = self.ctx.modalities_of(cid)
            if holds not in by_holds:
                by_holds[holds] = Message(arrays=only_held(full, holds))
            msgs[cid] = by_holds[holds]
        replies = transport.send("train", msgs)
        if not replies:
            return {"clients_replied": 0}
        cids = sorted(replies)
        weights = []
        for c in cids:
            w = reply_weights(replies[c])
            if self.params.iot and set(self.pair) <= set(self.ctx.modalities_of(c)):
                w = {k: v * self.params.iot_weight for k, v in w.items()} if isinstance(w, dict) \
                    else w * self.params.iot_weight
            weights.append(w)
        states = [replies[c].arrays for c in cids]
        shapes = {}
        for c, st in zip(cids, states):
            for k, t in st.items():
                if shapes.setdefault(k, tuple(t.shape)) != tuple(t.shape):
                    raise ConfigError(f"'{self.params_name()}' averages weights: client {c} sent {k} of shape "
                                      f"{tuple(t.shape)}, another {shapes[k]}; give every client the server's "
                                      "architecture (no [[client_models]])")
        new = weighted_average(states, weights, previous=self.model.state_dict())
        self.model.load_state_dict(new)
        out = {"clients_replied": len(replies)}
        for key in ("train_loss", "task_loss"):
            v = weighted_mean_scalar(replies, key)
            if v is not None:
                out[key] = v
        return out

    def params_name(self) -> str:
        return "creamfl_fediot" if self.params.iot else "creamfl_fedavg"


class WeightSharingClient(CreamFLClient):
    def before_training(self, model, msg):
        sd = model.state_dict()
        for k, v in msg.arrays.items():
            if k not in sd or sd[k].shape != v.shape:
                raise ConfigError(f"client {self.ctx.cid}: the server's {k} does not fit this client's model; "
                                  "weight sharing needs every client to have the server's architecture")
            sd[k] = v
        model.load_state_dict(sd)

    def extra_epoch(self, model, opt, public, gen, stat, pair):
        """The paper's setting: the public pairs are extra training pairs of image-text clients."""
        if not self.params.public_to_multimodal or not set(pair) <= set(self.ctx.modalities):
            return
        self.public_pass(model, opt, public, gen, stat,
                         lambda z, rows: info_nce(z[pair[0]], z[pair[1]], self.params.temperature))

    def reply_arrays(self, model, public, held):
        return {k: v for k, v in state_of(model).items() if k.startswith(SHARED)}


# ----------------------------------------------------------------------------- registry


register("creamfl", CreamFLParams, CreamFLServer, CreamFLClient,
         help="CreamFL: representations of a public set, GCA (eq. 4-6), inter/intra LCR (eq. 1-3), distillation (eq. 7)")
register("reamfl_mean",
         preset("ReamFLMeanParams", CreamFLParams, aggregation="mean", inter=False, intra=False),
         CreamFLServer, CreamFLClient, help="reamFL+Mean: CreamFL without GCA and LCR, mean of representations")
register("reamfl_avg",
         preset("ReamFLAvgParams", CreamFLParams, aggregation="avg", inter=False, intra=False),
         CreamFLServer, CreamFLClient, help="reamFL+Avg: CreamFL without GCA and LCR, sample-count weights")
register("reamfl_iot",
         preset("ReamFLIoTParams", CreamFLParams, aggregation="iot", inter=False, intra=False),
         CreamFLServer, CreamFLClient, help="reamFL+IoT: CreamFL without GCA and LCR, image-text clients x 100")
register("fedmd",
         preset("FedMDParams", CreamFLParams, aggregation="mean", inter=False, intra=False, local_distill="consensus"),
         CreamFLServer, CreamFLClient,
         help="FedMD on representations: mean consensus, clients digest it; CreamFL's server model distills")
register("fedet",
         preset("FedETParams", CreamFLParams, aggregation="variance", inter=False, intra=False, local_distill="global"),
         CreamFLServer, CreamFLClient,
         help="FedET on representations: variance-weighted ensemble, clients distill from the server")
register("fedgems",
         preset("FedGEMSParams", CreamFLParams, aggregation="entropy", inter=False, intra=False, local_distill="global"),
         CreamFLServer, CreamFLClient,
         help="FedGEMS on representations: entropy-selected ensemble, clients distill from the server")
register("creamfl_fedavg", WeightSharingParams,
         WeightSharingServer, WeightSharingClient,
         help="FedAvg in CreamFL's setting: server-size client models, weights averaged, public pairs to "
              "image-text clients")
register("creamfl_fediot",
         preset("CreamFedIoTParams", WeightSharingParams, iot=True),
         WeightSharingServer, WeightSharingClient,
         help="FedIoT in CreamFL's setting: as creamfl_fedavg, image-text clients weigh 100")
