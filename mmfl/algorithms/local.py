"""SOLO / local-only training: each client trains a model on its own data and
never communicates (MOON's SOLO baseline).

A client's model lives in its engine-held state; its first participation
starts from the run's initial weights (the same for every client). Every
evaluation sends each client an ``evaluate`` message; the client scores its
own model on its evaluation set (the shared test set, as MOON does) and the
server reports the mean and standard deviation over clients, as MOON's
Table 1 does for SOLO. Only those small evaluation messages cross the network.
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F

from mmfl.algorithms.registry import register
from mmfl.algorithms.base import Client, Server
from mmfl.algorithms.fedavg import weighted_mean_scalar
from mmfl.core.batched import BatchedClient, BatchedTask
from mmfl.core.evaluation import personalized_metrics
from mmfl.core.patterns import PATTERN
from mmfl.core.message import Message
from mmfl.core.replies import ReplySchema
from mmfl.core.state import read, write
from mmfl.core.training import evaluate_model, load_into, local_train, state_of

MODEL = "model/"


class LocalServer(Server):
    def reply_schema(self, route, cid):
        """A ``train`` reply carries no model entry, only ``num_examples`` and its loss."""
        return ReplySchema() if route == "train" else None

    def configure_train(self, rnd, cohort):
        return {cid: Message() for cid in cohort}

    def aggregate_train(self, rnd, replies):
        return {"train_loss": weighted_mean_scalar(replies, "train_loss")}

    # each client's own model on its evaluation set, through messages (its mean and std)
    evaluations = {"clients": ""}

    def evaluate_clients(self, ctx):
        replies = ctx.send("evaluate", {cid: Message() for cid in range(ctx.num_clients)})
        acc = np.array([replies[c].scalars["accuracy"] for c in sorted(replies)])
        loss = np.array([replies[c].scalars["test_loss"] for c in sorted(replies)])
        out = {"accuracy": float(acc.mean()), "accuracy_std": float(acc.std()),
               "test_loss": float(loss.mean()), "client_accuracy": [float(a) for a in acc]}
        # accuracy by missingness pattern (mmfl.core.patterns): the mean over the clients' models,
        # all scored on the same shared test rows (so each pattern's row count is the same for all)
        keys = sorted({k for r in replies.values() for k in r.scalars if k.startswith(PATTERN)})
        for k in keys:
            vals = [replies[c].scalars[k] for c in sorted(replies) if k in replies[c].scalars]
            out[k] = int(vals[0]) if k.endswith("/n") else float(np.mean(vals))
        return out

    def evaluate_personalized(self, ctx):
        """Each client's own model (only the clients hold it) on its own test rows."""
        return personalized_metrics(ctx, None, lambda cid: None)


class LocalClient(Client, BatchedClient):
    """Trains its own model (``ctx.state``) on its own data; batched (``batch_clients``): each
    client's own model is one row of the stack."""
    stateful = True  # keeps ctx.state between rounds (Capabilities.stateful_clients)

    def _model(self):
        model = self.ctx.model("local")
        own = read(self.ctx.state, MODEL)
        return load_into(model, own if own else self.ctx.init_model().state_dict())

    def train(self, msg: Message) -> Message:
        model = self._model()
        stats = local_train(model, self.ctx.data, self.ctx.train, self.ctx.generator())
        write(self.ctx.state, MODEL, state_of(model))
        return Message(scalars={"num_examples": len(self.ctx.data), "train_loss": stats["train_loss"]})

    # --- batched training (mmfl.core.batched): every client's own model, stacked
    def batched_task(self, route: str, msg: Message) -> BatchedTask | None:
        if route != "train":
            return None
        own = read(self.ctx.state, MODEL)
        return BatchedTask(start=own if own else self.ctx.init_model().state_dict())

    def batched_loss(self, forward, params, inputs, labels, extras, shared):
        return F.cross_entropy(forward(params, inputs)["logits"], labels, reduction="none")  # local_train's loss

    def batched_finish(self, route: str, msg: Message, state, stats: dict) -> Message:
        write(self.ctx.state, MODEL, state)
        return Message(scalars={"num_examples": len(self.ctx.data), "train_loss": stats["train_loss"]})

    def evaluate(self, msg: Message) -> Message:
        metrics = evaluate_model(self._model(), self.ctx.test_data)
        scalars = {k: v for k, v in metrics.items()  # not the class-wise lists; pattern row counts too
                   if isinstance(v, float) or (k.startswith(PATTERN) and isinstance(v, int))}
        return Message(scalars={**scalars, "num_examples": len(self.ctx.test_data)})


register("local", None, LocalServer, LocalClient,
         help="SOLO: local training only, no communication; mean/std of client models' accuracy")
