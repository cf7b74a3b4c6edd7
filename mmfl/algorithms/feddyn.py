"""FedDyn (Acar et al., ICLR 2021, "Federated learning based on dynamic regularization",
Algorithm 1). Client k keeps g_k = grad L_k(theta_k^{t-1}) (0 before its first round) and,
given the server model theta^{t-1}, solves by the local SGD of ``[train]``

    theta_k^t = argmin  L_k(theta) - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2   (line 6)
    g_k      <- g_k - alpha (theta_k^t - theta^{t-1})                                 (line 7)

The server, over the round's replies P_t out of m clients:

    h^t     = h^{t-1} - alpha/m sum_{k in P_t} (theta_k^t - theta^{t-1})              (line 9)
    theta^t = mean_{k in P_t} theta_k^t - h^t / alpha                                 (line 10)

"mean" is the named rule (the paper's uniform mean by default). The terms cover the trainable
parameters; buffers take the rule's aggregate. g_k (client) and h (server) are declared state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from mmfl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from mmfl.algorithms.registry import register
from mmfl.core.batched import BatchedTask
from mmfl.core.message import Message
from mmfl.core.state import read, tensors, write
from mmfl.errors import ConfigError

GRAD = "feddyn/grad"  # client state: g_k, per trainable parameter


@dataclass
class FedDynParams(FedAvgParams):
    alpha: float = field(default=0.01, metadata={
        "help": "alpha > 0: weight of the dynamic regularizer (the paper sweeps {0.1, 0.01, 0.001})"})
    aggregation: str = field(default="mean", kw_only=True, metadata={
        "help": "the rule of line 10's mean (`mmfl list aggregation`): mean = the paper's uniform mean"})

    def __post_init__(self):
        super().__post_init__()
        if not self.alpha > 0:
            raise ConfigError(f"algorithm.alpha: must be > 0, got {self.alpha}")


def dyn_penalty(params: dict[str, Tensor], anchor: dict[str, Tensor], grad: dict[str, Tensor],
                alpha: float) -> Tensor:
    """Line 6's regularizer ``-<g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2``, summed over the
    names of ``params`` (any shapes; ``anchor`` = theta^{t-1}, ``grad`` = g_k, absent = 0)."""
    out = sum(alpha / 2 * ((p - anchor[n].detach()) ** 2).sum() for n, p in params.items())
    return out - sum((grad[n].detach() * p).sum() for n, p in params.items() if n in grad)


def server_step(mean: dict[str, Tensor], prev: dict[str, Tensor], replies: list[dict[str, Tensor]],
                h: dict[str, Tensor], alpha: float, m: int, names) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Lines 9-10 for the parameters ``names``: ``(theta^t, h^t)`` from the rule's ``mean``, the
    previous model ``prev``, the replies' states and ``h^{t-1}`` (absent = 0)."""
    out, new_h = dict(mean), {}
    for n in names:
        drift = sum(r[n] - prev[n] for r in replies if n in r)
        new_h[n] = h.get(n, torch.zeros_like(prev[n])) - alpha / m * drift
        out[n] = mean[n] - new_h[n] / alpha
    return out, new_h


class FedDynServer(FedAvgServer):
    state_fields = {"h": tensors()}  # h^{t-1} ({} before round 1)
    dp_capable = False  # server_step reads the replies' models outside aggregate() ([dp] refused)

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.h: dict[str, Tensor] = {}

    def aggregate(self, rnd: int, replies: dict[int, Message]) -> dict[str, Tensor]:
        prev = dict(self.model.state_dict())
        names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        out, self.h = server_step(super().aggregate(rnd, replies), prev, [replies[c].arrays for c in sorted(replies)],
                                  self.h, self.params.alpha, self.ctx.num_clients, names)
        return out


class FedDynClient(FedAvgClient):
    stateful = True  # keeps ctx.state between rounds (Capabilities.stateful_clients)

    def penalty(self, params, anchor):
        return dyn_penalty(params, anchor, read(self.ctx.state, GRAD), self.params.alpha)

    def after_train(self, model, msg, stats):  # line 7
        g = read(self.ctx.state, GRAD)
        write(self.ctx.state, GRAD, {n: g.get(n, 0) - self.params.alpha * (p.detach() - msg.arrays[n])
                                     for n, p in model.named_parameters() if p.requires_grad})

    # the batched path: g_k differs per client, so it rides in the task's extras
    def batched_task(self, route: str, msg: Message) -> BatchedTask | None:
        task = super().batched_task(route, msg)
        if task is not None:
            g = read(self.ctx.state, GRAD)
            task.extras["grad"] = {n: g.get(n, torch.zeros_like(a)) for n, a in task.shared["anchor"].items()}
        return task

    def batched_penalty(self, params, extras, shared):
        anchor = shared["anchor"]
        return dyn_penalty({n: params[n] for n in anchor}, anchor, extras["grad"], self.params.alpha)


register("feddyn", FedDynParams, FedDynServer, FedDynClient,
         help="FedDyn: dynamic regularization -<g_k, w> + alpha/2 ||w - w^t||^2, server state h (Acar et al. 2021)")
