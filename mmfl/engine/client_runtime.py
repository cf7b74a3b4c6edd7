"""Running one client message: the code every transport shares.

The in-process :class:`~mmfl.engine.simulation.SimulationTransport` and the
Flower ``ClientApp`` (:mod:`mmfl.flower.client_app`) both deliver a message by
calling :func:`run_client`, so a client computes the same reply, from the same
seed, on either transport. The caller owns what differs: where the client's
data, model pool and persistent state come from, and where the new state goes
(the engine's store in simulation, Flower's ``context.state`` on a SuperNode).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from mmfl.algorithms.base import AlgorithmSpec, ClientContext
from mmfl.schema import TrainConfig
from mmfl.data.base import ArrayDataset, DatasetMeta
from mmfl.core.device import CPU, fp32_message
from mmfl.core.message import Message
from mmfl.core.training import seed_torch, train_at_round
from mmfl.seeds import derive_seed


class ModelPool:
    """Reusable model instances, one per (key, client structure); every transport keeps one.

    ``pool(key)`` is a model of the run's default structure; ``pool(key, holds, group,
    source, meta)`` one for a client holding only ``holds``, built from ``[[client_models]]``
    entry ``group`` and, for a ``[[client_data]]`` client (``source``), for its data set's
    ``meta``. Callers load weights before use.
    """

    def __init__(self, make_model: Callable[..., nn.Module]):
        self.make_model = make_model
        self.models: dict[str, nn.Module] = {}

    def __call__(self, key: str, holds: tuple[str, ...] | None = None, group: int | None = None,
                 source: int | None = None, meta=None) -> nn.Module:
        k = key if holds is None and group is None and source is None else \
            f"{key}|{'+'.join(holds or ())}|{group}|{source}"
        if k not in self.models:
            self.models[k] = self.make_model(holds, group, meta if source is not None else None)
        return self.models[k]


def run_client(
    spec: AlgorithmSpec,
    params,
    *,
    cid: int,
    rnd: int,
    route: str,
    call: int,
    msg: Message,
    data: ArrayDataset,
    test_data: ArrayDataset | None,
    meta: DatasetMeta,
    train: TrainConfig,
    seed: int,
    state: dict[str, Tensor],
    model_pool: Callable[..., nn.Module],
    init_model: Callable[..., nn.Module],
    holds: tuple[str, ...] | None = None,
    group: int | None = None,
    source: int | None = None,
    public: ArrayDataset | None = None,
    privacy=None,
    attack=None,
    dp=None,
    device: torch.device = CPU,
) -> tuple[Message, dict[str, Tensor]]:
    """Deliver ``msg`` on ``route`` to client ``cid``; return ``(reply, new_state)``.

    ``seed`` is the run seed; the client's seed is derived from it and the
    message's coordinates (round, client, route, ``call`` = how many messages
    this client already received this round), so it does not depend on the
    transport or on which process runs the client. The caller decides whether
    to keep ``new_state`` (neither transport keeps it for a rejected reply).

    ``holds``: the modalities this client holds (None: all of ``meta.modalities``).
    For a client holding fewer, models come from ``model_pool(key, holds)`` and
    ``init_model(holds)``, which build only those modalities' modules. ``group``: the
    client's ``[[client_models]]`` entry (its own architecture), passed on the same way;
    ``source``: its ``[[client_data]]`` data set (then ``meta`` is that data set's).
    ``public``: the public set every client may read (CreamFL), or None.
    ``privacy``: the run's :class:`~mmfl.engine.privacy.PrivacyChecker` (None: no
    ``[privacy]`` rules); the reply is checked against ``data`` before it is returned,
    i.e. before it leaves the client, and a breach raises
    :class:`~mmfl.engine.privacy.PrivacyError`.
    ``attack``: the run's :class:`~mmfl.engine.attack.Attack` (None: none); a malicious
    client trains on its attacked data view and sends its attacked reply.
    ``dp``: the run's ``[dp]`` (None: none); ``mode = "sample"`` makes the client train with DP-SGD.
    ``device``: the run's device (``ctx.device``; the caller has put data, state and message there).
    Arrays autocast left in bfloat16 (``precision = "bf16"``) are returned as fp32, so a reply's
    schema and bytes do not depend on the precision.
    """

    everything = tuple(meta.modalities)
    held = tuple(holds) if holds is not None else everything
    if held != everything or group is not None or source is not None:
        h = held if held != everything else None
        pool = lambda key: model_pool(key, h, group, source, meta)  # noqa: E731
        init = lambda: init_model(h, group, meta if source is not None else None)  # noqa: E731
    else:
        pool, init = model_pool, init_model
    if attack is not None:
        data = attack.training_data(cid, data, meta.num_classes)
    ctx = ClientContext(
        cid=cid, rnd=rnd, seed=derive_seed(seed, rnd, cid, route, call),
        data=data, test_data=test_data, meta=meta, train=train_at_round(train, rnd),
        state=state, model_pool=pool, init_model=init, modalities=held, public=public, dp=dp, device=device,
    )
    seed_torch(ctx.seed)  # dropout and any other torch-global randomness (the CPU generator, cheaply)
    reply = spec.client(params, ctx).handle(route, msg)
    if isinstance(reply, Message):
        reply = fp32_message(reply)
    if attack is not None:
        reply = attack.reply(cid, route, msg, reply, ctx.seed)
    if privacy is not None:
        privacy.check(reply, data, cid=cid, route=route, num_classes=meta.num_classes)
    return reply, ctx.state
