"""Shared pieces of the mechanism checks (tests/test_mechanisms*.py): a spy on what the server
exchanges, the weighted mean written out, client contexts over tiny data or an experiment's
federation, a tiny two-modality problem, and the small mfeat_pair federation (PAIR)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmfl.algorithms.base import ClientContext
from mmfl.config import TrainConfig
from mmfl.data.base import ArrayDataset, DatasetMeta
from mmfl.core.message import Message
from mmfl.engine.runner import Experiment
from mmfl.models.multimodal import MultimodalModel, MultimodalParams, multimodal


def spy_replies(exp: Experiment) -> list[tuple[str, dict[int, Message], dict[int, Message]]]:
    """Record every ``(route, messages, replies)`` the server exchanges through the transport."""
    seen = []
    send = exp.transport.send

    def spy(route, messages):
        replies = send(route, messages)
        seen.append((route, messages, replies))
        return replies

    exp.transport.send = spy
    return seen


def hand_weighted_mean(values: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """sum_c w_c v_c / sum_c w_c in float64, written out."""
    total = sum(weights)
    acc = torch.zeros_like(values[0], dtype=torch.float64)
    for v, w in zip(values, weights):
        acc = acc + v.double() * (w / total)
    return acc


def ctx_for(cid, data, meta, train, make_model, holds=None, state=None, public=None, rnd=0, seed=7) -> ClientContext:
    """A client context over ``data``; ``ctx.model(key)`` is one model per key (built by ``make_model``)."""
    pool: dict = {}

    def model_pool(key):
        if key not in pool:
            pool[key] = make_model()
        return pool[key]

    return ClientContext(cid=cid, rnd=rnd, seed=seed, data=data, test_data=None, meta=meta, train=train,
                         state={} if state is None else state, model_pool=model_pool, init_model=make_model,
                         modalities=tuple(holds or meta.modalities), public=public)


def exp_client_ctx(exp: Experiment, cid: int, rnd: int = 0) -> ClientContext:
    """Client ``cid`` of an experiment's federation, its model built as the engine builds it."""
    fed = exp.federation
    holds = tuple(fed.modalities_of(cid))
    return ctx_for(cid, fed.clients[cid], fed.meta, exp.cfg.train, lambda: exp.make_model(holds), holds=holds,
                   public=fed.public, rnd=rnd)


def float_keys(sd: dict) -> list[str]:
    return [k for k, v in sd.items() if v.is_floating_point()]


SGD = TrainConfig(optimizer="sgd", local_epochs=2, batch_size=16, lr=0.05, momentum=0.0, weight_decay=0.0)

# a tiny two-modality, three-class problem: the class shifts the mean of both modalities
META = DatasetMeta("tiny", 3, {"a": (4,), "b": (3,)})


def tiny_mm(holds=("a", "b"), feat_dim=4) -> MultimodalModel:
    torch.manual_seed(0)
    return multimodal(MultimodalParams(feat_dim=feat_dim, mlp_hidden=[8]), META, list(holds))


def tiny_mm_data(n=48, holds=("a", "b"), seed=1) -> ArrayDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    feats = {m: 1.5 * F.one_hot(y, META.modalities[m][0]).float() + torch.randn(n, *META.modalities[m], generator=g)
             for m in holds}
    return ArrayDataset(feats, y)


PAIR = {"name": "pair", "rounds": 1, "seed": 0, "threads": 1,
        "data": {"name": "mfeat_pair", "public_fraction": 0.3}, "partition": {"name": "iid", "num_clients": 4},
        "modalities": {"name": "explicit",
                       "holds": [["image", "features"], ["image", "features"], ["image"], ["features"]]},
        "model": {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16]},
        "train": {"local_epochs": 1, "batch_size": 64, "optimizer": "adam", "lr": 0.003}}


def pair_model(meta, seed: int) -> MultimodalModel:
    """A model of PAIR's architecture, initialised from torch seed ``seed``."""
    torch.manual_seed(seed)
    return multimodal(MultimodalParams(**{k: PAIR["model"][k] for k in ("feat_dim", "cnn_channels", "mlp_hidden")}),
                      meta)
