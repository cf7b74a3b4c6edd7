"""Mechanism checks (issue 13, item 3): for each method, a fast test on tiny constructed or
real data that fails if what distinguishes the method from its parent is broken. The
inventory of which test checks which method is docs/mechanisms.md; methods whose check
lives elsewhere (SCAFFOLD, MOON, FedCMI, FedOGM, FedMSplit, CreamFL's GCA and server
optimizer, split learning, SOLO, FedFomo, ...) are listed there with their test.

This file: FedAvg and FedProx (McMahan et al. 2017; Li et al. 2020). The other methods' checks
are split by paper family: test_mechanisms_multimodal.py (MFedAvg, MFedProx, FedIoT, MFedProto,
FedPMR), test_mechanisms_distillation.py (reamFL, FedMD, FedET, FedGEMS, CreamFL's weight
sharing), test_mechanisms_partialfl.py (PartialFL), test_mechanisms_personalized.py
(pFedWireless, FedAMP); their shared pieces are tests/mechanism_helpers.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mmfl.algorithms.fedavg import FedAvgClient
from mmfl.algorithms.fedprox import FedProxClient, FedProxParams
from mmfl.data.base import ArrayDataset, DatasetMeta
from mmfl.core.message import Message
from mmfl.core.training import state_of

from helpers import config, experiment
from mechanism_helpers import SGD, ctx_for, float_keys, hand_weighted_mean, spy_replies


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ----------------------------------------------------------------------------- FedAvg / FedProx

DIGITS = ["data.name=digits", "partition.name=quantity_skew", "partition.beta=1.0", "partition.num_clients=3",
          "model.name=mlp", "model.hidden=[16]", "train.local_epochs=1", "train.batch_size=128",
          "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1"]


def test_fedavg_global_model_is_the_data_size_weighted_mean_of_the_replies(tmp_path):
    exp = experiment(config(tmp_path, "avg", base=DIGITS, rounds=1))
    seen = spy_replies(exp)
    exp.run()
    (route, _, replies), = seen
    sizes = {c: len(exp.federation.clients[c]) for c in replies}
    assert route == "train" and len(replies) == 3 and max(sizes.values()) > 1.5 * min(sizes.values())
    cids = sorted(replies)
    new = exp.server.model.state_dict()
    for k in float_keys(new):  # MOON Alg. 1 line 7: sum_k |D^k| / |D| w_k
        hand = hand_weighted_mean([replies[c].arrays[k] for c in cids], [sizes[c] for c in cids])
        assert torch.allclose(new[k].double(), hand, atol=1e-6), k
    # the unweighted mean is a different model (the sizes matter)
    k = float_keys(new)[0]
    plain = hand_weighted_mean([replies[c].arrays[k] for c in cids], [1.0] * 3)
    assert float((plain - new[k].double()).abs().max()) > 1e-4


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3, 2)

    def forward(self, inputs):
        return {"logits": self.fc(inputs["x"])}


def test_fedprox_proximal_gradient_is_mu_times_the_distance_to_the_global_model():
    model = Linear()
    anchor = {k: v + 0.25 * torch.arange(v.numel()).reshape(v.shape) for k, v in state_of(model).items()}
    x, y = {"x": torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]])}, torch.tensor([0, 1])

    def grads(loss_fn):
        model.zero_grad()
        loss_fn(model, x, y).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads(FedAvgClient(None, SimpleNamespace()).loss_fn(anchor))
    mu = 0.3
    prox = grads(FedProxClient(FedProxParams(mu=mu), SimpleNamespace()).loss_fn(anchor))
    for n, p in model.named_parameters():  # d/dw mu/2 ||w - w^t||^2 = mu (w - w^t) (FedProx eq. 2)
        assert torch.allclose(prox[n] - plain[n], mu * (p.detach() - anchor[n]), atol=1e-6), n
    # the batched path's penalty has the same value
    client = FedProxClient(FedProxParams(mu=mu), SimpleNamespace())
    params = dict(model.named_parameters())
    value = client.batched_penalty(params, None, {"anchor": anchor})
    hand = mu / 2 * sum(float(((p.detach() - anchor[n]) ** 2).sum()) for n, p in params.items())
    assert float(value.detach()) == pytest.approx(hand, rel=1e-6)


def test_fedprox_larger_mu_keeps_the_local_model_closer_to_the_global_one():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g)
    data = ArrayDataset({"x": x}, (x[:, 0] + 0.5 * x[:, 1] > 0).long())
    meta = DatasetMeta("lin", 2, {"x": (3,)})
    glob = state_of(Linear())
    dist = {}
    for mu in (0.0, 0.5, 5.0):
        ctx = ctx_for(0, data, meta, SGD, Linear)
        reply = FedProxClient(FedProxParams(mu=mu), ctx).handle("train", Message(arrays=dict(glob)))
        dist[mu] = math.sqrt(sum(float(((reply.arrays[k] - glob[k]) ** 2).sum()) for k in glob))
    assert dist[0.0] > 0.05
    assert dist[0.0] > dist[0.5] > dist[5.0]
    assert dist[5.0] < 0.5 * dist[0.0]
