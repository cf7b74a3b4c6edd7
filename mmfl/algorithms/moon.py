"""MOON: model-contrastive federated learning (Li, He, Song, CVPR 2021).

Local objective (Algorithm 1, lines 13-19; paper eq. 3-4):

    l_sup = CE(F_w(x), y)
    l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )
    l     = l_sup + mu * l_con

with z = R_w(x) the local model's representation (projection-head output),
z_glob from the frozen global model w^t and z_prev from the client's own model
after its previous participation w_i^{t-1}; sim is cosine similarity.

Round 0 (and any client's first participation): there is no previous model,
so l_con is 0 and MOON's first local update equals FedAvg's, as in the
authors' code. The server is FedAvg's.

``contrast = "l2"`` is the paper's Table 5 ablation: l_con is replaced by the
l2 distance ||z - z_glob||_2 (batch mean), with no negative.

Probe (``probe_rows``, a measurement, not part of the method): after local
training each client evaluates, on its first ``probe_rows`` samples, the
trained model's cross-entropy, l_con, and the mean cosines cos(z, z_glob),
cos(z, z_prev) and cos(z_glob, z_prev) (:func:`representation_probe`); the
server reports their data-size-weighted means per round as ``moon/*``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from mmfl.algorithms.registry import register
from mmfl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from mmfl.core.message import Message
from mmfl.core.state import read, write
from mmfl.core.training import load_into, state_of
from mmfl.errors import ConfigError

PREV = "prev/"  # client state: the model after the client's last local training


@dataclass
class MoonParams(FedAvgParams):
    mu: float = field(default=1.0, metadata={"help": "weight of the model-contrastive term"})
    tau: float = field(default=0.5, metadata={"help": "temperature of the model-contrastive term"})
    contrast: Literal["cosine", "l2"] = field(
        default="cosine", metadata={"help": "cosine: MOON's loss; l2: ||z - z_glob|| (Table 5 ablation)"})
    probe_rows: int = field(default=256, metadata={
        "help": "after local training, measure CE, l_con and the cosines of z to z_glob / z_prev on the "
                "client's first this-many samples, reported per round as moon/* (0 = off)"})

    def __post_init__(self):
        super().__post_init__()
        if self.mu < 0:
            raise ConfigError(f"algorithm.mu: must be >= 0, got {self.mu}")
        if not self.tau > 0:
            raise ConfigError(f"algorithm.tau: must be > 0, got {self.tau}")
        if self.probe_rows < 0:
            raise ConfigError(f"algorithm.probe_rows: must be >= 0, got {self.probe_rows}")


def model_contrastive_loss(z: Tensor, z_glob: Tensor, z_prev: Tensor | None, tau: float,
                           reduction: str = "mean") -> Tensor:
    """MOON's l_con (Algorithm 1, line 18; paper eq. 3): batch mean, or ``[B]`` for ``reduction="none"``.

    z, z_glob, z_prev: [B, d]. Positive pair (z, z_glob), negative (z, z_prev).
    Without a previous model (z_prev None) the term is 0.
    """
    if z_prev is None:
        return z.new_zeros(()) if reduction == "mean" else z.new_zeros(z.shape[0])
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=-1),
                          F.cosine_similarity(z, z_prev, dim=-1)], dim=1) / tau  # line 17
    return F.cross_entropy(logits, torch.zeros(z.shape[0], dtype=torch.long, device=z.device),
                           reduction=reduction)


def l2_representation_loss(z: Tensor, z_glob: Tensor, reduction: str = "mean") -> Tensor:
    """||z - z_glob||_2 per sample ``[B]`` (``reduction="none"``) or its batch mean (MOON Table 5's
    l2 alternative)."""
    d = (z - z_glob).norm(dim=-1)
    return d.mean() if reduction == "mean" else d


PROBE = "moon/"  # reply scalars / metrics of the representation probe


@torch.no_grad()
def representation_probe(z: Tensor, z_glob: Tensor, z_prev: Tensor | None, tau: float) -> dict[str, float]:
    """Mean cosines between the representations ``[n, d]`` of the same samples under the
    trained local model (z), the round's global model (z_glob) and the client's previous
    model (z_prev, None before its second participation), and l_con at z."""
    out = {"cos_glob": float(F.cosine_similarity(z, z_glob, dim=-1).mean())}
    if z_prev is not None:
        out["cos_prev"] = float(F.cosine_similarity(z, z_prev, dim=-1).mean())
        out["cos_glob_prev"] = float(F.cosine_similarity(z_glob, z_prev, dim=-1).mean())
        out["con"] = float(model_contrastive_loss(z, z_glob, z_prev, tau))
    return out


class MoonServer(FedAvgServer):
    def reported_scalars(self):
        return tuple(PROBE + k for k in ("ce", "con", "cos_glob", "cos_prev", "cos_glob_prev"))


class MoonClient(FedAvgClient):
    """MOON's objective, once for the sequential and the batched path: the frozen global model
    and the client's previous model are :meth:`references` (clients with and without a previous
    model train in separate batched groups; the latter have no l_con)."""
    stateful = True  # keeps ctx.state between rounds (Capabilities.stateful_clients)

    def references(self, msg: Message) -> dict[str, dict[str, Tensor]]:
        refs = {"global": msg.arrays}
        prev = read(self.ctx.state, PREV)
        if prev and self.params.contrast == "cosine":
            refs["prev"] = prev
        return refs

    def objective(self, out, labels, ref, reduction="mean"):
        rows = out.get("any_present")  # a multimodal model with present/<m> masks: rows holding some modality
        if rows is not None and reduction == "mean":  # a row holding none of them gives neither term
            per = self._objective(out, labels, ref, "none")
            return (per * rows.to(per.dtype)).sum() / rows.sum().clamp(min=1).to(per.dtype)
        return self._objective(out, labels, ref, reduction)

    def _objective(self, out, labels, ref, reduction):
        mu, tau = self.params.mu, self.params.tau
        l_sup = F.cross_entropy(out["logits"], labels, reduction=reduction)  # line 13
        if mu == 0:
            return l_sup
        z = out["rep"]  # line 14
        z_glob = ref("global")["rep"]  # line 15
        if self.params.contrast == "l2":
            return l_sup + mu * l2_representation_loss(z, z_glob, reduction)
        prev = ref("prev")  # line 16
        l_con = model_contrastive_loss(z, z_glob, None if prev is None else prev["rep"], tau, reduction)  # 17-18
        return l_sup + mu * l_con  # line 19

    def finish(self, model, msg: Message, stats: dict) -> Message:
        probe = self.probe(model, msg.arrays) if self.params.probe_rows else {}  # before prev/ is replaced
        reply = super().finish(model, msg, stats)
        reply.scalars.update(probe)
        return reply

    @torch.no_grad()
    def probe(self, model, global_arrays: dict[str, Tensor]) -> dict[str, float]:
        """:func:`representation_probe` and the CE of the trained ``model`` on the client's
        first ``probe_rows`` samples (every model in eval mode), as ``moon/*`` scalars."""
        n = min(self.params.probe_rows, len(self.ctx.data))
        inputs, labels = self.ctx.data.get(torch.arange(n, device=self.ctx.data.labels.device))
        mode = model.training
        out = model.eval()(inputs)
        model.train(mode)
        z_glob = load_into(self.ctx.model("global"), global_arrays).eval()(inputs)["rep"]
        prev_state = read(self.ctx.state, PREV)
        z_prev = load_into(self.ctx.model("prev"), prev_state).eval()(inputs)["rep"] if prev_state else None
        row = {"ce": float(F.cross_entropy(out["logits"], labels)),
               **representation_probe(out["rep"], z_glob, z_prev, self.params.tau)}
        return {PROBE + k: v for k, v in row.items()}

    def after_train(self, model, msg: Message, stats: dict) -> None:
        write(self.ctx.state, PREV, state_of(model))


register("moon", MoonParams, MoonServer, MoonClient,
         help="MOON: FedAvg + model-contrastive local loss (Li et al. CVPR 2021)")
