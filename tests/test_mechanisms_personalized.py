"""Mechanism checks (docs/mechanisms.md) of the personalized methods: pFedWireless's coefficient
update (eq. 6-7) and FedAMP's proximal step around the cloud model (eq. 6)."""

from __future__ import annotations

import math

import pytest
import torch

from mmfl.algorithms.base import ServerContext
from mmfl.config import TrainConfig
from mmfl.data.base import ArrayDataset, DatasetMeta
from mmfl.core.message import Message
from mmfl.core.training import state_of
from mmfl.models.multimodal import MultimodalParams, multimodal

from mechanism_helpers import META, SGD, ctx_for, tiny_mm, tiny_mm_data


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ----------------------------------------------------------------------------- pfedwireless


class LoopTransport:
    """Runs each message on its client in this process; the clients' states persist."""

    def __init__(self, client_cls, params, data, train, make_model):
        self.client_cls, self.params, self.data = client_cls, params, data
        self.train, self.make_model = train, make_model
        self.num_clients = len(data)
        self.states = {c: {} for c in range(len(data))}
        self.rnd = 0

    def send(self, route, messages):
        out = {}
        for c, msg in messages.items():
            ctx = ctx_for(c, self.data[c], META, self.train, self.make_model, state=self.states[c], rnd=self.rnd,
                          seed=1000 * self.rnd + c)
            out[c] = self.client_cls(self.params, ctx).handle(route, msg)
        return out


def test_pfedwireless_coefficients_move_toward_devices_with_the_same_label_distribution():
    """Devices 0, 1 hold classes {0, 1}, devices 2, 3 classes {2, 3}. Every device uploads every
    group each round (k_hat = 1); with a large eta_hat, eq. 6-7 raise xi~_{k,k'} for the
    devices k' of k's own group (their updates lower F_k) and lower it for the others."""
    from mmfl.algorithms.pfedwireless import PFedWirelessClient, PFedWirelessParams, PFedWirelessServer
    from mmfl.algorithms.pfedwireless_math import SHARED, softmax_rows

    def data(classes, seed):
        g = torch.Generator().manual_seed(seed)
        centres = 2 * torch.randn(4, 4, generator=torch.Generator().manual_seed(99))
        y = torch.tensor(classes).repeat(24)
        return ArrayDataset({"a": centres[y] + torch.randn(48, 4, generator=g),
                             "b": centres[y, :3] + torch.randn(48, 3, generator=g)}, y)

    meta = DatasetMeta("groups", 4, META.modalities)

    def make_model():
        torch.manual_seed(0)
        return multimodal(MultimodalParams(feat_dim=4, mlp_hidden=[8]), meta)

    train = TrainConfig(optimizer="sgd", local_epochs=1, batch_size=16, lr=0.05, momentum=0.0, weight_decay=0.0)
    params = PFedWirelessParams(eta_hat=100.0, k_hat=1.0, a_th=0)
    server = PFedWirelessServer(params, ServerContext(meta, train, 0, 4, make_model))
    loop = LoopTransport(PFedWirelessClient, params, [data([0, 1], 1), data([0, 1], 2), data([2, 3], 3),
                                                       data([2, 3], 4)], train, make_model)
    for rnd in range(3):
        loop.rnd = rnd
        metrics = server.round(rnd, [0, 1, 2, 3], loop)
    assert metrics["xi_rows_updated"] == 4 * 3  # every row of every group stepped (rounds 1 and 2)
    group = [0, 0, 1, 1]
    margins = {}
    for g in ("a", "b", SHARED):
        xi = softmax_rows(server.xi[g])
        for k in range(4):
            same = sum(float(xi[k, j]) for j in range(4) if group[j] == group[k])
            margins[g, k] = same - (1 - same)
    # measured (own group's share minus the other's): a 0.12-0.40, b 0.26-0.99, shared 0.97-1.0
    assert all(v > 0 for v in margins.values())
    assert min(margins[SHARED, k] for k in range(4)) > 0.2


# ----------------------------------------------------------------------------- FedAMP


def test_fedamp_proximal_step_keeps_the_model_closer_to_its_cloud_model():
    """Eq. 6: the client minimises F_i(w) + lambda / (2 alpha) ||w - u_i||^2 from its own model;
    a larger lambda ends nearer the cloud model u_i it received."""
    from mmfl.algorithms.fedamp import FedAMPClient, FedAMPParams

    data = tiny_mm_data(48)
    own = state_of(tiny_mm())
    g = torch.Generator().manual_seed(2)
    cloud = {k: v + 0.3 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in own.items()}
    names = [n for n, _ in tiny_mm().named_parameters() if not n.startswith("heads.")]
    dist = {}
    for lam in (0.0, 1.0, 10.0):
        ctx = ctx_for(0, data, META, SGD, tiny_mm)
        reply = FedAMPClient(FedAMPParams(lam=lam, alpha=1.0), ctx).handle("train", Message(arrays=dict(cloud)))
        dist[lam] = math.sqrt(sum(float(((reply.arrays[k] - cloud[k]) ** 2).sum()) for k in names))
        assert any(k.startswith("model/") for k in ctx.state)  # start = own: the client keeps its model
    start = math.sqrt(sum(float(((own[k] - cloud[k]) ** 2).sum()) for k in names))
    # measured: 4.55 at the start; 4.56 (lambda 0), 3.35 (1), 0.13 (10)
    assert dist[0.0] > dist[1.0] > dist[10.0] and dist[10.0] < 0.5 * start
