"""Split learning, vanilla and sequential (Gupta & Raskar 2018), as PartialFL
(section 2, related work) describes it and uses it as a baseline (section 3.1.2).

The model is :mod:`mmfl.models.multimodal`, cut after the projectors:

- **client side**: ``encoders[m]`` and ``proj[m]`` of the modalities the client
  holds; its output ``z_m = proj[m](encoders[m](x_m))`` ``[B, feat_dim]`` is the
  cut-layer activation ("smashed data");
- **server side**: everything else, ``fusion``, the dropout before the joint
  classifier, ``classifier`` and the per-modality heads ``heads[m]`` (linear
  probes on the detached ``z_m``, as MFedAvg trains them; ``probe = false``
  skips them). A modality the batch lacks fills its fusion slot with zeros,
  exactly as :meth:`MultimodalModel.forward` does.

One round visits the cohort's clients one after the other. For client ``k``:

1. ``sl_begin`` (down): the current client-side weights of the modalities ``k``
   holds; the client draws its batch schedule (``train.local_epochs`` seeded
   shuffles of its data, batches of ``train.batch_size``) and replies with the
   number of batches;
2. per batch ``i``: ``sl_forward`` (down: ``i``) -> the client replies with
   ``act/<m>`` (the activations of the rows holding ``m``), ``present/<m>`` (the
   per-sample mask, only for data with missing modalities) and ``labels``
   (vanilla split learning uploads the labels). The server runs fusion +
   classifier, the cross-entropy, backward and its optimizer step on the
   server-side parameters, and sends ``grad/<m>`` = d loss / d ``act/<m>`` down
   (``sl_backward``). The client recomputes the forward of the same batch (it
   cannot keep an autograd graph between messages): same rows, same weights,
   the same torch seed (dropout); BatchNorm running statistics are updated by
   this recompute only, so once per batch. It backpropagates the received
   gradient and steps its optimizer, whose state lives in ``ctx.state``;
3. ``sl_end`` (up): the client's trained client-side weights, which the server
   keeps and hands to the next client in ``sl_begin``.

**U-shaped** (``split_learning_u``, ``u_shaped = true``; Vepakomma et al. 2018, "no label
sharing"): the labels stay on the client, which keeps both ends of the model:

- **client side**: ``encoders[m]`` of the modalities it holds (the front; its output
  ``f_m = encoders[m](x_m)`` is the first cut), and the joint ``classifier`` with the
  dropout before it and the per-modality heads ``heads[m]`` (the tail);
- **server side**: the projectors ``proj[m]`` and the ``fusion`` (the middle).

Per batch ``i``: ``sl_forward`` -> ``act/<m>`` = ``f_m`` (rows holding ``m``), the masks and
the batch size, no labels; the server runs the projectors and the fusion and sends
``sl_tail`` (down: ``rep`` ``[B, out_dim]``, the fusion's output, and ``z/<m>`` = the
projector outputs of the rows holding ``m`` for the probes) -> the client runs the
dropout, the classifier and the heads, the loss with its own labels, and backpropagates
to ``rep`` and its tail parameters; it replies ``grad_rep`` = d loss / d ``rep`` and the
loss. The server backpropagates ``grad_rep`` through the fusion and projectors, steps its
optimizer and sends ``grad/<m>`` = d loss / d ``act/<m>`` (``sl_backward``); the client
recomputes its front, backpropagates, and takes one optimizer step over front and tail.
Three round trips per batch instead of two; the labels never leave the device.

Every exchange is a ``transport.send``, so the engine counts activations,
labels, gradients and weights like any other algorithm's bytes; the round adds
``bytes_per_epoch`` (the round's bytes / ``local_epochs``) and ``messages``.

With one client and the same batches, the split model trains exactly like the
unsplit one (``local_train`` with MFedAvg's loss): the gradients are the same
(:func:`server_forward` mirrors the model's forward), and SGD and Adam update
each parameter on its own, so two optimizers over the two halves equal one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mmfl.algorithms.registry import preset, register
from mmfl.algorithms.base import Server
from mmfl.algorithms.dp_ledger import LEDGER_FIELDS, EpsilonLedger
from mmfl.algorithms.multimodal import require_multimodal_model
from mmfl.core.message import Message
from mmfl.core.state import optimizer
from mmfl.core.training import make_optimizer, model_tensors, seed_torch, set_lr
from mmfl.errors import ConfigError
from mmfl.seeds import derive_seed
from mmfl.algorithms.split_client import ORDER, SplitClient  # noqa: F401  (the client side; ORDER: tests read it)
from mmfl.algorithms.split_cut import (GRAD, GRAD_REP, REP, ZREP, client_keys, is_client_key,  # noqa: F401
                                      middle_forward, rows_of, server_forward, server_loss,
                                      unpack_activations)



@dataclass
class SplitParams:
    probe: bool = field(default=True, metadata={
        "help": "train the per-modality heads (server side) as linear probes on the detached activations"})
    persistent_server_optimizer: bool = field(default=False, metadata={
        "help": "keep one server optimizer for the whole run (checkpointed); false: a fresh one per client "
                "session, like the client's"})
    u_shaped: bool = field(default=False, metadata={
        "help": "U-shaped split learning: the client keeps the encoders and the classifier + heads, the server "
                "the projectors + fusion; labels never leave the client"})

    def __post_init__(self):
        for key in ("probe", "persistent_server_optimizer", "u_shaped"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"algorithm.{key}: expected true or false, got {getattr(self, key)!r}")


# ----------------------------------------------------------------------------- server


class RoundMeter:
    """Bytes and messages of the round's conversation (the engine's byte rule)."""

    def __init__(self):
        self.bytes, self.messages = 0, 0

    def send(self, transport, route: str, cid: int, msg: Message) -> Message | None:
        reply = transport.send(route, {cid: msg}).get(cid)
        self.bytes += msg.nbytes()
        self.messages += 1
        if reply is not None:
            self.bytes += reply.nbytes()
            self.messages += 1
        return reply


class SplitServer(EpsilonLedger, Server):
    trains_modality_heads = True  # server_loss's probes (algorithm.probe)
    runs_on = "pair"
    # the persistent server optimizer (None: a fresh one per session); [dp]'s epsilons (EpsilonLedger)
    state_fields = {"opt": optimizer(), **LEDGER_FIELDS}
    # [dp] mode = "rows": each cut activation row (and U-shaped's grad_rep row) through the per-row Gaussian
    # mechanism, the client-side weights of sl_end through local DP's randomizer (mmfl.algorithms.dp_ledger)
    dp_extra_modes = ("rows",)
    def __init__(self, params: SplitParams, ctx):
        super().__init__(params, ctx)
        require_multimodal_model(self.model, "split_learning")
        if getattr(self.model, "infil", None) is not None:
            raise ConfigError("model.two_projector: split_learning cuts after the self projectors; "
                              "set model.two_projector = false")
        self.u = params.u_shaped
        self.server_params = {n: p for n, p in self.model.named_parameters() if not is_client_key(n, self.u)}
        if not self.server_params:
            raise ConfigError("split_learning_u: the server side (projectors + fusion) has no parameters; "
                              "set model.projector to 'linear' or 'mlp', or use a fusion with parameters")
        self.opt = self.new_optimizer() if params.persistent_server_optimizer else None

    def new_optimizer(self) -> torch.optim.Optimizer:
        return make_optimizer(list(self.server_params.values()), self.ctx.train)

    def batch_seed(self, rnd: int, cid: int, step: int) -> int:
        """The torch seed of the server-side forward of one batch (its dropout)."""

        return derive_seed(self.ctx.seed, rnd, cid, "sl_server", step)

    # --- one batch ------------------------------------------------------------------
    def serve_batch(self, rnd: int, cid: int, step: int, reply: Message, opt) -> tuple[Message, float]:
        """Server forward, loss, backward and step on one ``sl_forward`` reply; the gradients
        to send down (``grad/<m>``) and the loss."""
        leaves, full, present, labels, _ = unpack_activations(reply)
        self.model.train()
        opt.zero_grad(set_to_none=True)
        seed_torch(self.batch_seed(rnd, cid, step))
        out = server_forward(self.model, full, present, int(labels.shape[0]))
        loss = server_loss(self.model, out, labels, self.params.probe)
        loss.backward()
        opt.step()
        grads = {GRAD + m: (leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)).detach()
                 for m, leaf in leaves.items()}
        return Message(arrays=grads), float(loss.detach())

    def serve_middle(self, cid: int, reply: Message, opt, meter: RoundMeter, transport) -> tuple[Message, float] | None:
        """U-shaped: projectors + fusion on one ``sl_forward`` reply, ``sl_tail`` down (the fusion
        output and, for the probes, the projector outputs), backward of the returned
        ``grad_rep`` and the server step; the gradients to send down and the client's loss
        (None if the client did not answer)."""
        leaves, full, present, _, b = unpack_activations(reply)
        self.model.train()
        opt.zero_grad(set_to_none=True)
        rep, z, masks = middle_forward(self.model, full, present, b)
        down = {REP: rep.detach()}
        if self.params.probe:
            down.update({ZREP + m: rows_of(z[m], present[m]).detach() for m in z})
        tail = meter.send(transport, "sl_tail", cid, Message(arrays=down))
        if tail is None:
            return None
        grad_rep = tail.arrays[GRAD_REP]
        if grad_rep.shape != rep.shape:
            raise RuntimeError(f"client {cid} sent grad_rep of shape {tuple(grad_rep.shape)}, expected {tuple(rep.shape)}")
        rep.backward(grad_rep.to(rep.dtype))
        opt.step()
        grads = {GRAD + m: (leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)).detach()
                 for m, leaf in leaves.items()}
        return Message(arrays=grads), float(tail.scalars["loss"])

    # --- the round --------------------------------------------------------------------
    def round(self, rnd, cohort, transport):
        meter = RoundMeter()
        losses, done, examples = [], 0, 0
        for cid in cohort:
            n = self.session(rnd, cid, transport, meter, losses)
            if n is not None:
                done, examples = done + 1, examples + n
        epochs = self.ctx.train.local_epochs
        out = {"clients_replied": done, "num_examples": examples, "steps": len(losses),
               "messages": meter.messages, "bytes_per_epoch": meter.bytes / epochs}
        if losses:
            out["train_loss"] = float(sum(losses) / len(losses))
        out.update(self.dpsgd_metrics())  # [dp]: the clients' epsilons ({} without)
        return out

    def session(self, rnd, cid, transport, meter: RoundMeter, losses: list[float]) -> int | None:
        """One client's turn: begin, every batch, end. Returns its number of samples, or None
        if a reply was missing (then its client-side weights are not taken; the server-side
        steps of the batches before stay)."""
        own = model_tensors(self.model)
        keys = client_keys(own, self.ctx.modalities_of(cid), self.u)
        begin = meter.send(transport, "sl_begin", cid, Message(arrays={k: own[k].detach().clone() for k in keys}))
        if begin is None:
            return None
        opt = self.opt if self.opt is not None else self.new_optimizer()
        set_lr(opt, self.ctx.train_at(rnd).lr)  # the round's lr (train.lr_schedule), as the client's
        for i in range(int(begin.scalars["num_batches"])):
            fwd = meter.send(transport, "sl_forward", cid, Message(scalars={"batch": i}))
            if fwd is None:
                return None
            if self.u:
                served = self.serve_middle(cid, fwd, opt, meter, transport)
                if served is None:
                    return None
                grads, loss = served
            else:
                grads, loss = self.serve_batch(rnd, cid, i, fwd, opt)
            losses.append(loss)
            if meter.send(transport, "sl_backward", cid, grads) is None:
                return None
        end = meter.send(transport, "sl_end", cid, Message())
        if end is None:
            return None
        if sorted(end.arrays) != sorted(keys):
            raise RuntimeError(f"client {cid} uploaded {sorted(end.arrays)}, expected {sorted(keys)}")
        self.note_dpsgd_epsilon(cid, end)
        with torch.no_grad():
            for k in keys:
                own[k].copy_(end.arrays[k])
        return int(begin.scalars["num_examples"])

    # --- checkpointing -------------------------------------------------------------


register("split_learning", SplitParams, SplitServer, SplitClient,
         help="split learning (vanilla, sequential): client-side encoders + projectors, server-side fusion + "
              "classifier; activations and labels up, gradients down, per batch")
register("split_learning_u", preset("SplitUParams", SplitParams, u_shaped=True), SplitServer, SplitClient,
         help="U-shaped split learning (sequential): the client keeps the encoders and the classifier + heads, "
              "the server the projectors + fusion; labels never leave the client")
