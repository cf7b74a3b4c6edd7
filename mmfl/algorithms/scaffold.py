"""SCAFFOLD (Karimireddy et al., 2020), option II control variates.

Server state: global model x and server control variate c (zeros at start).
Client state: its control variate c_i (zeros at first participation).
Local step (SCAFFOLD Algorithm 1, line 10):   y <- y - lr * (g_i(y) - c_i + c)
  implemented as the optimizer's step on g_i(y) followed by y <- y - lr * (c - c_i),
  as the MOON authors' code does: with plain SGD this is line 10 exactly; with
  momentum the correction stays outside the momentum buffer (adding it to the
  gradient instead amplifies it by 1/(1 - momentum) and diverges at 0.9).
After K local steps (line 12, option II):     c_i+ = c_i - c + (x - y) / (K * lr)
Server (lines 16-17, global step size 1):     x <- x + mean_S(y - x)
                                              c <- c + |S|/N * mean_S(c_i+ - c_i)

Choices the paper leaves open: the model update averages the clients' y
weighted by data size (as FedAvg and MOON's code do) rather than uniformly;
buffers (BatchNorm statistics) are averaged like FedAvg; control variates
cover trainable parameters only.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from mmfl.algorithms import register
from mmfl.algorithms.fedavg import FedAvgClient, FedAvgServer
from mmfl.engine.message import Message

C = "c/"  # message/state prefix of control variates
DC = "dc/"  # reply prefix of control-variate updates


def param_names(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def control_variate_update(c_i: dict[str, Tensor], c: dict[str, Tensor], x: dict[str, Tensor],
                           y: dict[str, Tensor], steps: int, lr: float) -> dict[str, Tensor]:
    """c_i+ = c_i - c + (x - y) / (K * lr)   (SCAFFOLD Alg. 1, line 12, option II)."""
    return {k: c_i[k] - c[k] + (x[k] - y[k]) / (steps * lr) for k in c_i}


class ScaffoldServer(FedAvgServer):
    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.c = {n: torch.zeros_like(p) for n, p in self.model.named_parameters() if p.requires_grad}

    def configure_train(self, rnd, cohort):
        arrays = dict(self.model.state_dict())
        arrays.update({C + k: v for k, v in self.c.items()})
        msg = Message(arrays=arrays)
        return {cid: msg for cid in cohort}

    def aggregate(self, rnd, replies):
        models = {cid: Message({k: v for k, v in r.arrays.items() if not k.startswith(DC)}, r.scalars)
                  for cid, r in replies.items()}
        new = super().aggregate(rnd, models)
        # c <- c + |S|/N * (1/|S|) sum dc_i = c + sum dc_i / N   (Alg. 1, line 17)
        n = self.ctx.num_clients
        for k in self.c:
            self.c[k] = self.c[k] + sum(r.arrays[DC + k] for r in replies.values()) / n
        return new

    def state_dict(self):
        sd = super().state_dict()
        sd.update({C + k: v for k, v in self.c.items()})
        return sd

    def load_state_dict(self, sd):
        super().load_state_dict(sd)
        self.c = {k[len(C):]: v.clone() for k, v in sd.items() if k.startswith(C)}


class ScaffoldClient(FedAvgClient):
    def _variates(self, msg: Message, names: list[str]):
        c = {k: msg.arrays[C + k] for k in names}
        c_i = {k: self.ctx.state.get(C + k, torch.zeros_like(c[k])) for k in names}
        return c, c_i

    def step_hook(self, model, msg: Message) -> Callable[[], None]:
        names = param_names(model)
        c, c_i = self._variates(self._full, names)
        lr = self.ctx.train.lr
        correction = {k: lr * (c[k] - c_i[k]) for k in names}  # the -lr (c - c_i) of Alg. 1, line 10
        params = dict(model.named_parameters())

        @torch.no_grad()
        def hook():
            for k in names:
                params[k].sub_(correction[k])

        return hook

    def train(self, msg: Message) -> Message:
        self._full = msg  # the model part goes to FedAvg's loop, the variates to step_hook
        return self._update_variates(msg, super().train(_model_part(msg)))

    def _update_variates(self, msg: Message, reply: Message) -> Message:
        """c_i+ into the client's state and dc_i = c_i+ - c_i into the reply (Alg. 1, lines 12-13)."""
        names = [k[len(C):] for k in msg.arrays if k.startswith(C)]
        c, c_i = self._variates(msg, names)
        steps = int(reply.scalars["steps"])
        if steps == 0:
            new_c_i = c_i
        else:
            new_c_i = control_variate_update(c_i, c, msg.arrays, reply.arrays, steps, self.ctx.train.lr)
        self.ctx.state.update({C + k: v for k, v in new_c_i.items()})
        reply.arrays.update({DC + k: new_c_i[k] - c_i[k] for k in names})
        return reply

    # --- batched training: the correction lr * (c - c_i) is a per-client extra
    def batched_task(self, route, msg):
        task = super().batched_task(route, _model_part(msg))
        if task is not None:
            names = [k[len(C):] for k in msg.arrays if k.startswith(C)]
            c, c_i = self._variates(msg, names)
            lr = self.ctx.train.lr
            task.extras = {"correction": {k: lr * (c[k] - c_i[k]) for k in names}}
        return task

    def batched_step_hook(self, params, extras):
        for k, corr in extras["correction"].items():  # y <- y - lr (c - c_i), after the step (Alg. 1, line 10)
            params[k].sub_(corr)

    def batched_finish(self, route, msg, state, stats):
        return self._update_variates(msg, super().batched_finish(route, _model_part(msg), state, stats))


def _model_part(msg: Message) -> Message:
    return Message({k: v for k, v in msg.arrays.items() if not k.startswith(C)}, msg.scalars)


register("scaffold", None, ScaffoldServer, ScaffoldClient,
         help="SCAFFOLD: control variates correct client drift (Karimireddy et al. 2020)")
