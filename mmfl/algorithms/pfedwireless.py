"""Personalized multimodal FL with learned aggregation coefficients and parameter scheduling.

Yin, Chen, Tao, "Aggregation Design for Personalized Federated Multi-Modal Learning over
Wireless Networks" (`/work/shared/papers/004_1f577a09d3a3a836.txt`), sec. II-B, III and
Algorithm 1. Registered as ``pfedwireless`` (``schedule = "linear"`` is Table III's
linear-combination variant). Needs ``model.name = "multimodal"``.

Parameter groups. Group m (one per modality: the branch modules ``encoders/proj/infil[/heads].<m>``)
and group M+1 = ``"shared"`` (``fusion`` + ``classifier``: everything that is not a branch).
A device holds the groups of its modalities and the shared one.

Server (:class:`PFedWirelessServer`) keeps, per device k, the personalized model W_k (the
modules k holds) and, per group m, the K x K matrix Xi^m (eq. 3, initialised to 1/K). The
equation functions are in :mod:`mmfl.algorithms.pfedwireless_math` (eq. 2-6) and
:mod:`mmfl.algorithms.wireless_scheduling` (Algorithm 1's scheduling):

- eq. 4:  xi~_{k,k'} = softmax_k'(xi^_{k,.})                           :func:`softmax_rows`
- eq. 5:  xi_{k,k'} = I~_{k,k'} xi~_{k,k'} / sum_k'' I~_{k,k''} xi~_{k,k''}  :func:`masked_coefficients`
- eq. 2:  W_k^m = sum_k' xi_{k,k'} w_k'^{N,m}, only for uploaders k         :func:`aggregate_row`
- eq. 6:  d F_k / d xi^_{k,k'} = (d W_k / d xi^_{k,k'})^T grad_W F_k
                               = xi_{k,k'} <w_k' - W_k, grad_W F_k>          :func:`coefficient_gradient`
          with grad_W F_k estimated from device k's next parameter change,
          W_k - w_k^{N} (eq. 1: N_k SGD steps from W_k)                     :func:`pseudo_gradient`
- eq. 7:  xi^_{k,.} <- xi^_{k,.} - eta^ * gradient                      ``PFedWirelessServer.aggregate``
- Alg. 1 lines 5-9: per group, rank the devices holding it by
          (1 - xi~_kk) / (T^ParD + T^cmp + (sum_{m'<m} I^{m'} Y^{m'} + Y^m) / R^up)
          (``schedule = "ratio"``, line 6) or
          1 - xi~_kk - alpha (the same latency) (``"linear"``, Table III), take the top K^,
          force those that waited A_th rounds           :func:`ranking_values`, :func:`select_devices`

Client (:class:`PFedWirelessClient`): its model lives in ``ctx.state["model/*"]`` (the run's
initial weights before its first round). The train message carries W_k^m for the groups
aggregated for it since it last trained (line 13: "sends W_k^m with I^m_k = 1") and which
groups to upload; the client overwrites those groups, trains (eq. 1: multimodal
cross-entropy of the joint output over the modalities it holds), keeps the whole model, and
uploads only the scheduled groups (line 10). A group it does not upload keeps its own
trained parameters (sec. II-B2: w^0_{k,t+1} = w^{N}_{k,t}).

Evaluation (the ``personalized`` kind of :mod:`mmfl.core.evaluation`): each device's model on a
test subset that follows its own label distribution. ``eval_model = "device"`` (default)
scores the model the device will start the next round from: W_k for the groups just
aggregated for it, its own trained parameters for the others (fetched on an ``evaluate``
route, counted as evaluation bytes); ``"server"`` scores the server's W_k as it is.
See docs/algorithms/pfedwireless.md for the choices the paper leaves open.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from mmfl.algorithms.registry import register
from mmfl.algorithms.base import Server
from mmfl.algorithms.fedavg import weighted_mean_scalar
from mmfl.algorithms.multimodal import MultimodalClient, require_multimodal_model
from mmfl.core.message import Message, tensor_bytes
from mmfl.core.evaluation import personalized_metrics
from mmfl.core.state import dict_of, per_client, read, scalar, tensors, write
from mmfl.core.training import load_into, model_tensors, state_of
from mmfl.errors import ConfigError, MMFLError
from mmfl.models.multimodal import branch_of
from mmfl.algorithms.pfedwireless_math import (SHARED, aggregate_row, coefficient_gradient, exchange_group, flat,
                                               masked_coefficients, pseudo_gradient, softmax_rows)
from mmfl.algorithms.wireless_scheduling import ranking_values, scheduled_count, select_devices

MODEL = "model/"  # the client's own model in ctx.state
UPLOAD = "upload/"  # train-message scalar "upload/<group>": I^m_{k,t}
SEND = "send/"  # evaluate-message scalar "send/<group>": return this group of your model


# ----------------------------------------------------------------------------- parameters


@dataclass
class PFedWirelessParams:
    eta_hat: float = field(default=0.01, metadata={
        "help": "eta^, learning rate of the aggregation coefficients (eq. 7; the paper: 0.01)"})
    k_hat: float = field(default=1 / 3, metadata={
        "help": "K^, devices scheduled per group: a fraction of the round's devices in (0, 1] "
                "(the paper: 1/3, 2/3, 1), or an integer count > 1"})
    a_th: int = field(default=10, metadata={
        "help": "A^th: a device not scheduled for this many rounds must upload (Alg. 1 line 8; "
                "the paper: 10; 0 = never force)"})
    schedule: Literal["ratio", "linear"] = field(default="ratio", metadata={
        "help": "'ratio': (1 - xi_kk) / latency (Alg. 1 line 6); 'linear': 1 - xi_kk - alpha * latency (Table III)"})
    alpha: float = field(default=1e-4, metadata={
        "help": "alpha of the linear scheduling metric, per second (Table III: 1e-4, 1e-3, 1e-2)"})
    probe: bool = field(default=False, metadata={
        "help": "also train and exchange heads[m] as linear probes on detached features (not in the paper)"})
    grad_estimate: Literal["change", "mean_gradient"] = field(default="change", metadata={
        "help": "grad_W F_k in eq. 6: 'change' = W_k - w_k^N (the paper's parameter change); "
                "'mean_gradient' = that change / (train.lr * local steps), the mean SGD gradient"})
    eval_model: Literal["device", "server"] = field(default="device", metadata={
        "help": "evaluate each device's own next model ('device') or the server's W_k ('server')"})

    def __post_init__(self):
        if not (math.isfinite(self.eta_hat) and self.eta_hat >= 0):
            raise ConfigError(f"algorithm.eta_hat: must be >= 0, got {self.eta_hat}")
        if not self.k_hat > 0 or (self.k_hat > 1 and not float(self.k_hat).is_integer()):
            raise ConfigError(f"algorithm.k_hat: must be a fraction in (0, 1] or an integer count > 1, "
                              f"got {self.k_hat}")
        if self.a_th < 0:
            raise ConfigError(f"algorithm.a_th: must be >= 0 (0 = never force an upload), got {self.a_th}")
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ConfigError(f"algorithm.alpha: must be >= 0, got {self.alpha}")


# ----------------------------------------------------------------------------- server


class PFedWirelessServer(Server):
    """One personalized model per device, a coefficient matrix per group, Alg. 1's schedule."""
    runs_on = "multimodal"

    def reply_schema(self, route: str, cid: int):
        """The default schema, except that a reply may carry no model entry: a device the
        scheduler left out this round uploads none of its groups (only its counts)."""
        schema = super().reply_schema(route, cid)
        return None if schema is None else dataclasses.replace(schema, min_arrays=0)

    # each device's model, per group: xi (eq. 3), ages, pending, and the previous round's schedule
    # (the global model is never changed: not saved)
    state_fields = {"model": None, "w": per_client(), "xi": tensors(), "age": tensors(), "pending": tensors(),
                    "prev_round": scalar(), "prev_u": tensors(), "prev_coeff": tensors(),
                    "prev_w": dict_of(per_client())}
    trains_modality_heads = True  # with algorithm.probe (off by default: the paper has no heads)
    # eq. 1 is plain SGD (and grad_estimate = "mean_gradient" divides by lr x steps): plain SGD at
    # the packaged configs' lr where [train] leaves these out (the run-wide default is Adam, lr 1e-3)
    train_defaults = {"optimizer": "sgd", "lr": 0.05, "momentum": 0.0}

    def __init__(self, params: PFedWirelessParams, ctx):
        super().__init__(params, ctx)
        require_multimodal_model(self.model, "pfedwireless")
        self.K = k = ctx.num_clients
        full = model_tensors(self.model)
        self.key_group = {key: exchange_group(key, params.probe) for key in full}
        mods = [m for m in ctx.meta.modalities if any(g == m for g in self.key_group.values())]
        self.groups: list[str] = [*mods, SHARED]  # m = 1..M, then M+1 (the order of Alg. 1 line 5)
        self.group_keys = {g: [key for key in full if self.key_group[key] == g] for g in self.groups}
        names = {n for n, _ in self.model.named_parameters()}
        self.param_keys = {g: [key for key in keys if key in names] for g, keys in self.group_keys.items()}
        self.group_bytes = {g: tensor_bytes({key: full[key] for key in keys}) for g, keys in self.group_keys.items()}
        init = state_of(self.model)
        self.w: dict[int, dict[str, Tensor]] = {
            c: {key: v for key, v in init.items() if self._holds_key(c, key)} for c in range(k)}
        dev = ctx.device
        self.xi = {g: torch.full((k, k), 1.0 / k, dtype=torch.float64, device=dev) for g in self.groups}  # eq. 3
        self.age = {g: torch.zeros(k, dtype=torch.int64, device=dev) for g in self.groups}  # A_k^m
        self.pending = {g: torch.zeros(k, dtype=torch.bool, device=dev) for g in self.groups}  # W_k^m not yet sent
        # what the coefficient update of the next round needs (Alg. 1 line 11: "retain the gradient")
        self.prev_round = -1
        self.prev_u = {g: torch.zeros(k, dtype=torch.bool, device=dev) for g in self.groups}
        self.prev_coeff = {g: torch.zeros(k, k, dtype=torch.float64, device=dev) for g in self.groups}
        self.prev_w: dict[str, dict[int, dict[str, Tensor]]] = {g: {} for g in self.groups}
        self._eval_models: dict[tuple, nn.Module] = {}

    # --- who holds what ---------------------------------------------------
    def groups_of(self, cid: int) -> list[str]:
        holds = self.ctx.modalities_of(cid)
        return [g for g in self.groups if g == SHARED or g in holds]

    def _holds_key(self, cid: int, key: str) -> bool:
        b = branch_of(key)
        return b is None or b in self.ctx.modalities_of(cid)

    # --- the round --------------------------------------------------------
    def round(self, rnd, cohort, transport):
        cohort = sorted(cohort)
        down = {c: self.download(c) for c in cohort}
        sched, forced = self.schedule(rnd, cohort, {c: tensor_bytes(a) for c, a in down.items()})
        msgs = {c: Message(arrays=down[c], scalars={UPLOAD + g: c in sched[g] for g in self.groups_of(c)})
                for c in cohort}
        replies = transport.send("train", msgs)
        for c in replies:  # W_k^m delivered (line 13 of the previous round)
            for g in self.groups:
                self.pending[g][c] = False
        metrics = self.aggregate(rnd, sched, replies)
        metrics["uploads"] = sum(len(v) for v in sched.values())
        metrics["uploads_forced"] = sum(len(v) for v in forced.values())
        metrics["clients_replied"] = len(replies)
        loss = weighted_mean_scalar(replies, "train_loss") if replies else None
        if loss is not None:
            metrics["train_loss"] = loss
        return metrics

    def download(self, cid: int) -> dict[str, Tensor]:
        """W_k^m of the groups aggregated for device ``cid`` since it last trained."""
        return {key: self.w[cid][key] for g in self.groups_of(cid) if bool(self.pending[g][cid])
                for key in self.group_keys[g]}

    def latency_base(self, rnd: int, cid: int, down_bytes: int) -> float:
        """T^ParD_{k,t} (eq. 8) + T^cmp_{k,t} (eq. 9) from ``ctx.system`` (0 without it)."""
        s = self.ctx.system
        return 0.0 if s is None else s.download_latency(rnd, cid, down_bytes) + s.compute_latency(cid)

    def schedule(self, rnd: int, cohort: list[int], down_bytes: dict[int, int]):
        """Alg. 1 lines 5-9: ``({group: scheduled ids}, {group: forced ids})``; updates A_k^m.

        Latency of device k for group m: T^ParD + T^cmp + (bytes of the groups already
        scheduled for k this round + Y^m) / R^up_{k,t}, from ``ctx.system`` and this round's
        channel. Without ``[system]`` every latency is 1 (the ranking is by 1 - xi~_kk alone)."""
        s = self.ctx.system
        base = {c: self.latency_base(rnd, c, down_bytes[c]) for c in cohort} if s is not None else {}
        sent = {c: 0 for c in cohort}
        count = scheduled_count(self.params.k_hat, len(cohort))
        sched, forced = {}, {}
        for g in self.groups:
            elig = [c for c in cohort if g in self.groups_of(c)]
            soft = softmax_rows(self.xi[g])
            one_minus = np.array([1.0 - float(soft[c, c]) for c in elig])
            if s is not None:
                lat = np.array([base[c] + s.upload_latency(rnd, c, sent[c] + self.group_bytes[g]) for c in elig])
            else:
                lat = np.ones(len(elig))
            values = ranking_values(one_minus, lat, self.params.schedule, self.params.alpha)
            sched[g], forced[g], self.age[g] = select_devices(values, elig, count, self.age[g], self.params.a_th)
            for c in sched[g]:
                sent[c] += self.group_bytes[g]
        return sched, forced

    def aggregate(self, rnd: int, sched: dict[str, list[int]], replies: dict[int, Message]) -> dict:
        """Eq. 6-7 (rows with a retained gradient), then eq. 2 with eq. 4-5's coefficients."""
        out: dict = {}
        updated = 0
        for g in self.groups:
            ups = [c for c in sched[g] if c in replies]
            u = torch.zeros(self.K, dtype=torch.bool, device=self.xi[g].device)
            u[ups] = True
            uploads = {c: {key: replies[c].arrays[key] for key in self.group_keys[g]} for c in ups}
            for c in ups:
                missing = [key for key in self.group_keys[g] if key not in replies[c].arrays]
                if missing:
                    raise MMFLError(f"pfedwireless: client {c} was scheduled to upload '{g}' but sent no {missing[0]}")
            grads = self._coefficient_gradients(rnd, g, ups, uploads, replies)  # before W_k changes
            coeff = masked_coefficients(self.xi[g], u)  # eq. 4-5 with Xi_t
            for c in ups:  # eq. 2; the others keep W_{k,t-1}
                self.w[c].update(aggregate_row(coeff[c], uploads))
                self.pending[g][c] = True
            for c, grad in grads.items():  # eq. 7: Xi_{t+1} = Xi_t - eta^ grad
                self.xi[g][c] -= self.params.eta_hat * grad
            updated += len(grads)
            self.prev_u[g] = u
            self.prev_coeff[g] = coeff
            self.prev_w[g] = {c: {key: uploads[c][key] for key in self.param_keys[g]} for c in ups}
            holders = [c for c in range(self.K) if g in self.groups_of(c)]
            soft = softmax_rows(self.xi[g])
            out[f"xi_self/{g}"] = float(np.mean([float(soft[c, c]) for c in holders])) if holders else 0.0
        self.prev_round = rnd
        out["xi_rows_updated"] = updated
        return out

    def _coefficient_gradients(self, rnd: int, g: str, ups: list[int], uploads: dict[int, dict[str, Tensor]],
                               replies: dict[int, Message]) -> dict[int, Tensor]:
        """Eq. 6 for each device k that uploads group ``g`` now and whose W_k^g was aggregated
        in the previous round (so it started this round from it): grad_W F_k ~ W_k - w_k^N
        (divided by lr * steps with ``grad_estimate = "mean_gradient"``)."""
        if self.prev_round != rnd - 1:
            return {}
        keys = self.param_keys[g]
        rows = [c for c in ups if bool(self.prev_u[g][c])]
        if not rows or not keys:
            return {}
        prev = {c: flat(w, keys) for c, w in self.prev_w[g].items()}
        out = {}
        for c in rows:
            w_agg = flat(self.w[c], keys)  # W_{k,t-1}
            grad_w = pseudo_gradient(w_agg, flat(uploads[c], keys))
            if self.params.grad_estimate == "mean_gradient":
                steps = int(replies[c].scalars.get("steps", 0))
                lr = self.ctx.train_at(rnd - 1).lr  # the lr the clients trained with last round
                if steps > 0 and lr > 0:
                    grad_w = grad_w / (lr * steps)
            out[c] = coefficient_gradient(self.prev_coeff[g][c], prev, w_agg, grad_w)
        return out

    # --- evaluation -------------------------------------------------------
    evaluations = {"personalized": ""}  # each device's model on its own test rows (mmfl.core.evaluation)

    def evaluate_personalized(self, ctx):
        device = self.params.eval_model == "device"
        # the groups whose freshest values are the device's own (not aggregated for it since it trained)
        fresh = {c: {g for g in self.groups_of(c) if not bool(self.pending[g][c])} if device else set()
                 for c in range(self.K)}
        if ctx.personal_rows is None:  # the devices score themselves: W_k sent, over their own model
            return personalized_metrics(
                ctx, None, lambda c: {k: v for k, v in self.w[c].items() if self.key_group[k] not in fresh[c]},
                over_own=device)
        own: dict[int, Message] = {}
        if device:
            msgs = {c: Message(scalars={SEND + g: True for g in self.groups_of(c) if g in fresh[c]})
                    for c in range(self.K) if fresh[c]}
            own = ctx.send("evaluate", msgs) if msgs else {}

        def model_of(cid: int) -> nn.Module:
            arrays = dict(self.w[cid])
            if cid in own:
                arrays.update({k: v for k, v in own[cid].arrays.items() if k in arrays})
            return load_into(self._eval_model(cid), arrays)

        return personalized_metrics(ctx, model_of, None)

    def _eval_model(self, cid: int) -> nn.Module:
        holds = tuple(self.ctx.modalities_of(cid))
        if holds not in self._eval_models:
            m = copy.deepcopy(self.model)
            if hasattr(m, "keep_only"):
                m.keep_only(holds)
            self._eval_models[holds] = m
        return self._eval_models[holds]


# ----------------------------------------------------------------------------- client


class PFedWirelessClient(MultimodalClient):
    """Local training of the device's own model (kept in ``ctx.state``); uploads only the
    scheduled groups."""
    stateful = True  # keeps ctx.state between rounds (Capabilities.stateful_clients)

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.probe = bool(getattr(params, "probe", False))

    def load_model(self, msg: Message) -> nn.Module:
        """The device's model (its last trained one, or the run's initial weights), with the
        groups the server sent replaced (w^0_{k,t+1} = W_{k,t}^m where I^m_{k,t} = 1)."""
        model = self.ctx.model("local")
        own = model_tensors(model)
        saved = read(self.ctx.state, MODEL)
        base = saved if saved else state_of(self.ctx.init_model())
        arrays = {k: base[k] for k in own}
        arrays.update({k: v for k, v in msg.arrays.items() if k in own})
        return load_into(model, arrays)

    def finish(self, model: nn.Module, msg: Message, stats: dict) -> Message:
        state = state_of(model)
        write(self.ctx.state, MODEL, state)
        up = {k[len(UPLOAD):] for k, v in msg.scalars.items() if k.startswith(UPLOAD) and v}
        arrays = {k: v for k, v in state.items() if exchange_group(k, self.probe) in up}
        return Message(arrays=arrays, scalars={"num_examples": len(self.ctx.data), "train_loss": stats["train_loss"],
                                               "steps": stats["steps"]})

    def evaluate(self, msg: Message) -> Message:
        """The groups of the device's current model the server asks for (``send/<group>``)."""
        want = {k[len(SEND):] for k, v in msg.scalars.items() if k.startswith(SEND) and v}
        saved = read(self.ctx.state, MODEL)
        state = saved if saved else state_of(self.ctx.init_model())
        return Message(arrays={k: v for k, v in state.items() if exchange_group(k, self.probe) in want})


register("pfedwireless", PFedWirelessParams, PFedWirelessServer, PFedWirelessClient,
         help="personalized multimodal FL: learned per-modality aggregation coefficients and "
              "coefficient/latency-aware parameter scheduling (Yin, Chen, Tao)")
