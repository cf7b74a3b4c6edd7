"""FedAvg (McMahan et al., 2017) as in MOON's Algorithm 1, lines 4-7.

Each sampled client starts from the global model w^t, runs E epochs of SGD on
its data and returns w_k^t; the server sets

    w^{t+1} = sum_k |D^k| / |D| * w_k^t        (Algorithm 1, line 7)

over the clients that replied (|D| = their total size). Subclasses change the
local loss (:meth:`FedAvgClient.loss_fn`) or the aggregate (:meth:`FedAvgServer.aggregate`).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from mmfl.algorithms import register
from mmfl.algorithms.base import Client, Server
from mmfl.engine.batched import BatchedClient, BatchedTask
from mmfl.engine.message import Message
from mmfl.engine.training import LossFn, cross_entropy_loss, load_into, local_train, state_of


def weighted_average(states: list[dict[str, Tensor]], weights: list[float]) -> dict[str, Tensor]:
    """sum_k weights[k] * states[k] / sum(weights), key by key (MOON Alg. 1, line 7).

    states: K dicts of same-shaped tensors. Floating tensors are averaged in
    float64 and cast back; integer tensors (BatchNorm's ``num_batches_tracked``)
    take the maximum.
    """
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights must sum to a positive number")
    out = {}
    for key, ref in states[0].items():
        if ref.is_floating_point():
            acc = torch.zeros_like(ref, dtype=torch.float64)
            for s, w in zip(states, weights):
                acc.add_(s[key].to(torch.float64), alpha=w / total)
            out[key] = acc.to(ref.dtype)
        else:
            out[key] = torch.stack([s[key] for s in states]).max(0).values
    return out


def weighted_mean_scalar(replies: dict[int, Message], key: str) -> float | None:
    pairs = [(r.scalars[key], r.scalars.get("num_examples", 1)) for r in replies.values() if key in r.scalars]
    if not pairs:
        return None
    total = sum(n for _, n in pairs)
    return float(sum(v * n for v, n in pairs) / total)


class FedAvgServer(Server):
    def configure_train(self, rnd: int, cohort: list[int]) -> dict[int, Message]:
        msg = Message(arrays=dict(self.model.state_dict()))  # one message object, counted per recipient
        return {cid: msg for cid in cohort}

    def aggregate(self, rnd: int, replies: dict[int, Message]) -> dict[str, Tensor]:
        """The new global state from the clients' models (their ``arrays``)."""
        cids = sorted(replies)
        return weighted_average([replies[c].arrays for c in cids],
                                [float(replies[c].scalars["num_examples"]) for c in cids])

    def aggregate_train(self, rnd: int, replies: dict[int, Message]) -> dict[str, float]:
        self.model.load_state_dict(self.aggregate(rnd, replies))
        loss = weighted_mean_scalar(replies, "train_loss")
        return {} if loss is None else {"train_loss": loss}


class FedAvgClient(Client, BatchedClient):
    def loss_fn(self, global_arrays: dict[str, Tensor]) -> LossFn:
        """The local objective; FedAvg: cross-entropy."""
        return cross_entropy_loss

    def step_hook(self, model, msg: Message) -> Callable[[], None] | None:
        """A function called after each optimizer step, or None (SCAFFOLD
        applies its drift correction here)."""
        return None

    def train(self, msg: Message) -> Message:
        model = load_into(self.ctx.model("local"), msg.arrays)
        hook = self.step_hook(model, msg)
        stats = local_train(model, self.ctx.data, self.ctx.train, self.ctx.generator(),
                            loss_fn=self.loss_fn(msg.arrays), after_step=hook)
        return self.finish_train(model, msg, stats)

    def finish_train(self, model, msg: Message, stats: dict) -> Message:
        """The reply after local training ended at ``model`` (sequential or batched)."""
        self.after_train(model, msg, stats)
        return Message(arrays=state_of(model),
                       scalars={"num_examples": len(self.ctx.data), "train_loss": stats["train_loss"],
                                "steps": stats["steps"]})

    def after_train(self, model, msg: Message, stats: dict) -> None:
        """Update ``self.ctx.state`` after local training (MOON keeps the model here)."""

    # --- batched training (mmfl.engine.batched): the same objective for one client of a stack
    def batched_task(self, route: str, msg: Message) -> BatchedTask | None:
        return BatchedTask(start=msg.arrays) if route == "train" else None

    def batched_loss(self, forward, params, inputs, labels, extras, shared) -> Tensor:
        return F.cross_entropy(forward(params, inputs)["logits"], labels, reduction="none")

    def batched_finish(self, route: str, msg: Message, state: dict[str, Tensor], stats: dict) -> Message:
        return self.finish_train(load_into(self.ctx.model("local"), state), msg, stats)


register("fedavg", None, FedAvgServer, FedAvgClient,
         help="FedAvg: local SGD, data-size-weighted model averaging (McMahan et al. 2017)")
