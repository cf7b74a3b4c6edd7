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

from mmfl.algorithms.registry import register
from mmfl.algorithms.base import Client, Server
from mmfl.core.batched import BatchedClient, BatchedTask
from mmfl.core.message import Message
from mmfl.core.training import LossFn, cross_entropy_loss, load_into, local_train, model_tensors, state_of


MODULE_WEIGHT = "examples/"  # reply scalar "examples/<key prefix>": the data weight of that module


def weighted_average(states: list[dict[str, Tensor]], weights: list[float | dict[str, float]],
                     previous: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
    """Average the states key by key, each key over the states that carry it (aggregation by module).

    MOON Alg. 1, line 7 (``sum_k w_k * state_k / sum w``) when every state carries
    every key. Otherwise (clients holding only some modalities build and upload
    only those modules) each key is averaged over the states holding it, with
    weights renormalised over them; a key in no state keeps its value from
    ``previous`` (omitted from the result when ``previous`` is None).

    ``weights[k]`` is a number, or ``{key prefix: weight}`` (a module's own data
    size, e.g. ``{"encoders.image.": 120, "": 200}``): a key takes the weight of
    the longest prefix it starts with. Floating tensors are averaged in float64
    and cast back; integer tensors (BatchNorm's ``num_batches_tracked``) take
    the maximum.
    """
    per_key: dict[str, list[tuple[Tensor, float]]] = {}
    for state, w in zip(states, weights):
        for key, t in state.items():
            per_key.setdefault(key, []).append((t, _weight_for(key, w)))
    out = dict(previous) if previous is not None else {}
    for key, pairs in per_key.items():
        ref = pairs[0][0]
        if ref.is_floating_point():
            total = float(sum(w for _, w in pairs))
            if total <= 0:
                if previous is not None and key in previous:
                    continue  # nobody with data for this module: it keeps its value
                raise ValueError(f"weights of '{key}' must sum to a positive number")
            acc = torch.zeros_like(ref, dtype=torch.float64)
            for t, w in pairs:
                acc.add_(t.to(torch.float64), alpha=w / total)
            out[key] = acc.to(ref.dtype)
        else:
            out[key] = torch.stack([t for t, _ in pairs]).max(0).values
    return out


def _weight_for(key: str, w: float | dict[str, float]) -> float:
    if not isinstance(w, dict):
        return float(w)
    best, found = -1, 0.0
    for prefix, v in w.items():
        if key.startswith(prefix) and len(prefix) > best:
            best, found = len(prefix), float(v)
    if best < 0:
        raise ValueError(f"no weight for '{key}' (prefixes: {sorted(w)})")
    return found


def reply_weights(reply: Message) -> float | dict[str, float]:
    """The aggregation weight of a reply: ``num_examples``, refined per module by its
    ``examples/<prefix>`` scalars (e.g. the samples that hold that module's modality)."""
    n = float(reply.scalars["num_examples"])
    mods = {k[len(MODULE_WEIGHT):]: float(v) for k, v in reply.scalars.items() if k.startswith(MODULE_WEIGHT)}
    return {"": n, **mods} if mods else n


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

    def weight(self, cid: int, reply: Message) -> float | dict[str, float]:
        """Aggregation weight of a reply: its data size, per module (FedIoT overrides it)."""
        return reply_weights(reply)

    def aggregate(self, rnd: int, replies: dict[int, Message]) -> dict[str, Tensor]:
        """The new global state from the clients' models (the model entries of their
        ``arrays``; other arrays, e.g. prototypes, are the algorithm's), module by module:
        a module only some replies carry is averaged over those, one none carries keeps
        its value (see :func:`weighted_average`)."""
        cids = sorted(replies)
        own = model_tensors(self.model)
        states = [{k: v for k, v in replies[c].arrays.items() if k in own} for c in cids]
        return weighted_average(states, [self.weight(c, replies[c]) for c in cids],
                                previous=dict(self.model.state_dict()))

    def reported_scalars(self) -> tuple[str, ...]:
        """Reply scalars averaged (by data size) into the round's metrics besides ``train_loss``."""
        return ()

    def aggregate_train(self, rnd: int, replies: dict[int, Message]) -> dict[str, float]:
        self.model.load_state_dict(self.aggregate(rnd, replies))
        out = {}
        for key in ("train_loss", *self.reported_scalars()):
            v = weighted_mean_scalar(replies, key)
            if v is not None:
                out[key] = v
        return out


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

    # --- batched training (mmfl.core.batched): the same objective for one client of a stack
    def batched_task(self, route: str, msg: Message) -> BatchedTask | None:
        return BatchedTask(start=msg.arrays) if route == "train" else None

    def batched_loss(self, forward, params, inputs, labels, extras, shared) -> Tensor:
        return F.cross_entropy(forward(params, inputs)["logits"], labels, reduction="none")

    def batched_finish(self, route: str, msg: Message, state: dict[str, Tensor], stats: dict) -> Message:
        return self.finish_train(load_into(self.ctx.model("local"), state), msg, stats)


register("fedavg", None, FedAvgServer, FedAvgClient,
         help="FedAvg: local SGD, data-size-weighted model averaging (McMahan et al. 2017)")
