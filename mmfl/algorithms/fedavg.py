"""FedAvg (McMahan et al., 2017) as in MOON's Algorithm 1, lines 4-7.

Each sampled client starts from the global model w^t, runs E epochs of SGD on
its data and returns w_k^t; the server sets

    w^{t+1} = sum_k |D^k| / |D| * w_k^t        (Algorithm 1, line 7)

over the clients that replied (|D| = their total size). Subclasses change the
local objective (:meth:`FedAvgClient.objective` / ``penalty`` / ``references``, written once
for the sequential and the batched path) or the aggregation rule (``algorithm.aggregation``,
a name in :data:`mmfl.core.aggregation.AGGREGATION_RULES`).

With ``[dp] mode = "sample"`` the client's local training is DP-SGD (:mod:`mmfl.core.dpsgd`) on the
same objective, per sample, and the server reports the clients' own epsilons (docs/dp.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from mmfl.algorithms.registry import register
from mmfl.algorithms.base import Server, TrainingClient
from mmfl.algorithms.capabilities import server_streams
from mmfl.core.aggregation import aggregate, check_rule, rule_kwargs, rule_params, weighted_mean
from mmfl.core.batched import BatchedClient, BatchedTask
from mmfl.core.dp import central_dp_mean, client_epsilon_metrics
from mmfl.core.dpsgd import Penalty, SampleLoss, dpsgd_train, history_epsilon, record_steps
from mmfl.core.message import Message
from mmfl.core.state import read, tensor, write
from mmfl.core.streaming import CentralDPFold, make_fold
from mmfl.core.training import LossFn, load_into, model_tensors, state_of
from mmfl.seeds import derive_seed


DPSGD_HISTORY = "dpsgd/history"  # client state: its RDP accountant's history [m, 3] (z, q, steps), float64
MODULE_WEIGHT = "examples/"  # reply scalar "examples/<key prefix>": the data weight of that module


def weighted_average(states: list[dict[str, Tensor]], weights: list[float | dict[str, float]],
                     previous: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
    """The ``weighted_mean`` aggregation rule (:func:`mmfl.core.aggregation.weighted_mean`):
    each key averaged over the states carrying it, weights per module (MOON Alg. 1, line 7)."""
    return weighted_mean(states, weights, previous)


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


@dataclass
class FedAvgParams:
    """The parameters every FedAvg-family algorithm has (its params dataclass extends this)."""

    aggregation: str = field(default="weighted_mean", kw_only=True, metadata={  # kw_only: after subclass fields
        "help": "the server's aggregation rule, by name (`mmfl list aggregation`): weighted_mean = "
                "FedAvg's data-size weights (MOON Alg. 1 line 7), mean = uniform, ..."})
    aggregation_params: dict[str, Any] = field(default_factory=dict, kw_only=True, metadata={
        "help": "the rule's parameters, a table checked against that rule (`mmfl list aggregation`), e.g. "
                "{trim_fraction = 0.2} for trimmed_mean, {f = 1} for krum / bulyan, {clip_norm = 1.0} for norm_clip"})

    def __post_init__(self):
        check_rule(self.aggregation)
        rule_params(self.aggregation, self.aggregation_params)


class FedAvgServer(Server):
    default_aggregation = "weighted_mean"  # the rule when the params name none (subclasses: their paper's)
    # [dp] applies: every reply array the server uses is a model entry that aggregate() combines
    # (servers reading other arrays of the replies, e.g. control variates, set False)
    dp_capable = True
    # [dp] mode = "sample": each client's latest epsilon (its own accountant, reply scalar "dp/epsilon"),
    # float64 [num_clients], 0 before a client's first training; None: not a DP-SGD run (nothing saved)
    state_fields = {"dp_epsilon": tensor()}
    dp_epsilon = None

    def configure_train(self, rnd: int, cohort: list[int]) -> dict[int, Message]:
        msg = Message(arrays=dict(self.model.state_dict()))  # one message object, counted per recipient
        return {cid: msg for cid in cohort}

    def weight(self, cid: int, reply: Message) -> float | dict[str, float]:
        """Aggregation weight of a reply: its data size, per module."""
        return reply_weights(reply)

    def aggregation_rule(self) -> str:
        """The name of the rule in :data:`mmfl.core.aggregation.AGGREGATION_RULES` (``algorithm.aggregation``)."""
        return getattr(self.params, "aggregation", None) or self.default_aggregation

    def aggregation_context(self, rnd: int, replies: dict[int, Message]) -> dict:
        """Keyword arguments the rule gets besides updates, weights and previous values."""
        return {}

    def aggregate(self, rnd: int, replies: dict[int, Message]) -> dict[str, Tensor]:
        """The new global state from the clients' models (the model entries of their
        ``arrays``; other arrays, e.g. prototypes, are the algorithm's) by the named rule,
        module by module: a module only some replies carry is combined over those, one none
        carries keeps its value (see :mod:`mmfl.core.aggregation`)."""
        cids = sorted(replies)
        own = model_tensors(self.model)
        states = [{k: v for k, v in replies[c].arrays.items() if k in own} for c in cids]
        rule = self.aggregation_rule()
        dp = self.ctx.dp
        if dp is not None and dp.mode == "central":  # DP-FedAvg replaces the rule (config checks it is the default)
            return central_dp_mean(states, dict(self.model.state_dict()), dp.clip_norm, dp.noise_multiplier,
                                   derive_seed(self.ctx.seed, rnd, "dp-noise"), denominator=self.ctx.cohort_size)
        return aggregate(rule, states, [self.weight(c, replies[c]) for c in cids], dict(self.model.state_dict()),
                         **self.aggregation_context(rnd, replies),
                         **rule_kwargs(rule, getattr(self.params, "aggregation_params", None)))

    def reported_scalars(self) -> tuple[str, ...]:
        """Reply scalars averaged (by data size) into the round's metrics besides ``train_loss``."""
        return ()

    def server_step(self, rnd: int, previous: dict[str, Tensor], averaged: dict[str, Tensor]) -> dict[str, Tensor]:
        """The new global state from the state the round started from (``previous``) and the
        clients' aggregate (``averaged``: :meth:`aggregate`'s result on the list path, the rule's
        fold on the streamed one). FedAvg: the aggregate (MOON Alg. 1, line 7). A server with its
        own optimizer on the round's update ``averaged - previous`` (FedAvgM's momentum, FedAdam's
        moments; FedOpt, Reddi et al. 2021, Alg. 1) overrides this, not ``aggregate``: it keeps
        streaming aggregation, DP and the named rule. Its state lives in ``state_fields``."""
        return averaged

    def aggregate_train(self, rnd: int, replies: dict[int, Message]) -> dict[str, float]:
        previous = dict(self.model.state_dict())
        self.model.load_state_dict(self.server_step(rnd, previous, self.aggregate(rnd, replies)))
        out = {}
        for key in ("train_loss", *self.reported_scalars()):
            v = weighted_mean_scalar(replies, key)
            if v is not None:
                out[key] = v
        if self.ctx.dp is not None and self.ctx.dp.mode == "sample":
            for cid in sorted(replies):
                self.note_dpsgd_epsilon(cid, replies[cid])
            out.update(self.dpsgd_metrics())
        return out

    def note_dpsgd_epsilon(self, cid: int, reply: Message) -> None:
        """[dp] mode = "sample": keep client ``cid``'s epsilon from its reply (``dp/epsilon``, from its
        own RDP accountant over the rounds it trained)."""
        if self.dp_epsilon is None:
            self.dp_epsilon = torch.zeros(self.ctx.num_clients, dtype=torch.float64, device=self.ctx.device)
        if "dp/epsilon" in reply.scalars:
            self.dp_epsilon[cid] = float(reply.scalars["dp/epsilon"])

    def dpsgd_metrics(self) -> dict[str, float]:
        """DP-SGD's row entries: ``dp/epsilon``, the largest epsilon of any client so far,
        ``dp/epsilon_mean``, their mean over the clients that have trained, and ``dp/delta``. With
        ``noise_multiplier = 0`` epsilon is inf (clients send none: a reply's scalars must be finite)."""
        return client_epsilon_metrics(self.ctx.dp, self.dp_epsilon)

    def train_accumulator(self, rnd: int) -> "FedAvgAccumulator | None":
        """:meth:`aggregate_train` one reply at a time when the rule folds
        (:mod:`mmfl.core.streaming`: weighted_mean, mean, iot, norm_clip; central DP's clipped
        sum) and this class aggregates as FedAvgServer does (a subclass overriding
        ``aggregate`` or ``aggregate_train`` needs the whole list, unless it gives its own; one
        overriding only :meth:`server_step` streams: the step follows the fold)."""
        if not server_streams(type(self)):  # declared / inferred once (mmfl.algorithms.capabilities)
            return None
        previous = dict(self.model.state_dict())
        dp = self.ctx.dp
        if dp is not None and dp.mode == "central":
            fold = CentralDPFold(previous, dp.clip_norm, dp.noise_multiplier,
                                 derive_seed(self.ctx.seed, rnd, "dp-noise"), denominator=self.ctx.cohort_size)
        else:
            rule = self.aggregation_rule()
            const = self.aggregation_context(rnd, {})  # the per-update entries are lists, empty here
            fold = make_fold(rule, previous, **const, **rule_kwargs(rule, getattr(self.params, "aggregation_params", None)))
        return None if fold is None else FedAvgAccumulator(self, rnd, fold, previous)


class FedAvgAccumulator:
    """:meth:`FedAvgServer.aggregate_train` fed one reply at a time (a
    :class:`~mmfl.algorithms.base.ReplyAccumulator`): each reply's model entries go into the
    rule's fold with the reply's weight (and its per-update context, e.g. ``iot``'s
    ``multimodal``), its reported scalars into running data-weighted sums; nothing of the
    reply is kept. ``finish`` loads the new model (:meth:`FedAvgServer.server_step` of the
    fold's result) and returns the round's metrics, equal to
    the list path's (:mod:`mmfl.core.streaming` on numerics)."""

    def __init__(self, server: FedAvgServer, rnd: int, fold, previous: dict[str, Tensor] | None = None):
        self.server, self.rnd, self.fold = server, rnd, fold
        self.previous = dict(server.model.state_dict()) if previous is None else previous
        self.own = set(model_tensors(server.model))
        self.item_keys = tuple(getattr(fold, "item_keys", ()))
        self.keys = ("train_loss", *server.reported_scalars())
        self.dpsgd = server.ctx.dp is not None and server.ctx.dp.mode == "sample"

    def begin(self) -> None:
        self.sums = {key: [0, 0] for key in self.keys}  # key -> [sum v n, sum n] (weighted_mean_scalar)
        self.seen = {key: False for key in self.keys}

    def add(self, cid: int, reply: Message) -> None:
        server = self.server
        item = {}
        if self.item_keys:
            ctx = server.aggregation_context(self.rnd, {cid: reply})
            item = {k: ctx[k][0] for k in self.item_keys if k in ctx}
        self.fold.add({k: v for k, v in reply.arrays.items() if k in self.own}, server.weight(cid, reply), **item)
        for key in self.keys:
            if key in reply.scalars:
                n = reply.scalars.get("num_examples", 1)
                s = self.sums[key]
                s[0] += reply.scalars[key] * n
                s[1] += n
                self.seen[key] = True
        if self.dpsgd:
            server.note_dpsgd_epsilon(cid, reply)

    def finish(self) -> dict[str, float]:
        self.server.model.load_state_dict(self.server.server_step(self.rnd, self.previous, self.fold.finish()))
        out = {key: float(s / n) for key, (s, n) in self.sums.items() if self.seen[key]}
        if self.dpsgd:
            out.update(self.server.dpsgd_metrics())
        return out


class FedAvgClient(TrainingClient, BatchedClient):
    """Local SGD on the client's data (the hooks of :class:`~mmfl.algorithms.base.TrainingClient`).

    The objective is written once, for the sequential and the batched path
    (:mod:`mmfl.core.batched`): :meth:`objective` (the batch loss from the
    model's outputs; per sample or its mean), :meth:`references` (frozen models
    whose outputs it reads, MOON's global and previous model) and :meth:`penalty`
    (a term of the parameters, FedProx's proximal term)."""

    # --- the objective, shared by both paths -------------------------------------
    def references(self, msg: Message) -> dict[str, dict[str, Tensor]]:
        """Frozen models the objective reads, by name -> state: ``"global"`` (if used) is the
        received model, the same for every client of a round; any other is the client's own."""
        return {}

    def objective(self, out: dict[str, Tensor], labels: Tensor, ref: Callable[[str], dict | None],
                  reduction: str = "mean") -> Tensor:
        """The loss of one batch from the model's outputs ``out`` (``logits`` [B, C], ...) and
        ``labels`` [B]: per sample ``[B]`` for ``reduction="none"`` (the batched path), their mean
        for ``"mean"`` (the sequential path). ``ref(name)`` is the (detached) output of reference
        model ``name`` on the same inputs, None if the client has none. FedAvg: cross-entropy."""
        return F.cross_entropy(out["logits"], labels, reduction=reduction)

    def penalty(self, params: dict[str, Tensor], anchor: dict[str, Tensor]) -> Tensor | None:
        """A term of the trainable ``params`` (name -> tensor) added to the mean loss, with
        ``anchor`` the received values of the same names; None: none."""
        return None

    def reference_models(self, arrays: dict[str, Tensor]) -> dict[str, torch.nn.Module]:
        """:meth:`references` loaded into pooled models, in eval mode."""
        refs = self.references(Message(arrays=arrays))
        return {name: load_into(self.ctx.model(name), state).eval() for name, state in refs.items()}

    def loss_fn(self, msg: Message | dict[str, Tensor]) -> LossFn:
        """The sequential objective ``(model, inputs, labels) -> scalar`` for the received
        ``msg`` (or its arrays): :meth:`objective` (mean) + :meth:`penalty`."""
        arrays = msg.arrays if isinstance(msg, Message) else msg
        models = self.reference_models(arrays)
        has_penalty = type(self).penalty is not FedAvgClient.penalty

        def loss(model, inputs, labels):
            out = model(inputs)

            @torch.no_grad()
            def ref(name):
                return models[name](inputs) if name in models else None

            value = self.objective(out, labels, ref)
            if not has_penalty:
                return value
            pen = self.penalty({n: p for n, p in model.named_parameters() if p.requires_grad}, arrays)
            return value if pen is None else value + pen

        return loss

    # --- sample-level DP-SGD ([dp] mode = "sample", mmfl.core.dpsgd) ---------------
    @classmethod
    def dpsgd_blocker(cls) -> str | None:
        """Why this client's local training cannot be DP-SGD, or None. DP-SGD replaces the loop by
        per-sample clipped, noised gradients of :meth:`objective` (per sample) plus the gradient of
        :meth:`penalty`; a client that changes training through the other hooks (gradient
        corrections, extra steps, its own loss) would bypass or break that."""
        for klass in cls.__mro__:
            if klass is FedAvgClient:
                return None
            changed = [m for m in ("train", "loss_fn", "loss", "begin", "on_epoch", "before_step", "after_step")
                       if m in vars(klass)]
            if changed:
                return f"{klass.__name__} overrides {', '.join(changed)}"
        return f"{cls.__name__} is not a FedAvg-family client"

    def dpsgd_losses(self, arrays: dict[str, Tensor]) -> tuple[SampleLoss, Penalty | None]:
        """DP-SGD's objective for the received ``arrays``: :meth:`objective` per sample (``[b]``; MOON's
        term reads only the sample's own outputs under the frozen models, so it is per sample too) and
        :meth:`penalty` (None without one), a term of the parameters that reads no data."""
        models = self.reference_models(arrays)

        def sample_loss(model, inputs, labels):
            @torch.no_grad()
            def ref(name):
                return models[name](inputs) if name in models else None

            return self.objective(model(inputs), labels, ref, reduction="none")

        if type(self).penalty is FedAvgClient.penalty:
            return sample_loss, None
        return sample_loss, lambda model: self.penalty(
            {n: p for n, p in model.named_parameters() if p.requires_grad}, arrays)

    def train(self, msg: Message) -> Message:
        dp = self.ctx.dp
        if dp is None or dp.mode != "sample":
            return super().train(msg)
        model = self.load_model(msg)
        self.begin(model, msg)
        sample_loss, penalty = self.dpsgd_losses(msg.arrays)
        # a CPU generator: the same noise on every device
        noise = torch.Generator(device="cpu").manual_seed(derive_seed(self.ctx.seed, "dpsgd-noise"))
        stats = dpsgd_train(model, self.ctx.data, self.ctx.train, dp.clip_norm, dp.noise_multiplier,
                            self.ctx.generator(), noise, sample_loss, penalty)
        # this client's accountant: Opacus's RDP history (z, q, steps), kept in its persistent state
        history = record_steps(read(self.ctx.state, DPSGD_HISTORY, tensor()), dp.noise_multiplier,
                               stats["sample_rate"], stats["steps"])
        write(self.ctx.state, DPSGD_HISTORY, history, tensor())
        if dp.noise_multiplier > 0:  # else inf: not sent (reply scalars are finite), the server knows
            stats["dp/epsilon"] = history_epsilon(history, dp.delta)
        return self.finish(model, msg, stats)

    # --- the reply ---------------------------------------------------------------
    def finish(self, model, msg: Message, stats: dict) -> Message:
        """The reply after local training ended at ``model`` (sequential or batched)."""
        self.after_train(model, msg, stats)
        scalars = {"num_examples": len(self.ctx.data), "train_loss": stats["train_loss"], "steps": stats["steps"]}
        if "dp/epsilon" in stats:  # DP-SGD: this client's epsilon so far, at dp.delta
            scalars["dp/epsilon"] = stats["dp/epsilon"]
        return Message(arrays=state_of(model), scalars=scalars)

    # --- batched training (mmfl.core.batched): the same objective for one client of a stack
    def batched_task(self, route: str, msg: Message) -> BatchedTask | None:
        if route != "train":
            return None
        task = BatchedTask(start=msg.arrays)
        refs = self.references(msg)
        if "global" in refs:
            task.shared["global"] = {k: v.detach() for k, v in refs.pop("global").items()}
        if refs:  # the client's own reference models; clients with other sets train apart
            task.extras["refs"] = refs
        task.group = tuple(sorted(refs)) or None
        if type(self).penalty is not FedAvgClient.penalty:
            names = [n for n, p in self.ctx.model("local").named_parameters() if p.requires_grad]
            task.shared["anchor"] = {n: msg.arrays[n].detach() for n in names}
        return task

    def batched_loss(self, forward, params, inputs, labels, extras, shared) -> Tensor:
        def ref(name):
            state = shared.get(name) if name == "global" else extras.get("refs", {}).get(name)
            return None if state is None else {k: v.detach() if isinstance(v, Tensor) else v
                                               for k, v in forward(state, inputs, False).items()}  # eval mode

        return self.objective(forward(params, inputs), labels, ref, reduction="none")

    def batched_penalty(self, params, extras, shared) -> Tensor | None:
        anchor = shared.get("anchor")
        return None if anchor is None else self.penalty({n: params[n] for n in anchor}, anchor)

    def batched_finish(self, route: str, msg: Message, state: dict[str, Tensor], stats: dict) -> Message:
        return self.finish(load_into(self.ctx.model("local"), state), msg, stats)


register("fedavg", FedAvgParams, FedAvgServer, FedAvgClient,
         help="FedAvg: local SGD, data-size-weighted model averaging (McMahan et al. 2017)")
