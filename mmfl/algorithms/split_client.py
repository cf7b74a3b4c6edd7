"""Split learning's client (:mod:`mmfl.algorithms.split` has the protocol and the server): the
client side of the cut, one session per round (``sl_begin``, then per batch ``sl_forward``,
U-shaped ``sl_tail``, ``sl_backward``, then ``sl_end``), its state between messages in
``ctx.state["sl/*"]``."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor, nn

from mmfl.algorithms.base import Client
from mmfl.algorithms.dp_ledger import count_releases, release_model, release_rows, rows_dp, with_epsilon
from mmfl.algorithms.split_cut import (GRAD, GRAD_REP, REP, U_TAIL, ZREP, activation_message, batch_schedule,
                                      client_forward, client_keys, rows_of, server_loss)
from mmfl.core.dp_rows import fixed_batchnorm
from mmfl.core.message import Message
from mmfl.core.state import optimizer, read, write
from mmfl.core.training import make_optimizer, model_tensors, seed_torch
from mmfl.data.base import PRESENT
from mmfl.errors import ConfigError

STATE = "sl/"  # client state during a session: weights, optimizer, batch order, current batch
W, OPT = STATE + "w/", STATE + "opt/"
ORDER, BATCH, SEED = STATE + "order", STATE + "batch", STATE + "seed"
W0 = STATE + "w0/"  # [dp] mode = "rows": the client-side weights the session started from
ACT_RELEASE = "act/"  # the noise seed's tag of a modality's activations
TAIL_GRAD = STATE + "g/"  # U-shaped: the tail's gradients, from sl_tail until the step in sl_backward


class SplitClient(Client):
    """The client side of the cut; between messages it keeps its session in ``ctx.state["sl/*"]``."""
    stateful = True  # keeps ctx.state between rounds (Capabilities.stateful_clients)

    @property
    def u(self) -> bool:
        return bool(getattr(self.params, "u_shaped", False))

    def _model(self) -> tuple[nn.Module, list[str]]:
        model = self.ctx.model("local")
        return model, client_keys(model_tensors(model), self.ctx.modalities, self.u)

    def _load(self) -> tuple[nn.Module, list[str]]:
        """The pooled model with this session's client-side weights (and buffers)."""
        model, keys = self._model()
        own = model_tensors(model)
        with torch.no_grad():
            for k in keys:
                own[k].copy_(self.ctx.state[W + k])
        model.train()
        return model, keys

    def _batch(self, i: int) -> tuple[dict[str, Tensor], Tensor]:
        order = self.ctx.state[ORDER]
        e, s, stop = batch_schedule(order.shape[1], self.ctx.train.batch_size, order.shape[0])[i]
        return self.ctx.data.get(order[e, s:stop].to(self.ctx.data.labels.device))

    def _frozen(self, model):
        """[dp] mode = "rows": BatchNorm fixed (its statistics stay as received, released as they came)."""
        return fixed_batchnorm(model) if rows_dp(self.ctx) is not None else nullcontext()

    def _clear(self) -> None:
        write(self.ctx.state, STATE, None)

    def sl_begin(self, msg: Message) -> Message:
        model, keys = self._model()
        own = model_tensors(model)
        if sorted(msg.arrays) != sorted(keys) or any(own[k].shape != msg.arrays[k].shape for k in keys):
            raise ConfigError(f"client {self.ctx.cid}: split_learning hands one model from client to client; "
                              "its client side must have the server's architecture "
                              "(no [[client_models]] changing them)")
        self._clear()
        n, g = len(self.ctx.data), self.ctx.generator()
        self.ctx.state.update({W + k: msg.arrays[k].detach().clone() for k in keys})
        self.ctx.state[ORDER] = torch.stack([torch.randperm(n, generator=g, device="cpu")  # CPU: the same
                                             for _ in range(self.ctx.train.local_epochs)]).to(self.ctx.device)
        nb = len(batch_schedule(n, self.ctx.train.batch_size, self.ctx.train.local_epochs))
        if rows_dp(self.ctx) is not None:  # [dp] mode = "rows": the weights sl_end's randomizer starts from
            self.ctx.state.update({W0 + k: msg.arrays[k].detach().clone() for k in keys})
        return Message(scalars={"num_batches": nb, "num_examples": n})

    def sl_forward(self, msg: Message) -> Message:
        i = int(msg.scalars["batch"])
        inputs, labels = self._batch(i)
        model, _ = self._load()
        self.ctx.state[BATCH] = torch.tensor(i, device=self.ctx.device)
        self.ctx.state[SEED] = torch.tensor(self.ctx.seed, device=self.ctx.device)
        with torch.no_grad():
            seed_torch(self.ctx.seed)  # the recompute in sl_backward draws the same dropout
            with self._frozen(model):
                acts = client_forward(model, inputs, self.u)
        # the BatchNorm statistics this forward changed in the pooled model are not kept: the
        # recompute in sl_backward updates them, once
        if rows_dp(self.ctx) is not None:  # [dp] mode = "rows": each row's activation clipped and noised
            acts = {m: release_rows(self.ctx, a, ACT_RELEASE + m) for m, a in acts.items()}
        return activation_message(acts, inputs, labels, send_labels=not self.u)

    def sl_tail(self, msg: Message) -> Message:
        """U-shaped: dropout + classifier + heads on the server's fusion output, MFedAvg's loss
        with the client's own labels; keeps the tail's gradients for the step in sl_backward
        and replies d loss / d rep and the loss."""
        inputs, labels = self._batch(int(self.ctx.state[BATCH]))
        model, keys = self._load()
        rep = msg.arrays[REP].detach().clone().requires_grad_(True)
        b = int(labels.shape[0])
        masks, z = {}, {}
        for m in model.holds:
            mask = inputs.get(PRESENT + m)
            masks[m] = (mask.to(torch.bool).reshape(b) if mask is not None
                        else torch.ones(b, dtype=torch.bool, device=rep.device))
            if ZREP + m in msg.arrays:
                rows = masks[m].nonzero(as_tuple=True)[0]
                zm = msg.arrays[ZREP + m]
                z[m] = zm.new_zeros(b, zm.shape[1]).index_put((rows,), zm)
        tail = {n: p for n, p in model.named_parameters() if n in set(keys) and n.split(".", 1)[0] in U_TAIL}
        for p in tail.values():
            p.grad = None
        logits = model.classifier(model.dropout(rep))
        loss = server_loss(model, {"logits": logits, "mod_reps": z, "present": masks}, labels, bool(z))
        loss.backward()
        self.ctx.state.update({TAIL_GRAD + n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
                               for n, p in tail.items()})
        grad = rep.grad.detach()
        if rows_dp(self.ctx) is not None:  # [dp] mode = "rows": each row's gradient (it carries the label)
            grad = release_rows(self.ctx, grad, GRAD_REP)
        return Message(arrays={GRAD_REP: grad}, scalars={"loss": float(loss.detach())})

    def sl_backward(self, msg: Message) -> Message:
        inputs, _ = self._batch(int(self.ctx.state[BATCH]))
        model, keys = self._load()
        params = {n: p for n, p in model.named_parameters() if n in set(keys)}
        for p in params.values():
            p.grad = None
        seed_torch(int(self.ctx.state[SEED]))
        with self._frozen(model):
            acts = client_forward(model, inputs, self.u)
        outs, grads = [], []
        for m, a in acts.items():
            outs.append(rows_of(a, inputs.get(PRESENT + m)))
            grads.append(msg.arrays[GRAD + m])
        torch.autograd.backward(outs, grads)
        for n, p in params.items():  # U-shaped: the tail's gradients from sl_tail
            if TAIL_GRAD + n in self.ctx.state:
                p.grad = self.ctx.state.pop(TAIL_GRAD + n).clone()
        opt = make_optimizer(list(params.values()), self.ctx.train)
        read(self.ctx.state, OPT, optimizer(), opt)
        opt.step()
        own = model_tensors(model)
        self.ctx.state.update({W + k: own[k].detach().clone() for k in keys})
        write(self.ctx.state, OPT, opt, optimizer())
        return Message()  # the .grad of the pooled model's client-side parameters stay (tests read them)

    def sl_end(self, msg: Message) -> Message:
        _, keys = self._model()
        arrays = {k: self.ctx.state[W + k] for k in keys}
        eps = None
        if rows_dp(self.ctx) is not None:  # [dp] mode = "rows": the weights by local DP's randomizer; count
            model, _ = self._model()
            arrays = release_model(self.ctx, arrays, {k: self.ctx.state[W0 + k] for k in keys}, "weights",
                                   {n for n, _ in model.named_parameters()})
            e = self.ctx.train.local_epochs  # per epoch each row once per modality it holds (+ U: its grad_rep)
            eps = count_releases(self.ctx, e * (len(self.ctx.modalities) + self.u) + 1)
        self._clear()
        return with_epsilon(Message(arrays=arrays), eps)
