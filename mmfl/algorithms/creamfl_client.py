"""CreamFL's client (see :mod:`mmfl.algorithms.creamfl` for the round): its private task
(classification, or the image-text contrastive task), the local contrastive regularization
of eq. 1-3 over the public set, the optional local distillation of the KD baselines, and
the upload of its public-set representations."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmfl.algorithms.base import TrainingClient
from mmfl.core.dp_rows import fixed_batchnorm, private_step
from mmfl.core.dpsgd import history_epsilon, poisson_batches, record_steps, sample_rate, steps_per_epoch
from mmfl.core.message import Message
from mmfl.core.state import read, tensor, write
from mmfl.core.training import (load_into, make_optimizer, shuffled_batches, state_of)
from mmfl.errors import ConfigError
from mmfl.seeds import derive_seed

from mmfl.algorithms.creamfl_terms import (CONSENSUS, GLOBAL, MODEL, REP, inter_loss, intra_loss, masked_mse,
                                           pair_loss, present_of, public_reps, reps_of, select_public, zero_loss)
from mmfl.algorithms.multimodal import masked_ce


DPSGD_HISTORY = "dpsgd/history"  # client state: its RDP accountant's history (z / 2, q, steps), [dp] mode = "sample"


def private_training(ctx):
    """The run's ``[dp]`` when it is DP-SGD (mode "sample"), else None."""
    return ctx.dp if ctx.dp is not None and ctx.dp.mode == "sample" else None


def at(mask: Tensor | None, rows: Tensor) -> Tensor | None:
    """``mask`` (bool ``[P]`` over the public set; None: every row) at the public rows ``rows``."""
    return None if mask is None else mask.to(rows.device)[rows]


class CreamFLClient(TrainingClient):
    """A client of the representation-exchange family: keeps its own model (any size),
    trains its private task with LCR, uploads representations of the public set.

    On the :class:`~mmfl.algorithms.base.TrainingClient` hooks: ``load_model`` (its own model;
    the weight-sharing baselines load the server's weights into it), ``begin``, ``loss`` (the
    private task), ``on_epoch`` / ``before_step`` / ``after_step`` (in the private-task loop),
    ``after_train`` (keeps its model in ``ctx.state``) and ``finish`` (the reply). ``train`` is
    its own loop: one optimizer over the private task and the public-set passes (the local
    distillation before it; ``extra_epoch`` and the LCR pass after every epoch)."""
    stateful = True  # keeps ctx.state between rounds (Capabilities.stateful_clients)

    def pair(self) -> list[str]:
        if self.ctx.public is None:
            raise ConfigError(f"client {self.ctx.cid}: no public set (CreamFL-style algorithms need one)")
        return sorted(self.ctx.public.modalities)

    def load_model(self, msg: Message) -> nn.Module:
        """The client's own model (from ``ctx.state``, else the run's initial weights)."""
        model = self.ctx.model("local")
        own = read(self.ctx.state, MODEL)
        return load_into(model, own if own else self.ctx.init_model().state_dict())

    def loss(self, model: nn.Module, inputs: dict[str, Tensor], labels: Tensor, msg: Message) -> Tensor:
        """Image-text clients: symmetric InfoNCE (or PCME) on their pairs; uni-modal: cross-entropy of ``heads[m]``."""
        held = [m for m in self.pair() if m in inputs and m in model.holds]
        if len(held) == 2:
            z = reps_of(model, inputs, held) if self.params.multimodal_loss == "infonce" else None
            return pair_loss(model, inputs, z, held, self.params)
        m = held[0] if held else next(m for m in model.holds if m in inputs)
        mask = present_of(inputs, m)  # None: every row holds m
        if mask is not None and not bool(mask.any()):
            return zero_loss(model)
        z = model.encode_present(m, inputs, model.proj[m])  # only the rows holding m are encoded
        return masked_ce(model.heads[m](z), labels, mask)

    def train(self, msg: Message) -> Message:
        p, ctx = self.params, self.ctx
        public = select_public(ctx.public, p.public_size)
        pair = self.pair()
        held = [m for m in pair if m in ctx.modalities]
        model = self.load_model(msg)
        self.begin(model, msg)
        glob = {k[len(GLOBAL):]: v for k, v in msg.arrays.items() if k.startswith(GLOBAL)}
        prev = public_reps(model, public, held) if p.intra and glob else {}
        gen = ctx.generator()
        opt = make_optimizer([q for q in model.parameters() if q.requires_grad], ctx.train)
        model.train()
        stats = {"task": [0.0, 0], "lcr": [0.0, 0], "kd": [0.0, 0]}
        target = {}
        if p.local_distill == "consensus":
            target = {k[len(CONSENSUS):]: v for k, v in msg.arrays.items() if k.startswith(CONSENSUS)}
        elif p.local_distill == "global":
            target = {m: glob[m] for m in held if m in glob}
        has = {m: present_of(public, m) for m in pair}  # the public rows holding m (None: all), once per round
        if target and p.local_distill_weight:  # FedMD's digest / FedET-FedGEMS's local distillation
            self.public_pass(model, opt, public, gen, stats["kd"], lambda z, rows: p.local_distill_weight * sum(
                masked_mse(z[m], target[m][rows], at(has[m], rows))  # rows lacking m: no target, no term
                for m in z if m in target))
        loss_fn = self.loss_fn(msg)
        dp = private_training(ctx)
        for epoch in range(ctx.train.local_epochs):
            self.on_epoch(epoch)
            private = dp is not None  # DP-SGD, batch-level clipping (the InfoNCE negatives are the batch's rows)
            if private:
                self.private_epoch(model, opt, gen, loss_fn, stats["task"])
            for inputs, labels in (() if private else
                                   ctx.data.batches(ctx.train.batch_size, shuffle=True, generator=gen)):
                if labels.shape[0] < 2:
                    continue
                loss = loss_fn(model, inputs, labels)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                self.before_step()
                opt.step()
                self.after_step()
                stats["task"][0] += loss.detach().double()  # summed on the device: no sync per step
                stats["task"][1] += 1
            self.extra_epoch(model, opt, public, gen, stats["task"], pair)
            if glob and (p.inter or p.intra) and p.gamma:  # LCR: a pass over the public set after every epoch (eq. 3)
                self.public_pass(model, opt, public, gen, stats["lcr"],
                                 lambda z, rows: p.gamma * self.lcr(z, rows, glob, prev, pair, has))
        self.after_train(model, msg, stats)
        return self.finish(model, msg, stats)

    def private_epoch(self, model, opt, gen, loss_fn, stat) -> None:
        """``[dp] mode = "sample"``: one epoch of the private task as DP-SGD with batch-level clipping
        (``ceil(n / B)`` Poisson batches at q = min(1, B / n), each batch's mean-loss gradient clipped to
        C plus N(0, (z C)^2), :func:`mmfl.core.dp_rows.private_step`); the accountant takes (z / 2, q,
        steps). The public-set passes read public data only and stay as they are."""
        dp, data = self.ctx.dp, self.ctx.data
        n, b = len(data), self.ctx.train.batch_size
        q, steps = sample_rate(n, b), steps_per_epoch(n, b)
        noise = self.__dict__.setdefault("_dp_noise", torch.Generator(device="cpu").manual_seed(
            derive_seed(self.ctx.seed, "dpsgd-noise")))
        params = [p for p in model.parameters() if p.requires_grad]
        with fixed_batchnorm(model):
            for rows in poisson_batches(n, q, steps, gen):
                loss = None
                if rows.numel() >= 2:  # a contrastive pair loss needs two rows; else the step is noise alone
                    loss = loss_fn(model, *data.get(rows.to(data.labels.device)))
                    stat[0] += loss.detach().double()
                    stat[1] += 1
                private_step(opt, params, loss, dp.clip_norm, dp.noise_multiplier, noise)
        history = record_steps(read(self.ctx.state, DPSGD_HISTORY, tensor()), dp.noise_multiplier / 2, q, steps)
        write(self.ctx.state, DPSGD_HISTORY, history, tensor())

    def after_train(self, model: nn.Module, msg: Message, stats: dict) -> None:
        """The client keeps its own model between rounds."""
        write(self.ctx.state, MODEL, state_of(model))

    def finish(self, model: nn.Module, msg: Message, stats: dict) -> Message:
        """Step 4's reply: :meth:`reply_arrays` and the mean losses."""
        public = select_public(self.ctx.public, self.params.public_size)
        held = [m for m in self.pair() if m in self.ctx.modalities]
        out = self.reply_arrays(model, public, held)
        mean = {k: float(v[0]) / max(v[1], 1) for k, v in stats.items()}
        scalars = {"num_examples": len(self.ctx.data), "train_loss": mean["task"] + mean["lcr"] + mean["kd"],
                   "task_loss": mean["task"]}
        if stats["lcr"][1]:
            scalars["lcr_loss"] = mean["lcr"]
        dp = private_training(self.ctx)
        if dp is not None and dp.noise_multiplier > 0:  # this client's epsilon so far (its accountant)
            scalars["dp/epsilon"] = history_epsilon(read(self.ctx.state, DPSGD_HISTORY, tensor()), dp.delta)
        return Message(arrays=out, scalars=scalars)

    def lcr(self, z: dict[str, Tensor], rows: Tensor, glob: dict[str, Tensor], prev: dict[str, Tensor],
            pair: list[str], has: dict[str, Tensor | None]) -> Tensor:
        """Eq. 1-3 on public rows ``rows``. A public set missing modalities (``has``: modality ->
        the public rows holding it, :func:`present_of`; None: all): an anchor of eq. 1 must hold
        both modalities, a candidate j (negatives included) the other one; eq. 2 uses the rows
        holding the modality."""
        p = self.params
        loss = 0.0
        for m, zm in z.items():
            other = pair[1] if m == pair[0] else pair[0]
            own = at(has[m], rows)
            if p.inter and other in glob:
                col = has[other]
                anchor = own if col is None else (at(col, rows) if own is None else own & at(col, rows))
                loss = loss + inter_loss(zm, glob[other], rows, p.lcr_temperature, anchor, col)  # eq. 1
            if p.intra and m in glob and m in prev:
                loss = loss + intra_loss(zm, glob[m][rows], prev[m][rows], p.lcr_temperature, own)  # eq. 2
        return loss

    def public_pass(self, model, opt, public, gen, stat, loss_of) -> None:
        held = [m for m in self.pair() if m in model.holds]
        for rows in shuffled_batches(len(public), self.ctx.train.batch_size, gen):
            inputs, _ = public.get(rows)
            z = reps_of(model, inputs, held)
            loss = loss_of(z, rows)
            if not isinstance(loss, Tensor):
                continue
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            stat[0] += loss.detach().double()
            stat[1] += 1

    # hooks of the weight-sharing baselines
    def extra_epoch(self, model, opt, public, gen, stat, pair) -> None:
        pass

    def reply_arrays(self, model: nn.Module, public, held: list[str]) -> dict[str, Tensor]:
        """Step 4: the representations of the public set, only for the modalities held."""
        return {REP + m: t for m, t in public_reps(model, public, held).items()}
