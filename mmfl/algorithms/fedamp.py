"""FedAMP (Huang, Chu, Zhou, Wang, Liu, Pei, Zhang, "Personalized Cross-Silo Federated
Learning on Non-IID Data", AAAI 2021, arXiv:2007.03797), multimodal-aware.

The objective (the paper's eq. 2; numbering as in arXiv v5 as best recalled, see
docs/algorithms/fedamp.md) is

    min_W  sum_i F_i(w_i) + lambda * sum_{i<j} A(||w_i - w_j||^2),   A(x) = 1 - exp(-x / sigma)

solved by alternating two steps per round k:

- **attentive message passing on the server** (eq. 3, 5): a gradient step on the
  attention term gives each client a personalized cloud model
  ``u_i = xi_{i,i} w_i + sum_{j != i} xi_{i,j} w_j`` with
  ``xi_{i,j} = alpha_k A'(||w_i - w_j||^2)`` (``A'(x) = exp(-x / sigma) / sigma``) and
  ``xi_{i,i} = 1 - sum_{j != i} xi_{i,j}``, so every row sums to one; similar clients
  attend to each other more (``attention = "paper"``). If ``alpha_k sum_j A'`` exceeds 1
  (close models, large ``alpha / sigma``) the peers' weights are scaled to sum to 1 and
  ``xi_{i,i} = 0`` (counted in ``amp_rescaled``). ``attention = "normalized"`` instead
  fixes ``xi_{i,i} = self_weight`` and shares ``1 - self_weight`` among the peers in
  proportion to ``A'(d_{i,j})`` (a softmax of ``-d / sigma``, which never underflows;
  HeurFedAMP's form with FedAMP's kernel);
- **a proximal step on each client** (eq. 4, 6): starting from its own model, the client
  minimises ``F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2`` for the local epochs and
  uploads ``w_i``.

Multimodal clients. A client holding only some modalities holds, receives and uploads
only their modules. The distance ``d_{i,j} = ||w_i - w_j||^2`` runs over the
parameters of the modules both hold. In the cloud model a peer that lacks a module
contributes client i's own value there, which is exactly the gradient step on
``A(||w_i - w_j||^2_shared)`` (zero gradient outside the shared modules), so every
module's weights sum to one too.

The server stores every client's latest ``w_i`` (``clients/<cid>/...``, checkpointed) and
evaluates them per device with :func:`mmfl.core.personal.evaluate_personalized`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from mmfl.algorithms.registry import register
from mmfl.algorithms.base import Client
from mmfl.algorithms.fedavg import weighted_mean_scalar
from mmfl.algorithms.fedfomo import PersonalizedServer, keep_own, own_model, personal_loss
from mmfl.algorithms.multimodal import proximal
from mmfl.core.message import Message
from mmfl.core.training import load_into, local_train, model_tensors, state_of
from mmfl.errors import ConfigError


@dataclass
class FedAMPParams:
    alpha: float = field(default=1.0, metadata={"help": "alpha_k, step size of the message-passing step (eq. 3, 5)"})
    lam: float = field(default=1.0, metadata={
        "help": "lambda, weight of the attention term; proximal weight lambda/(2 alpha_k) (eq. 6)"})
    sigma: float = field(default=1.0, metadata={"help": "sigma of A(x) = 1 - exp(-x/sigma)"})
    attention: Literal["paper", "normalized"] = field(default="paper", metadata={
        "help": "paper: xi_ij = alpha A'(d_ij), xi_ii = 1 - sum; "
                "normalized: xi_ii = self_weight, peers share the rest by A'(d_ij)"})
    self_weight: float = field(default=0.5, metadata={"help": "xi_ii for attention = \"normalized\""})
    start: Literal["own", "cloud"] = field(default="own", metadata={
        "help": "local training starts from the client's own model (own) or from its cloud model u_i (cloud)"})
    probe: bool = field(default=True, metadata={
        "help": "train the per-modality heads as linear probes on detached features (per-modality accuracy)"})

    def __post_init__(self):
        if not self.alpha > 0:
            raise ConfigError(f"algorithm.alpha: must be > 0, got {self.alpha}")
        if self.lam < 0:
            raise ConfigError(f"algorithm.lam: must be >= 0, got {self.lam}")
        if not self.sigma > 0:
            raise ConfigError(f"algorithm.sigma: must be > 0, got {self.sigma}")
        if not 0.0 <= self.self_weight <= 1.0:
            raise ConfigError(f"algorithm.self_weight: must be in [0, 1], got {self.self_weight}")


# ----------------------------------------------------------------------------- FedAMP's equations


def squared_distance(a: dict[str, Tensor], b: dict[str, Tensor], names) -> float:
    """||a - b||^2 over the entries of ``names`` both hold (float64)."""
    return float(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in names if k in a and k in b))


def attention_weights(dists, alpha: float, sigma: float, mode: str = "paper",
                      self_weight: float = 0.5) -> tuple[float, Tensor, bool]:
    """``(xi_ii, xi_i. over the peers, rescaled)`` for one client from its squared distances to
    the peers. ``paper``: xi_ij = alpha * A'(d_ij) = alpha * exp(-d_ij/sigma)/sigma (eq. 5),
    scaled to sum to 1 if they exceed it (``rescaled``), xi_ii = 1 - sum. ``normalized``:
    xi_ii = self_weight, xi_ij = (1 - self_weight) * A'(d_ij) / sum_h A'(d_ih). No peers: (1, [], False)."""
    d = torch.as_tensor(list(dists), dtype=torch.float64, device="cpu")  # host numbers: a few per client
    if d.numel() == 0:
        return 1.0, d, False
    if mode == "normalized":
        return float(self_weight), (1.0 - self_weight) * torch.softmax(-d / sigma, 0), False
    xi = alpha * torch.exp(-d / sigma) / sigma
    total = float(xi.sum())
    if total > 1.0:
        return 0.0, xi / total, True
    return 1.0 - total, xi, False


def cloud_model(own: dict[str, Tensor], peers: list[dict[str, Tensor]], self_w: float, peer_w) -> dict[str, Tensor]:
    """u_i = xi_ii w_i + sum_j xi_ij w_j (eq. 5), entry by entry; a peer lacking an entry counts
    as w_i there; integer buffers keep the own value."""
    out = {}
    for k, t in own.items():
        if not t.is_floating_point():
            out[k] = t.clone()
            continue
        acc = t.double() * self_w
        for p, w in zip(peers, peer_w):
            acc = acc + float(w) * (p[k].double() if k in p else t.double())
        out[k] = acc.to(t.dtype)
    return out


# ----------------------------------------------------------------------------- server / client


class FedAMPServer(PersonalizedServer):
    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self._self_w: list[float] = []  # this round's xi_ii, for the metrics
        self._rescaled = 0

    def cloud_for(self, cid: int) -> tuple[dict[str, Tensor], float, bool]:
        """``(u_i, xi_ii, rescaled)`` from the stored models W^{k-1}."""
        own = self.state_of_client(cid)
        peer_ids = [j for j in sorted(self.client_models) if j != cid]
        peers = [self.client_models[j] for j in peer_ids]
        dists = [squared_distance(own, p, self.param_names) for p in peers]
        p = self.params
        self_w, peer_w, rescaled = attention_weights(dists, p.alpha, p.sigma, p.attention, p.self_weight)
        return cloud_model(own, peers, self_w, peer_w.tolist()), self_w, rescaled

    def configure_train(self, rnd, cohort):
        out, self._self_w, self._rescaled = {}, [], 0
        for cid in cohort:  # every u_i from the same W^{k-1}: nothing is stored before aggregate_train
            u, self_w, rescaled = self.cloud_for(cid)
            self._self_w.append(self_w)
            self._rescaled += int(rescaled)
            out[cid] = Message(arrays=u)
        return out

    def aggregate_train(self, rnd, replies):
        for cid in sorted(replies):
            self.store(cid, replies[cid].arrays)
        out = {"amp_self_weight": float(sum(self._self_w) / max(len(self._self_w), 1)),
               "amp_rescaled": self._rescaled}
        loss = weighted_mean_scalar(replies, "train_loss")
        if loss is not None:
            out["train_loss"] = loss
        return out


class FedAMPClient(Client):
    def train(self, msg: Message) -> Message:
        ctx, p = self.ctx, self.params
        if p.start == "cloud":
            model = ctx.model("local")
            model = load_into(model, {k: msg.arrays[k] for k in model_tensors(model)})
        else:
            model = own_model(ctx)
        anchor = {k: v.detach() for k, v in msg.arrays.items()}
        coef = p.lam / (2 * p.alpha)  # lambda / (2 alpha_k) (eq. 6)
        skip = (lambda n: n.startswith("heads.")) if p.probe else (lambda n: False)

        def loss(m, x, y):
            base = personal_loss(m, x, y, p.probe)
            return base if coef == 0 else base + coef * proximal(m, anchor, skip=skip)

        stats = local_train(model, ctx.data, ctx.train, ctx.generator(), loss_fn=loss)
        if p.start == "own":
            keep_own(ctx, model)
        return Message(arrays=state_of(model), scalars={"num_examples": len(ctx.data),
                                                        "train_loss": stats["train_loss"], "steps": stats["steps"]})


register("fedamp", FedAMPParams, FedAMPServer, FedAMPClient,
         help="FedAMP: attentive message passing into per-client cloud models + proximal local training "
              "(Huang et al. 2021); personalized evaluation")
