"""SCAFFOLD (Karimireddy et al., 2020), option II control variates.

Server state: global model x and server control variate c (zeros at start).
Client state: its control variate c_i (zeros at first participation).
Local step (SCAFFOLD Algorithm 1, line 10):   y <- y - lr * (g_i(y) - c_i + c)
After K local steps (line 12, option II):     c_i+ = c_i - c + (x - y) / (K * lr)
                    (line 12, option I):      c_i+ = g_i(x)
Server (lines 16-17, global step size 1):     x <- x + mean_S(y - x)
                                              c <- c + |S|/N * mean_S(c_i+ - c_i)

``correction`` says where line 10's ``c - c_i`` enters the local step:

- ``"gradient"`` (default): the optimizer steps on ``g_i(y) - c_i + c``
  (added to the gradient between backward and the step). With plain SGD this
  is line 10 exactly; with momentum / weight decay the corrected gradient is
  what the optimizer sees (momentum accumulates it like the gradient).
- ``"after_step"``: the optimizer steps on ``g_i(y)``, then
  ``y <- y - lr * (c - c_i)`` (NIID-Bench's and the MOON authors' code). Equal
  to ``"gradient"`` for plain SGD without weight decay; with momentum the
  correction stays outside the momentum buffer.

Option II uses the nominal ``train.lr`` (the round's lr under a schedule).
``option2`` says what K is: ``"printed"``: the optimizer steps taken;
``"momentum"`` (default): K_eff = sum_{t=1..K} (1 - m^t) / (1 - m), how far K
SGD steps with momentum m move (in units of lr) along a constant gradient
(:func:`effective_steps`; equal to K for m = 0 and for Adam). With the
correction in the gradient and momentum 0.9, the printed K makes c_i
over-estimate the gradient by K_eff / K (up to 10x) and the variates diverge
(c_i <- c_i + (K_eff / K) (g_i - c_i) is unstable once K_eff / K > 2).

``variate_weights``: the model update (line 16) averages the clients' y weighted
by data size, as FedAvg and MOON's code do, where the paper's mean_S is uniform;
line 17's mean is weighted the same way by default (``"data"``), so that the
corrections cancel in the model average (sum_S p_i (c - c_i) = 0 under full
participation) and the fixed point minimizes sum_i p_i f_i. ``"uniform"`` keeps
line 17 as printed beside the weighted line 16 (NIID-Bench's combination): its
fixed point minimizes mean_i f_i, and on Fashion-MNIST with beta = 0.1 it
oscillates and diverges (docs/algorithms/scaffold.md).

Other choices the paper leaves open: buffers (BatchNorm statistics) are
averaged like FedAvg; control variates cover trainable parameters only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from mmfl.algorithms.registry import register
from mmfl.algorithms.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from mmfl.core.message import Message
from mmfl.core.replies import ReplySchema, specs_of
from mmfl.core.state import read, tensors, write
from mmfl.core.training import load_into
from mmfl.errors import ConfigError

C = "c/"  # message/state prefix of control variates
DC = "dc/"  # reply prefix of control-variate updates
CORRECTIONS = ("gradient", "after_step")


@dataclass
class ScaffoldParams(FedAvgParams):
    correction: Literal["gradient", "after_step"] = field(default="gradient", metadata={
        "help": "where Alg. 1 line 10's c - c_i enters: 'gradient' = the optimizer steps on g - c_i + c "
                "(exact line 10 with plain SGD); 'after_step' = step on g, then y -= lr (c - c_i) "
                "(NIID-Bench / MOON code)"})
    option2: Literal["printed", "momentum"] = field(default="momentum", metadata={
        "help": "K in option II's (x - y) / (K lr): 'printed' = the steps taken (Alg. 1 line 12); 'momentum' = "
                "sum_t (1 - m^t) / (1 - m), what K SGD steps with momentum m move per unit of a constant "
                "gradient (equal to 'printed' for m = 0 or Adam)"})
    option: Literal["II", "I"] = field(default="II", metadata={
        "help": "line 12's control variate: 'II' = c_i - c + (x - y) / (K lr) from the local update; 'I' = "
                "grad f_i(x), the local gradient at the server model (an extra pass over the client's data)"})
    variate_weights: Literal["data", "uniform"] = field(default="data", metadata={
        "help": "line 17's mean over clients: 'data' = weighted by data size like the model average (line 16 "
                "here), 'uniform' = as printed (the paper's lines 16 and 17 are both uniform)"})

    def __post_init__(self):
        super().__post_init__()
        if self.correction not in CORRECTIONS:
            raise ConfigError(f"algorithm.correction: must be one of {list(CORRECTIONS)}, got {self.correction!r}")
        if self.option2 not in ("printed", "momentum"):
            raise ConfigError(f"algorithm.option2: must be 'printed' or 'momentum', got {self.option2!r}")
        if self.option not in ("II", "I"):
            raise ConfigError(f"algorithm.option: must be 'II' or 'I', got {self.option!r}")
        if self.variate_weights not in ("uniform", "data"):
            raise ConfigError(f"algorithm.variate_weights: must be 'uniform' or 'data', got {self.variate_weights!r}")


def param_names(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def control_variate_update(c_i: dict[str, Tensor], c: dict[str, Tensor], x: dict[str, Tensor],
                           y: dict[str, Tensor], steps: float, lr: float) -> dict[str, Tensor]:
    """c_i+ = c_i - c + (x - y) / (K * lr)   (SCAFFOLD Alg. 1, line 12, option II).

    Every dict maps a parameter name to a tensor of that parameter's shape."""
    return {k: c_i[k] - c[k] + (x[k] - y[k]) / (steps * lr) for k in c_i}


def effective_steps(steps: int, momentum: float) -> float:
    """sum_{t=1..K} (1 - m^t) / (1 - m): how far K steps of SGD with momentum m (buffer starting
    at zero) move, in units of lr, along a constant gradient of norm 1 (K for m = 0)."""
    if momentum == 0:
        return float(steps)
    return (steps - momentum * (1 - momentum ** steps) / (1 - momentum)) / (1 - momentum)


def server_variate_update(c: dict[str, Tensor], dcs: list[dict[str, Tensor]], num_clients: int,
                          weights: list[float] | None = None) -> dict[str, Tensor]:
    """c + |S|/N * mean_S(dc_i)   (SCAFFOLD Alg. 1, line 17): uniform (``weights`` None) this is
    c + sum_S(dc_i) / N; otherwise mean_S is weighted by ``weights`` (data sizes)."""
    n_s = len(dcs)
    w = [1.0 / n_s] * n_s if weights is None else [float(x) / float(sum(weights)) for x in weights]
    return {k: c[k] + n_s / num_clients * sum(wi * dc[k] for wi, dc in zip(w, dcs)) for k in c}


class ScaffoldServer(FedAvgServer):
    state_fields = {"c": tensors()}  # the server control variate c (per trainable parameter)
    dp_capable = False  # the control-variate updates are averaged without clipping or noise ([dp] refused)
    # Alg. 1 lines 10 and 12 are SGD steps of size lr (option II divides by K lr): SGD at the MOON
    # paper's lr where [train] leaves optimizer / lr out (the run-wide default is Adam, lr 1e-3)
    train_defaults = {"optimizer": "sgd", "lr": 0.01}

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.c = {n: torch.zeros_like(p) for n, p in self.model.named_parameters() if p.requires_grad}

    def extra_reply_arrays(self) -> ReplySchema:
        """A reply also carries ``dc/<name>`` = c_i^+ - c_i for every trainable parameter (line 17 reads them all)."""
        dc = specs_of({DC + k: v for k, v in self.c.items()})
        return ReplySchema(dc, required=tuple(dc))

    def configure_train(self, rnd, cohort):
        arrays = dict(self.model.state_dict())
        arrays.update({C + k: v for k, v in self.c.items()})
        msg = Message(arrays=arrays)
        return {cid: msg for cid in cohort}

    def aggregate(self, rnd, replies):
        models = {cid: Message({k: v for k, v in r.arrays.items() if not k.startswith(DC)}, r.scalars)
                  for cid, r in replies.items()}
        new = super().aggregate(rnd, models)  # line 16 (data-size weighted, see the module docstring)
        dcs = [{k: r.arrays[DC + k] for k in self.c} for r in replies.values()]
        weights = None if self.params.variate_weights == "uniform" else \
            [float(r.scalars["num_examples"]) for r in replies.values()]
        self.c = server_variate_update(self.c, dcs, self.ctx.num_clients, weights)  # line 17
        return new


class ScaffoldClient(FedAvgClient):
    stateful = True  # keeps ctx.state between rounds (Capabilities.stateful_clients)

    def _variates(self, msg: Message, names: list[str]):
        c = {k: msg.arrays[C + k] for k in names}
        own = read(self.ctx.state, C)
        c_i = {k: own[k] if k in own else torch.zeros_like(c[k]) for k in names}
        return c, c_i

    def _shift(self, msg: Message) -> dict[str, Tensor]:
        """c - c_i per trainable parameter: what line 10 adds to the gradient g_i(y)."""
        names = [k[len(C):] for k in msg.arrays if k.startswith(C)]
        c, c_i = self._variates(msg, names)
        return {k: c[k] - c_i[k] for k in names}

    # --- the hooks of TrainingClient (sequential path)
    def load_model(self, msg: Message):
        return super().load_model(_model_part(msg))

    def loss_fn(self, msg):
        return super().loss_fn(_model_part(msg) if isinstance(msg, Message) else msg)

    def begin(self, model, msg: Message) -> None:
        self._shift_now = self._shift(msg)
        self._params = dict(model.named_parameters())

    @torch.no_grad()
    def before_step(self) -> None:
        if self.params.correction == "gradient":  # optimizer steps on g - c_i + c (Alg. 1, line 10)
            grads = {k: self._params[k].grad for k in self._shift_now}
            for k, g in corrected_gradients(grads, self._shift_now).items():
                self._params[k].grad = g

    @torch.no_grad()
    def after_step(self) -> None:
        if self.params.correction == "after_step":  # y <- y - lr (c - c_i) after the optimizer's step on g
            lr = self.ctx.train.lr
            for k, s in self._shift_now.items():
                self._params[k].sub_(s, alpha=lr)

    def finish(self, model, msg: Message, stats: dict) -> Message:
        return self._update_variates(msg, super().finish(model, _model_part(msg), stats))

    def _update_variates(self, msg: Message, reply: Message) -> Message:
        """c_i+ into the client's state and dc_i = c_i+ - c_i into the reply (Alg. 1, lines 12-13)."""
        names = [k[len(C):] for k in msg.arrays if k.startswith(C)]
        c, c_i = self._variates(msg, names)
        steps = int(reply.scalars["steps"])
        if steps == 0:
            new_c_i = c_i
        elif self.params.option == "I":  # c_i+ = g_i(x), Alg. 1 line 12, option I
            new_c_i = self._gradient_at(_model_part(msg).arrays, names)
        else:
            train = self.ctx.train
            k = steps if self.params.option2 == "printed" or train.optimizer != "sgd" else \
                effective_steps(steps, train.momentum)
            new_c_i = control_variate_update(c_i, c, msg.arrays, reply.arrays, k, train.lr)
        write(self.ctx.state, C, new_c_i)
        reply.arrays.update({DC + k: new_c_i[k] - c_i[k] for k in names})
        return reply

    def _gradient_at(self, arrays: dict[str, Tensor], names: list[str]) -> dict[str, Tensor]:
        """grad f_i(x): the gradient of the local objective at ``arrays`` over all of the client's
        data (mini-batches of ``train.batch_size`` in order, weighted by their size)."""
        model = load_into(self.ctx.model("anchor"), arrays).train()
        params = dict(model.named_parameters())
        loss_fn = self.loss_fn(Message(arrays))
        model.zero_grad(set_to_none=True)
        n = len(self.ctx.data)  # a batch of one is skipped where local_train skips it (BatchNorm)
        batches = [b for b in self.ctx.data.batches(self.ctx.train.batch_size, shuffle=False)
                   if b[1].shape[0] >= 2 or n < 2]
        used = sum(labels.shape[0] for _, labels in batches)
        for inputs, labels in batches:
            (loss_fn(model, inputs, labels) * (labels.shape[0] / used)).backward()
        return {k: params[k].grad.detach().clone() if params[k].grad is not None else torch.zeros_like(params[k])
                for k in names}

    # --- batched training: c - c_i is a per-client extra
    def batched_task(self, route, msg):
        task = super().batched_task(route, _model_part(msg))
        if task is not None:  # after_step: the step's lr * (c - c_i), so the hook needs no ctx
            shift = self._shift(msg)
            lr = self.ctx.train.lr
            task.extras = {"shift": shift if self.params.correction == "gradient"
                           else {k: lr * s for k, s in shift.items()}}
        return task

    def batched_grad_hook(self, grads, extras):
        if self.params.correction != "gradient":
            return grads
        return {**grads, **corrected_gradients(grads, extras["shift"])}  # g - c_i + c (Alg. 1, line 10)

    def batched_step_hook(self, params, extras):
        if self.params.correction == "after_step":
            for k, s in extras["shift"].items():  # y <- y - lr (c - c_i), after the step
                params[k].sub_(s)


def corrected_gradients(grads: dict[str, Tensor | None], shift: dict[str, Tensor]) -> dict[str, Tensor]:
    """g - c_i + c (SCAFFOLD Alg. 1, line 10) for every name of ``shift`` (= c - c_i): a missing
    gradient (None or absent) counts as 0. Shapes: one client's parameter shapes, or the same
    stacked ``[K, ...]`` (the batched path). Used by both paths."""
    return {k: s.clone() if grads.get(k) is None else grads[k] + s for k, s in shift.items()}


def _model_part(msg: Message) -> Message:
    return Message({k: v for k, v in msg.arrays.items() if not k.startswith(C)}, msg.scalars)


register("scaffold", ScaffoldParams, ScaffoldServer, ScaffoldClient,
         help="SCAFFOLD: control variates correct client drift (Karimireddy et al. 2020)")
