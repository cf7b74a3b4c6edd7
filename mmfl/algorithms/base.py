"""The shape every algorithm has: a server part and a client part exchanging
:class:`~mmfl.core.message.Message` objects through a transport.

- :class:`Server` configures a round (what each sampled client receives) and
  aggregates the replies. The common case is the two hooks ``configure_train`` /
  ``aggregate_train``; a multi-phase algorithm overrides :meth:`Server.round` and
  calls ``transport.send`` as often as it needs. It declares its evaluations
  (``evaluations``, one ``evaluate_<kind>(ctx)`` each), which the engine runs with an
  :class:`~mmfl.core.evaluation.EvalContext` (see :mod:`mmfl.core.evaluation`).
- :class:`Client` handles one message with its private data and the
  persistent state the engine loads for it (``ctx.state``), and returns a
  reply. It is rebuilt for every message, so it must keep nothing between
  messages except in ``ctx.state``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
from torch import Tensor, nn

from mmfl.schema import TrainConfig
from mmfl.data.base import ArrayDataset, DatasetMeta
from mmfl.core.evaluation import EvalContext, client_personal_metrics, global_metrics, personalized_metrics
from mmfl.core.message import Message
from mmfl.core.device import CPU
from mmfl.core.replies import ReplySchema, model_schema
from mmfl.core.state import Stateful, module
from mmfl.core.training import LossFn, load_into, local_train, model_tensors, state_of, train_at_round


class TrafficLog(Protocol):
    """A transport's byte count (:class:`mmfl.engine.simulation.CommLog`)."""

    dropped: list[int]  # clients dropped since the last reset (non-finite or missing reply)

    def reset(self) -> None: ...

    def summary(self) -> dict:
        """``bytes_down``, ``bytes_up``, ``bytes_by_route``, ``bytes_per_client``."""


class Transport(Protocol):
    """What the engine and a server see of the clients. The round loop
    (:mod:`mmfl.engine.runner`) uses exactly this, on every transport."""

    num_clients: int
    log: TrafficLog  # bytes since the last ``begin_round`` / ``log.reset()``
    batch_info: dict  # this round's batched-training info for the metrics row ({}: none)
    clients_in_process: bool  # the clients' data is in this process (simulation), not on other machines

    def begin_round(self, rnd: int) -> None:
        """Start round ``rnd`` (0-based): reset the log, the per-round message counters, ``batch_info``."""

    def send(self, route: str, messages: dict[int, Message]) -> dict[int, Message]:
        """Deliver ``messages[cid]`` to client ``cid`` on ``route``; return the replies.

        Clients that dropped out (or whose reply was rejected) are missing
        from the result.
        """

    # optional (streaming aggregation; a transport without it always returns the whole list):
    # def send_stream(self, route, messages, accumulator) -> int | None:
    #     deliver as ``send`` does, but hand each accepted reply to ``accumulator.add(cid, reply)``
    #     as it arrives and keep none; returns how many were added, or None when this transport
    #     does not stream these messages (``run.stream_aggregation``): the caller then uses ``send``.


class ReplyAccumulator(Protocol):
    """A server's consumer of one route's replies, one at a time (streaming aggregation,
    :meth:`Server.train_accumulator`): the transport calls ``begin()`` once, then ``add(cid,
    reply)`` for each accepted reply in client-id order, dropping the reply afterwards; the
    server then calls ``finish()`` for the round's metrics (and sets its new state)."""

    def begin(self) -> None: ...

    def add(self, cid: int, reply: Message) -> None: ...

    def finish(self) -> dict[str, float]: ...


@dataclass
class ServerContext:
    meta: DatasetMeta
    train: TrainConfig
    seed: int
    num_clients: int
    make_model: Callable[[], nn.Module]  # a fresh model, initialised from ``seed``
    client_modalities: list[tuple[str, ...]] | None = None  # what each client holds (None: all, every client)
    public: ArrayDataset | None = None  # the public set known to server and clients (CreamFL), if any
    system: Any = None  # the [system] model (mmfl.core.system.WirelessSystem) for scheduling; None: none
    rounds: int = 0  # the run's rounds (a server's own schedule, e.g. CreamFL's cosine server lr); 0: unknown
    client_groups: list[int | None] | None = None  # each client's [[client_models]] entry (None: all [model])
    client_sources: list[int | None] | None = None  # each client's [[client_data]] entry (None: all the run's data)
    client_model: Callable[[int], nn.Module] | None = None  # client cid's own initial model (its modalities, group, data)
    dp: Any = None  # the run's [dp] (mmfl.schema.DPConfig); None: no differential privacy
    cohort_size: int = 0  # clients sampled per round (central DP's fixed denominator); 0: unknown
    device: torch.device = CPU  # the run's device (mmfl.core.device): create every tensor on it

    def modalities_of(self, cid: int) -> tuple[str, ...]:
        return tuple(self.meta.modalities) if self.client_modalities is None else self.client_modalities[cid]

    def train_at(self, rnd: int) -> TrainConfig:
        """The training settings of round ``rnd`` (lr from ``train.lr_schedule``), as its clients get them."""
        return train_at_round(self.train, rnd)


@dataclass
class ClientContext:
    cid: int
    rnd: int  # 0-based round index
    seed: int  # derived from (run seed, round, cid, route, message index): use for every random choice
    data: ArrayDataset  # the client's private training data
    test_data: ArrayDataset | None  # where the client evaluates a local model
    meta: DatasetMeta
    train: TrainConfig
    state: dict[str, Tensor]  # persistent between rounds; the engine saves it after the reply
    model_pool: Callable[[str], nn.Module]  # reusable model instance per key (load weights before use!)
    init_model: Callable[[], nn.Module] = None  # a fresh model with the run's initial weights
    modalities: tuple[str, ...] = ()  # the modalities this client holds (its data and models carry only these)
    public: ArrayDataset | None = None  # the public set known to server and clients (CreamFL), if any
    extra: dict[str, Any] = field(default_factory=dict)
    dp: Any = None  # the run's [dp] (mmfl.schema.DPConfig); mode "sample": DP-SGD in local training
    device: torch.device = CPU  # the run's device (mmfl.core.device): create every tensor on it

    def model(self, key: str = "local") -> nn.Module:
        return self.model_pool(key)

    def generator(self) -> torch.Generator:
        return torch.Generator(device="cpu").manual_seed(self.seed)  # CPU: the same batches on every device


class Server(Stateful):
    """Base server: holds the global model; FedAvg-shaped hooks.

    What persists between rounds is declared in ``state_fields`` (see
    :mod:`mmfl.core.state`); ``state_dict``/``load_state_dict`` derive from it.
    """

    state_fields = {"model": module()}

    # the evaluations the engine runs after an evaluated round: kind -> prefix of its metrics
    # (mmfl.core.evaluation.KINDS; one ``evaluate_<kind>(ctx)`` method each)
    evaluations: dict[str, str] = {"global": ""}
    # the [algorithm] table under which this family's server trains alone on data of its own (a public
    # set), no client reached: the "server alone" reference of `mmfl run --reference` (mmfl.reference,
    # docs/reference.md); None: its server learns nothing without clients
    alone: dict | None = None

    # True: the clients train a multimodal model's per-modality heads ``heads[m]`` (as the task or as
    # linear probes), so ``accuracy/<m>``, ``uar/<m>`` mean something; False: nobody trains them and
    # the global evaluation leaves them out. A server whose params have ``probe`` follows it.
    trains_modality_heads = False

    # ``[train]`` keys this algorithm's update rule is written for, used where the user's ``[train]``
    # leaves them out (mmfl.config.with_algorithm_defaults): e.g. SCAFFOLD's option II reads the
    # local update as SGD steps of size lr. {}: the run's defaults (Adam, lr 1e-3).
    train_defaults: dict = {}

    # the smallest federation this algorithm runs in, read by what runs every registered algorithm
    # (the suite's per-algorithm runs, scripts/check_reply_schemas.py), so a new algorithm needs no
    # list edited there: "single" (one modality, any model), "multimodal" (a multimodal model, clients
    # holding different modalities), "public" (+ a public paired set and CreamFL's server model,
    # algorithm.server_batch_size), "pair" (a public paired set, no server model), "shareable"
    # (PartialFL's [privacy] table with a shareable modality)
    runs_on: str = "single"

    @classmethod
    def trains_heads(cls, params) -> bool:
        """Whether a run with ``params`` trains ``heads[m]`` (:attr:`trains_modality_heads`, and
        ``params.probe`` where the params have it)."""
        return cls.trains_modality_heads and bool(getattr(params, "probe", True))

    def __init__(self, params, ctx: ServerContext):
        self.params = params
        self.ctx = ctx
        self.model = ctx.make_model()
        self._personal_models: dict[tuple, nn.Module] = {}

    # --- the round ------------------------------------------------------
    def round(self, rnd: int, cohort: list[int], transport: Transport) -> dict[str, float]:
        messages = self.configure_train(rnd, cohort)
        acc = self.train_accumulator(rnd)
        stream = getattr(transport, "send_stream", None) if acc is not None else None
        n = stream("train", messages, acc) if stream is not None else None
        if n is not None:  # streamed: every accepted reply went into acc and is gone
            if n == 0:
                return {"clients_replied": 0}
            metrics = acc.finish()
            metrics.setdefault("clients_replied", n)
            return metrics
        replies = transport.send("train", messages)
        if not replies:
            return {"clients_replied": 0}
        metrics = self.aggregate_train(rnd, replies)
        metrics.setdefault("clients_replied", len(replies))
        return metrics

    def configure_train(self, rnd: int, cohort: list[int]) -> dict[int, Message]:
        raise NotImplementedError

    # --- what replies may hold (checked by the engine before the server sees them) --------
    def reply_schema(self, route: str, cid: int) -> ReplySchema | None:
        """The :class:`~mmfl.core.replies.ReplySchema` of client ``cid``'s reply on ``route``
        (None: not checked beyond NaN/inf). Default: on ``train``, the global model's entries
        that the client's own model has (its modalities' modules), with the server's shapes
        and dtypes, plus :meth:`extra_reply_arrays`, and a positive integer ``num_examples``.
        A server whose replies carry other things declares them here."""
        if route != "train":
            return None
        cache = self.__dict__.setdefault("_reply_schemas", {})
        h = tuple(self.ctx.modalities_of(cid))
        group = self.ctx.client_groups[cid] if self.ctx.client_groups is not None else None
        source = self.ctx.client_sources[cid] if self.ctx.client_sources is not None else None
        if (h, group, source) not in cache:
            if (group is not None or source is not None) and self.ctx.client_model is not None:
                # a [[client_models]] / [[client_data]] client: its own architecture's entries and shapes
                schema = model_schema(self.ctx.client_model(cid).state_dict())
            else:
                keys = None
                if h != tuple(self.ctx.meta.modalities):
                    keys = self.ctx.make_model(h).state_dict().keys()
                schema = model_schema(self.model.state_dict(), keys)
            cache[h, group, source] = schema.merge(self.extra_reply_arrays())
        return cache[h, group, source]

    def extra_reply_arrays(self) -> ReplySchema | None:
        """What a ``train`` reply carries besides model entries (its ``arrays``, ``free`` prefixes
        and ``required`` keys; the counts are the default's). Default: nothing."""
        return None

    def aggregate_train(self, rnd: int, replies: dict[int, Message]) -> dict[str, float]:
        raise NotImplementedError

    def train_accumulator(self, rnd: int) -> ReplyAccumulator | None:
        """What does :meth:`aggregate_train`'s work one ``train`` reply at a time (a
        :class:`ReplyAccumulator`), so the engine need not hold the cohort's replies; None (the
        default): this server needs the whole list. Used where the transport streams
        (``run.stream_aggregation``, :meth:`round`)."""
        return None

    # --- evaluation (run by the engine: mmfl.core.evaluation) -------------
    def evaluate_global(self, ctx: EvalContext) -> dict:
        """Accuracy and loss (per modality too) of the global model on the shared test set."""
        return global_metrics(self.model, ctx.test, self.ctx.meta.num_classes,
                              modality_heads=self.trains_heads(self.params))

    def evaluate_personalized(self, ctx: EvalContext) -> dict:
        """Each client's :meth:`personal_model` on its own test rows."""
        return personalized_metrics(ctx, self.personal_model, self.personal_state)

    def personal_model(self, cid: int) -> nn.Module:
        """Client ``cid``'s model for the personalized evaluation; default: the global model
        restricted to the modalities it holds (one reusable module per modality set)."""
        h = tuple(self.ctx.modalities_of(cid))
        h = None if h == tuple(self.ctx.meta.modalities) else h
        if h not in self._personal_models:
            self._personal_models[h] = self.ctx.make_model(h) if h is not None else self.ctx.make_model()
        model = self._personal_models[h]
        glob = model_tensors(self.model)
        return load_into(model, {k: glob[k] for k in model_tensors(model)})

    def personal_state(self, cid: int) -> dict[str, Tensor] | None:
        """The tensors of :meth:`personal_model` sent to client ``cid`` when it evaluates on its
        own machine (None: the client's own model, kept in its state)."""
        return state_of(self.personal_model(cid))


class Client:
    """Base client: dispatches a message by route to a method of the same name."""

    def __init__(self, params, ctx: ClientContext):
        self.params = params
        self.ctx = ctx

    def evaluate_personal(self, msg: Message) -> Message:
        """The personalized evaluation on this client's own test rows (every client answers it)."""
        return client_personal_metrics(self.ctx, msg)

    def handle(self, route: str, msg: Message) -> Message:
        method = getattr(self, route, None)
        if method is None:
            raise RuntimeError(f"{type(self).__name__} has no handler for route {route!r}")
        return method(msg)


class TrainingClient(Client):
    """A client whose ``train`` route is local training, with the one family of hooks every
    training client (single-modal FedAvg family, multimodal family) overrides::

        train(msg):  model = load_model(msg)
                     begin(model, msg)
                     local_train(model, loss_fn(msg), on_epoch, before_step, after_step)
                     return finish(model, msg, stats)   # calls after_train where it keeps state

    - ``load_model(msg)``: the local model loaded with what the client trains from.
    - ``begin(model, msg)``: before training (SCAFFOLD's c - c_i, FedCMI's temperatures).
    - ``loss_fn(msg)``: the objective ``(model, inputs, labels) -> scalar``; by default
      :meth:`loss` with ``msg``. (The FedAvg family builds it from a loss written once for
      the sequential and the batched path, :class:`~mmfl.algorithms.fedavg.FedAvgClient`.)
    - ``on_epoch(epoch)``, ``before_step()`` (between backward and the optimizer step:
      gradient corrections), ``after_step()`` (after every optimizer step).
    - ``after_train(model, msg, stats)``: update ``ctx.state`` (MOON keeps the model).
    - ``finish(model, msg, stats) -> Message``: the reply.
    """

    def train(self, msg: Message) -> Message:
        model = self.load_model(msg)
        self.begin(model, msg)
        stats = local_train(model, self.ctx.data, self.ctx.train, self.ctx.generator(),
                            loss_fn=self.loss_fn(msg), before_step=self.before_step,
                            after_step=self.after_step, on_epoch=self.on_epoch)
        return self.finish(model, msg, stats)

    def load_model(self, msg: Message) -> nn.Module:
        return load_into(self.ctx.model("local"), msg.arrays)

    def begin(self, model: nn.Module, msg: Message) -> None:
        """Called before local training."""

    def loss_fn(self, msg: Message) -> LossFn:
        return lambda model, inputs, labels: self.loss(model, inputs, labels, msg)

    def loss(self, model: nn.Module, inputs: dict[str, Tensor], labels: Tensor, msg: Message) -> Tensor:
        """The objective on one batch (a scalar)."""
        raise NotImplementedError

    def on_epoch(self, epoch: int) -> None:
        """At the start of each local epoch."""

    def before_step(self) -> None:
        """Between backward and the optimizer step."""

    def after_step(self) -> None:
        """After each optimizer step."""

    def after_train(self, model: nn.Module, msg: Message, stats: dict) -> None:
        """Update ``self.ctx.state`` after local training."""

    def finish(self, model: nn.Module, msg: Message, stats: dict) -> Message:
        """The reply after local training ended at ``model``."""
        raise NotImplementedError


@dataclass(frozen=True)
class AlgorithmSpec:
    """What the registry holds for an algorithm."""

    server: type[Server]
    client: type[Client]
    pooled: bool = False  # train on all client data pooled into one client (centralized bound)
