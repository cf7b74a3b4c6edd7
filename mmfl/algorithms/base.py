"""The shape every algorithm has: a server part and a client part exchanging
:class:`~mmfl.core.message.Message` objects through a transport.

- :class:`Server` configures a round (what each sampled client receives),
  aggregates the replies and evaluates. The common case is the three hooks
  ``configure_train`` / ``aggregate_train`` / ``evaluate``; a multi-phase
  algorithm overrides :meth:`Server.round` and calls ``transport.send`` as
  often as it needs.
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
from mmfl.core.message import Message
from mmfl.core.state import Stateful, module
from mmfl.core.training import evaluate_model, train_at_round


class Transport(Protocol):
    """What a server sees of the clients."""

    num_clients: int

    def send(self, route: str, messages: dict[int, Message]) -> dict[int, Message]:
        """Deliver ``messages[cid]`` to client ``cid`` on ``route``; return the replies.

        Clients that dropped out (or whose reply was rejected) are missing
        from the result.
        """


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

    def model(self, key: str = "local") -> nn.Module:
        return self.model_pool(key)

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed)


class Server(Stateful):
    """Base server: holds the global model; FedAvg-shaped hooks.

    What persists between rounds is declared in ``state_fields`` (see
    :mod:`mmfl.core.state`); ``state_dict``/``load_state_dict`` derive from it.
    """

    state_fields = {"model": module()}

    def __init__(self, params, ctx: ServerContext):
        self.params = params
        self.ctx = ctx
        self.model = ctx.make_model()

    # --- the round ------------------------------------------------------
    def round(self, rnd: int, cohort: list[int], transport: Transport) -> dict[str, float]:
        replies = transport.send("train", self.configure_train(rnd, cohort))
        if not replies:
            return {"clients_replied": 0}
        metrics = self.aggregate_train(rnd, replies)
        metrics.setdefault("clients_replied", len(replies))
        return metrics

    def configure_train(self, rnd: int, cohort: list[int]) -> dict[int, Message]:
        raise NotImplementedError

    def aggregate_train(self, rnd: int, replies: dict[int, Message]) -> dict[str, float]:
        raise NotImplementedError

    # --- evaluation -----------------------------------------------------
    def evaluate(self, rnd: int, test: ArrayDataset, transport: Transport) -> dict[str, float]:
        """Accuracy and loss of the global model on the server's test set."""
        return evaluate_model(self.model, test, num_classes=self.ctx.meta.num_classes)


class Client:
    """Base client: dispatches a message by route to a method of the same name."""

    def __init__(self, params, ctx: ClientContext):
        self.params = params
        self.ctx = ctx

    def handle(self, route: str, msg: Message) -> Message:
        method = getattr(self, route, None)
        if method is None:
            raise RuntimeError(f"{type(self).__name__} has no handler for route {route!r}")
        return method(msg)


@dataclass(frozen=True)
class AlgorithmSpec:
    """What the registry holds for an algorithm."""

    server: type[Server]
    client: type[Client]
    pooled: bool = False  # train on all client data pooled into one client (centralized bound)
