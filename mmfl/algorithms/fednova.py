"""FedNova (Wang, Liu, Liang, Joshi & Poor 2020, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS): FedAvg's clients, a server that normalizes each
client's update by how far its local solver moved. Client i ran tau_i local SGD steps from x and
returned y_i; with p_i = n_i / sum_j n_j over the clients that replied:

    d_i     = (x - y_i) / a_i                        (the normalized update)
    tau_eff = sum_i p_i a_i
    x_new   = x - tau_eff * sum_i p_i d_i            (FedNova's server update)

where a_i = ||a_i||_1 of the paper's vector for the local solver: tau_i for plain SGD, and for
SGD with momentum rho (torch's, dampening 0)

    a_i = sum_{k=1..tau_i} (1 - rho^k) / (1 - rho) = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)

(the paper's momentum case; its code's ``local_normalizing_vec``). All clients taking the same
steps gives x_new = sum_i p_i y_i: FedAvg. Implemented in FedAvg's two hooks, so the list and
the streamed path (and batched clients) are FedAvg's: each reply's aggregation weight is
n_i / a_i (the weighted mean is then sum_i p_i y_i / a_i normalized), and ``server_step`` scales
the step from x by tau_eff * sum_i p_i / a_i, which gives the update above. The clients report
tau_i already (reply scalar ``steps``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mmfl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer, reply_weights
from mmfl.algorithms.registry import register
from mmfl.core.message import Message
from mmfl.errors import ConfigError


@dataclass
class FedNovaParams(FedAvgParams):
    def __post_init__(self):
        super().__post_init__()
        if self.aggregation != "weighted_mean":  # the normalization is carried by the weights n_i / a_i
            raise ConfigError(f"algorithm.aggregation: fednova averages with 'weighted_mean' (its weights are "
                              f"n_i / a_i), got {self.aggregation!r}")


def normalizer(steps: int | float, momentum: float = 0.0) -> float:
    """a_i = ||a_i||_1 for ``steps`` local SGD steps with momentum ``momentum`` (tau_i for 0)."""
    tau = max(float(steps), 1.0)  # a client that took no step moved nowhere: any a_i > 0 gives d_i = 0
    if momentum == 0:
        return tau
    rho = momentum
    return (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho)


def nova_step(x: dict[str, Tensor], ys: list[dict[str, Tensor]], n: list[float], a: list[float]) -> dict[str, Tensor]:
    """FedNova's server update written as in the paper, from the clients' models ``ys`` (for the
    tests: the engine gets the same from the weighted mean and :meth:`FedNovaServer.server_step`)."""
    total = sum(n)
    p = [ni / total for ni in n]
    tau_eff = sum(pi * ai for pi, ai in zip(p, a))
    out = {}
    for k, xk in x.items():
        if not torch.is_floating_point(xk):
            out[k] = ys[0][k]
            continue
        d = sum(pi * (xk - y[k]) / ai for pi, y, ai in zip(p, ys, a))  # sum_i p_i d_i
        out[k] = xk - tau_eff * d
    return out


class FedNovaServer(FedAvgServer):
    # central DP's clipped mean and SecAgg+'s sum do not carry the per-client weights n_i / a_i
    dp_capable = False
    train_defaults = {"optimizer": "sgd", "lr": 0.01}  # a_i is defined for (momentum) SGD steps

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.round_weights: dict[int, tuple[float, float]] = {}  # cid -> (n_i, a_i) of this round's replies

    def configure_train(self, rnd: int, cohort: list[int]) -> dict[int, Message]:
        self.round_weights = {}
        return super().configure_train(rnd, cohort)

    def momentum(self) -> float:
        """rho of the clients' solver: train.momentum under SGD; Adam has no a_i in the paper, and its
        steps count as plain SGD's (a_i = tau_i, as SCAFFOLD's K for Adam)."""
        train = self.ctx.train
        return float(train.momentum) if train.optimizer == "sgd" else 0.0

    def weight(self, cid: int, reply: Message) -> float | dict[str, float]:
        """n_i / a_i (each module's weight divided by a_i); notes (n_i, a_i) for :meth:`server_step`."""
        w = reply_weights(reply)
        a = normalizer(reply.scalars.get("steps", 1), self.momentum())
        self.round_weights[cid] = (float(reply.scalars["num_examples"]), a)
        return {k: v / a for k, v in w.items()} if isinstance(w, dict) else w / a

    def server_step(self, rnd: int, previous: dict[str, Tensor], averaged: dict[str, Tensor]) -> dict[str, Tensor]:
        if not self.round_weights:
            return averaged
        n = sum(ni for ni, _ in self.round_weights.values())
        tau_eff = sum(ni * ai for ni, ai in self.round_weights.values()) / n     # sum_i p_i a_i
        scale = tau_eff * sum(ni / ai for ni, ai in self.round_weights.values()) / n  # tau_eff sum_i p_i / a_i
        self.round_weights = {}
        return {k: previous[k] + scale * (a - previous[k]) if torch.is_floating_point(a) else a
                for k, a in averaged.items()}


register("fednova", FedNovaParams, FedNovaServer, FedAvgClient,
         help="FedNova: FedAvg clients, updates normalized by each client's local steps (Wang et al. 2020)")
