"""FedFomo (Zhang, Sapra, Fidler, Yeung, Alvarez, "Personalized Federated Learning with
First Order Model Optimization", ICLR 2021, arXiv:2012.08565), multimodal-aware.

Every client i keeps its own model theta_i. Each round a sampled client

1. downloads the models of M other clients (epsilon-greedy on the server's affinity
   matrix P (the paper's sampling scheme): with probability epsilon a random client, else
   the highest p_{i,j}; epsilon decays by ``epsilon_decay`` per round);
2. scores each on its local validation split and weighs it by the first-order
   improvement per unit of parameter distance (the paper's eq. 5-6; numbering as in
   arXiv v4 as best recalled, see docs/algorithms/fedfomo.md)::

       w_{i,j} = max(0, (L_i(theta_i^{t-1}) - L_i(theta_j^t)) / ||theta_j^t - theta_i^{t-1}||)
       w_{i,j} <- w_{i,j} / sum_j w_{i,j}            (all zero: keep theta_i)

3. takes the federated update (eq. 4)::

       theta_i^t = theta_i^{t-1} + sum_j w_{i,j} (theta_j^t - theta_i^{t-1})

4. trains it locally (on the training part of its data) and uploads it; the server
   stores it (for the others to download) and adds the client's normalised signed
   improvements to its row of P (the affinity update, as in the authors' code).

Multimodal clients. A client holding only some modalities holds, uploads and
downloads only their modules (:func:`~mmfl.algorithms.multimodal.only_held`): the
server sends client i only the modules of peer j that i also holds. The candidate
model "theta_j" that i scores is i's own model with the modules both hold replaced
by j's (i's own modules of modalities j lacks stay i's), so its loss is defined on
i's data and ``||theta_j - theta_i||`` is the distance over the parameters of the
modules both hold. The update (3) then moves each shared module towards the peers
holding it and leaves a module only i holds at its own value.

The server keeps each client's latest uploaded model (``clients/<cid>/...`` in its
state, so checkpoints and resume carry them) and declares the personalized
evaluation (:mod:`mmfl.core.evaluation`): each device's model on test rows that
follow its own label distribution, with only the modalities it holds. :class:`PersonalizedServer` is shared with FedAMP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmfl.algorithms.registry import register
from mmfl.algorithms.base import Client, Server
from mmfl.algorithms.fedavg import weighted_mean_scalar
from mmfl.algorithms.multimodal import masked_ce, only_held
from mmfl.data.base import ArrayDataset
from mmfl.core.message import Message
from mmfl.core.replies import ReplySchema
from mmfl.core.state import per_client, read, record, tensor, write
from mmfl.core.training import load_into, local_train, state_of
from mmfl.errors import ConfigError, MMFLError
from mmfl.seeds import derive_seed

OWN = "model/"  # client state: the client's own model
PEER = "peer/"  # message arrays: peer/<cid>/<state key>, the modules of a peer the recipient holds
PEERS = "fomo/peers"  # reply: the peers scored, in order
DELTA = "fomo/affinity"  # reply: their signed normalised improvements (the row update of P)
WEIGHTS = "fomo/weights"  # reply: the weights w_{i,j} used in the update (eq. 4)


# ----------------------------------------------------------------------------- shared by FedFomo / FedAMP


def personal_loss(model: nn.Module, inputs: dict[str, Tensor], labels: Tensor, probe: bool = True) -> Tensor:
    """Cross-entropy of the joint output, plus (multimodal model, ``probe``) the linear probes
    ``heads[m]`` on the detached ``z_m`` that give the per-modality accuracy (as MFedAvg)."""
    out = model(inputs)
    loss = masked_ce(out["logits"], labels, out.get("any_present"))  # rows holding no modality: no loss
    heads = getattr(model, "heads", None)
    if probe and heads is not None and "mod_reps" in out:
        for m, z in out["mod_reps"].items():
            loss = loss + masked_ce(heads[m](z.detach()), labels, out.get("present", {}).get(m))
    return loss


def own_model(ctx) -> nn.Module:
    """The client's own model from its state (``model/*``); the run's initial weights before
    its first round. Loaded into the pooled ``local`` instance."""
    model = ctx.model("local")
    own = read(ctx.state, OWN)
    return load_into(model, own if own else state_of(ctx.init_model()))


def keep_own(ctx, model: nn.Module) -> None:
    write(ctx.state, OWN, state_of(model))


class PersonalizedServer(Server):
    """A server holding one model per client (the latest each uploaded) and evaluating them
    with the personalized evaluation. ``self.model`` stays the run's initial model; a client
    that never uploaded is represented by the initial weights of its modules."""
    runs_on = "multimodal"

    state_fields = {"client_models": per_client()}  # each client's latest model
    trains_modality_heads = True  # personal_loss's probes (algorithm.probe)

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.client_models: dict[int, dict[str, Tensor]] = {}
        self._initial: dict[tuple, dict[str, Tensor]] = {}
        self._eval_models: dict[tuple, nn.Module] = {}
        # a list in the model's order, not a set: FedAMP's distances sum over it in float64, and a set's
        # order of strings changes with PYTHONHASHSEED (a run's xi differed in the last bit between processes)
        self.param_names = [n for n, p in self.model.named_parameters() if p.requires_grad]

    # --- per-client models ---------------------------------------------------
    def holds(self, cid: int) -> tuple[str, ...] | None:
        """The modalities of ``cid`` as ``make_model`` takes them (None: every modality)."""
        h = tuple(self.ctx.modalities_of(cid))
        return None if h == tuple(self.ctx.meta.modalities) else h

    def initial_state(self, cid: int) -> dict[str, Tensor]:
        h = self.holds(cid)
        if h not in self._initial:
            self._initial[h] = state_of(self.ctx.make_model(h) if h is not None else self.ctx.make_model())
        return self._initial[h]

    def state_of_client(self, cid: int) -> dict[str, Tensor]:
        """The server's copy of client ``cid``'s model (its initial weights before it uploaded)."""
        return self.client_models.get(cid) or self.initial_state(cid)

    def store(self, cid: int, arrays: dict[str, Tensor]) -> None:
        own = self.initial_state(cid)
        missing = [k for k in own if k not in arrays]
        if missing:
            raise MMFLError(f"client {cid} uploaded no value for '{missing[0]}'")
        self.client_models[cid] = {k: arrays[k].detach().clone() for k in own}

    def model_of(self, cid: int) -> nn.Module:
        """Client ``cid``'s personalized model: one reusable module per modality set, reloaded
        on every call (``evaluate_personalized`` uses each before asking for the next)."""
        h = self.holds(cid)
        if h not in self._eval_models:
            self._eval_models[h] = self.ctx.make_model(h) if h is not None else self.ctx.make_model()
        return load_into(self._eval_models[h], self.state_of_client(cid))

    # --- the round -----------------------------------------------------------
    def round(self, rnd, cohort, transport):
        if self.ctx.client_groups is not None or self.ctx.client_sources is not None:
            raise ConfigError(f"algorithm.name: '{self.algorithm_name()}' needs one architecture and one "
                              "data set for all clients (no [[client_models]] / [[client_data]])")
        return super().round(rnd, cohort, transport)

    def algorithm_name(self) -> str:
        return type(self).__name__.removesuffix("Server").lower()

    # --- evaluation ----------------------------------------------------------
    # each device's own model, on test rows following its training label distribution, with
    # only its modalities (mmfl.core.evaluation; in the simulation no messages, on Flower the
    # server's copy of each client's model goes to that client, which scores it on its own rows)
    evaluations = {"personalized": ""}

    def personal_model(self, cid: int) -> nn.Module:
        return self.model_of(cid)

    def personal_state(self, cid: int) -> dict[str, Tensor]:
        return self.state_of_client(cid)


def shared_distance(a: dict[str, Tensor], b: dict[str, Tensor], names) -> float:
    """||a - b|| over the entries of ``names`` both hold (float64)."""
    total = 0.0
    for k in names:
        if k in a and k in b:
            total += float(((a[k].double() - b[k].double()) ** 2).sum())
    return total ** 0.5


# ----------------------------------------------------------------------------- FedFomo's equations


def fomo_weights(own_loss: float, peer_losses, distances, eps: float = 1e-12) -> tuple[Tensor, Tensor]:
    """``(raw, w)``: raw_j = (L_i(theta_i) - L_i(theta_j)) / ||theta_j - theta_i|| (eq. 5) and
    w_j = max(0, raw_j) / sum_j max(0, raw_j) (eq. 6); all zero when no peer improves the loss.
    A peer at distance 0 is the own model (raw 0)."""
    losses = torch.as_tensor(list(peer_losses), dtype=torch.float64, device="cpu")  # host numbers, one per peer
    dist = torch.as_tensor(list(distances), dtype=torch.float64, device="cpu")
    raw = (own_loss - losses) / dist.clamp_min(eps)
    raw = torch.where(dist > 0, raw, torch.zeros_like(raw))
    pos = raw.clamp_min(0.0)
    total = pos.sum()
    return raw, (pos / total if total > 0 else torch.zeros_like(pos))


def affinity_update(raw: Tensor, eps: float = 1e-9) -> Tensor:
    """The row update of P: raw / |sum raw| (the authors' code adds these signed, so a peer that
    hurt the client's validation loss loses affinity)."""
    return raw / max(float(raw.sum().abs()), eps)


def fomo_update(own: dict[str, Tensor], peers: list[dict[str, Tensor]], weights) -> dict[str, Tensor]:
    """theta_i + sum_j w_j (theta_j - theta_i) (eq. 4), entry by entry; a peer lacking an entry
    contributes theta_i there (zero difference); integer buffers keep the own value."""
    out = {}
    for k, t in own.items():
        if not t.is_floating_point():
            out[k] = t.clone()
            continue
        acc = t.double().clone()
        for p, w in zip(peers, weights):
            if k in p and float(w) != 0.0:
                acc.add_(p[k].double() - t.double(), alpha=float(w))
        out[k] = acc.to(t.dtype)
    return out


def select_peers(scores: np.ndarray, candidates: list[int], m: int, epsilon: float,
                 rng: np.random.Generator) -> list[int]:
    """Epsilon-greedy choice of ``m`` peers (the paper's sampling scheme): per slot, with probability
    ``epsilon`` the next of a random order, else the next-highest affinity (ties broken at random)."""
    if m <= 0 or m >= len(candidates):
        return list(candidates)
    tie = rng.random(len(candidates))
    top = [candidates[i] for i in np.lexsort((tie, scores))[::-1]]
    rand = [candidates[i] for i in rng.permutation(len(candidates))]
    chosen: list[int] = []
    for _ in range(m):
        pool = rand if rng.random() < epsilon else top
        chosen.append(next(c for c in pool if c not in chosen))
    return chosen


def split_validation(data: ArrayDataset, fraction: float, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """``(train, val)``: a fixed random ``fraction`` of the client's rows for validation (at least
    one, and at least one left to train on); ``fraction = 0``: validate on the training data."""
    n = len(data)
    n_val = int(round(fraction * n))
    if fraction > 0:
        n_val = min(max(1, n_val), n - 1)
    if n_val <= 0:
        return data, data
    perm = torch.randperm(n, generator=torch.Generator(device="cpu").manual_seed(seed), device="cpu")
    return data.subset(perm[n_val:].sort().values), data.subset(perm[:n_val].sort().values)


@torch.no_grad()
def mean_loss(model: nn.Module, data: ArrayDataset, batch_size: int = 1000) -> float:
    """Mean cross-entropy of the joint output on ``data`` (eval mode)."""
    model.eval()
    total, n = 0.0, 0
    for inputs, labels in data.batches(batch_size, shuffle=False):
        total += float(F.cross_entropy(model(inputs)["logits"], labels, reduction="sum"))
        n += labels.shape[0]
    return total / max(n, 1)


# ----------------------------------------------------------------------------- params


@dataclass
class FedFomoParams:
    num_peers: int = field(default=0, metadata={
        "help": "M, models each client downloads per round (0 = every other client's, as the wireless paper runs it)"})
    epsilon: float = field(default=0.3, metadata={
        "help": "epsilon-greedy exploration at round 0 (random peer instead of the top affinity)"})
    epsilon_decay: float = field(default=0.05, metadata={"help": "epsilon decrease per round (floored at 0)"})
    val_fraction: float = field(default=0.2, metadata={
        "help": "share of each client's data held out to score the downloaded models; 0 = score on the training data"})
    probe: bool = field(default=True, metadata={
        "help": "train the per-modality heads as linear probes on detached features (per-modality accuracy)"})

    def __post_init__(self):
        if self.num_peers < 0:
            raise ConfigError(f"algorithm.num_peers: must be >= 0 (0 = all), got {self.num_peers}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ConfigError(f"algorithm.epsilon: must be in [0, 1], got {self.epsilon}")
        if self.epsilon_decay < 0:
            raise ConfigError(f"algorithm.epsilon_decay: must be >= 0, got {self.epsilon_decay}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"algorithm.val_fraction: must be in [0, 1), got {self.val_fraction}")


# ----------------------------------------------------------------------------- server / client


class FedFomoServer(PersonalizedServer):
    state_fields = {"fomo": record(P=tensor())}  # "fomo/P": the affinity matrix P [N, N]

    @property
    def fomo(self) -> dict[str, Tensor]:
        return {"P": self.affinity}

    @fomo.setter
    def fomo(self, value: dict[str, Tensor]) -> None:
        self.affinity = value["P"]

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        n = ctx.num_clients
        self.affinity = torch.zeros(n, n, dtype=torch.float64, device=ctx.device)  # P; the diagonal is never used

    def extra_reply_arrays(self) -> ReplySchema:
        """A reply also carries the peers it scored and their affinity updates and weights (one
        entry per peer, so of any length)."""
        return ReplySchema(free=("fomo/",), required=(PEERS, DELTA, WEIGHTS))

    def epsilon(self, rnd: int) -> float:
        return max(self.params.epsilon - rnd * self.params.epsilon_decay, 0.0)

    def peers_for(self, rnd: int, cid: int) -> list[int]:

        candidates = [j for j in sorted(self.client_models) if j != cid]  # uploaded at least once
        if not candidates:
            return []
        rng = np.random.default_rng(derive_seed(self.ctx.seed, rnd, cid, "fedfomo-peers"))
        scores = self.affinity[cid, candidates].cpu().numpy()
        return select_peers(scores, candidates, self.params.num_peers, self.epsilon(rnd), rng)

    def configure_train(self, rnd, cohort):

        out = {}
        for cid in cohort:
            holds = tuple(self.ctx.modalities_of(cid))
            arrays = {}
            for j in self.peers_for(rnd, cid):
                arrays.update({f"{PEER}{j}/{k}": v for k, v in only_held(self.client_models[j], holds).items()})
            out[cid] = Message(arrays=arrays, scalars={"val_seed": derive_seed(self.ctx.seed, "fedfomo-val", cid)})
        return out

    def aggregate_train(self, rnd, replies):
        positive, peers, kept = [], [], 0
        for cid in sorted(replies):
            r = replies[cid]
            self.store(cid, {k: v for k, v in r.arrays.items() if not k.startswith("fomo/")})
            ids = r.arrays[PEERS].long().to(self.affinity.device)
            if ids.numel():
                self.affinity[cid, ids] += r.arrays[DELTA].double().to(self.affinity.device)  # p_{i,j} += update
                w = r.arrays[WEIGHTS]
                positive.append(int((w > 0).sum()))
                kept += int(not bool((w > 0).any()))
            peers.append(int(ids.numel()))
        out = {"fomo_epsilon": self.epsilon(rnd), "fomo_peers": float(np.mean(peers))}
        if positive:
            out["fomo_positive"] = float(np.mean(positive))  # peers with w_{i,j} > 0, per scoring client
            out["fomo_kept_own"] = kept / len(positive)  # share of scoring clients whose every w_{i,j} was 0
        loss = weighted_mean_scalar(replies, "train_loss")
        if loss is not None:
            out["train_loss"] = loss
        return out


class FedFomoClient(Client):
    stateful = True  # keeps ctx.state between rounds (Capabilities.stateful_clients)

    def train(self, msg: Message) -> Message:
        ctx = self.ctx
        model = own_model(ctx)
        own = state_of(model)  # theta_i^{t-1}
        train_part, val = split_validation(ctx.data, self.params.val_fraction, int(msg.scalars["val_seed"]))
        peers = peer_states(msg, own)
        ids = sorted(peers)
        raw = w = torch.zeros(0, dtype=torch.float64, device="cpu")  # host numbers (fomo_weights)
        if ids:
            base = mean_loss(model, val)  # L_i(theta_i^{t-1})
            names = [n for n, p in model.named_parameters() if p.requires_grad]
            candidates = [{**own, **peers[j]} for j in ids]  # i's model with the shared modules j's
            losses, dists = [], []
            for cand in candidates:
                losses.append(mean_loss(load_into(model, cand), val))
                dists.append(shared_distance(own, cand, names))
            raw, w = fomo_weights(base, losses, dists)
            load_into(model, fomo_update(own, candidates, w.tolist()))  # eq. 4 (own when all w are 0)
        stats = local_train(model, train_part, ctx.train, ctx.generator(),
                            loss_fn=lambda m, x, y: personal_loss(m, x, y, self.params.probe))
        keep_own(ctx, model)
        arrays = {**state_of(model), PEERS: torch.tensor(ids, dtype=torch.int64, device=ctx.device),
                  DELTA: (affinity_update(raw) if ids else raw).to(ctx.device), WEIGHTS: w.to(ctx.device)}
        return Message(arrays=arrays, scalars={"num_examples": len(train_part), "train_loss": stats["train_loss"],
                                               "steps": stats["steps"]})


def peer_states(msg: Message, own: dict[str, Tensor]) -> dict[int, dict[str, Tensor]]:
    """``{peer id: {key: tensor}}`` from the ``peer/<cid>/<key>`` arrays (keys the client's own
    model lacks are ignored)."""
    out: dict[int, dict[str, Tensor]] = {}
    for name, v in msg.arrays.items():
        if name.startswith(PEER):
            cid, key = name[len(PEER):].split("/", 1)
            if key in own:
                out.setdefault(int(cid), {})[key] = v
    return out


register("fedfomo", FedFomoParams, FedFomoServer, FedFomoClient,
         help="FedFomo: each client combines downloaded peer models weighted by validation-loss "
              "improvement per distance (Zhang et al. 2021); personalized evaluation")
