"""Mechanism checks (docs/mechanisms.md) of the public-set distillation family: the
representation aggregation rules of reamFL (+Mean / +Avg / +IoT), FedMD, FedET and FedGEMS, their
local distillation toward the target, and CreamFL's weight-sharing baselines."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from mmfl.algorithms import ALGORITHMS
from mmfl.core.message import Message
from mmfl.models.multimodal import branch_of

from helpers import experiment
from mechanism_helpers import PAIR, exp_client_ctx, float_keys, hand_weighted_mean, pair_model, spy_replies


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ----------------------------------------------------------------------------- reamFL, FedMD, FedET, FedGEMS


def test_representation_aggregation_rules_in_the_server_by_hand():
    """reamFL+Mean / +Avg / +IoT, FedET (variance), FedGEMS (entropy): CreamFLServer.aggregate_reps
    on three clients' image representations (P = 2, d = 3); client 0 holds image and text."""
    from mmfl.algorithms.creamfl import CreamFLParams, CreamFLServer

    reps = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]],
                         [[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]],
                         [[3.0, 0.0, 0.0], [0.0, 0.0, 0.5]]])
    sizes, holds = [2, 3, 5], [("image", "text"), ("image",), ("image",)]
    replies = {c: Message(arrays={"rep/image": reps[c]}, scalars={"num_examples": sizes[c]}) for c in range(3)}
    server = CreamFLServer.__new__(CreamFLServer)
    server.pair = ("image", "text")
    server.ctx = SimpleNamespace(modalities_of=lambda c: holds[c])
    glob = {"image": torch.zeros(2, 3), "text": torch.zeros(2, 3)}

    def agg(rule):
        server.params = ALGORITHMS.params(rule, {}) if rule in ALGORITHMS else CreamFLParams(aggregation=rule)
        return server.aggregate_reps(replies, glob)[0]["image"]

    assert torch.allclose(agg("reamfl_mean"), reps.mean(0))
    assert torch.allclose(agg("reamfl_avg"), (2 * reps[0] + 3 * reps[1] + 5 * reps[2]) / 10)
    assert torch.allclose(agg("reamfl_iot"), (100 * 2 * reps[0] + 3 * reps[1] + 5 * reps[2]) / 208)
    # FedET: per sample, each client's share of the representation variance (unbiased, over d)
    var = torch.tensor([[1 / 3, 4 / 3], [1 / 3, 0.0], [3.0, 1 / 12]])
    w = var / var.sum(0)
    assert torch.allclose(agg("fedet"), (w[:, :, None] * reps).sum(0), atol=1e-6)
    assert float(w[2, 0]) > 0.8  # the most confident (highest-variance) client dominates sample 0
    # FedGEMS: per sample, the clients at or below the mean entropy of softmax(rep), uniformly
    h = -(reps.softmax(-1) * reps.softmax(-1).log()).sum(-1)  # [3, 2]
    keep = (h <= h.mean(0)).double()
    assert keep[:, 0].tolist() == [0.0, 0.0, 1.0] and keep[:, 1].tolist() == [1.0, 0.0, 0.0]
    assert torch.allclose(agg("fedgems"), torch.stack([reps[2, 0], reps[0, 1]]))
    assert torch.equal(agg("fedmd"), agg("reamfl_mean"))  # FedMD's consensus is the mean


@pytest.fixture(scope="module")
def pair_exp(tmp_path_factory):
    """mfeat_pair with a public share (CreamFL's family); clients 0-1 image+features, 2 image, 3 features."""
    raw = {**PAIR, "output_dir": str(tmp_path_factory.mktemp("pair")), "algorithm": {"name": "fedmd"}}
    return experiment(raw)


@pytest.mark.parametrize("name, route", [("fedmd", "consensus/"), ("fedet", "global/"), ("fedgems", "global/")])
def test_local_distillation_pulls_the_clients_public_representations_toward_the_target(pair_exp, name, route):
    """FedMD's digest (toward last round's consensus) and FedET/FedGEMS's local distillation
    (toward the server's global representations) before private training: the client's
    representations of the public set end closer (MSE) to the target than without it."""
    from mmfl.algorithms.creamfl_terms import public_reps

    public = pair_exp.federation.public
    cid = 0
    start = public_reps(exp_client_ctx(pair_exp, cid).init_model(), public, ["image", "features"])
    # the target: what another model of the same architecture represents
    target = public_reps(pair_model(pair_exp.federation.meta, 123), public, ["image", "features"])
    mse = {}
    for weight in (0.0, 1.0):
        params = ALGORITHMS.params(name, {"local_distill_weight": weight})
        ctx = exp_client_ctx(pair_exp, cid)
        reply = ALGORITHMS.get(name).factory.client(params, ctx).handle(
            "train", Message(arrays={route + m: t for m, t in target.items()}))
        mse[weight] = sum(float(F.mse_loss(reply.arrays["rep/" + m], target[m])) for m in target)
    before = sum(float(F.mse_loss(start[m], target[m])) for m in target)
    # measured (all three): 0.413 at the start, 0.426 after private training alone, 0.218 with it
    assert mse[1.0] < 0.7 * mse[0.0] and mse[1.0] < 0.7 * before


@pytest.mark.parametrize("name, iot", [("creamfl_fedavg", 1.0), ("creamfl_fediot", 100.0)])
def test_weight_sharing_server_model_is_the_iot_weighted_average_of_the_held_modules(tmp_path, name, iot):
    raw = {**PAIR, "name": name, "output_dir": str(tmp_path), "algorithm": {"name": name}}
    exp = experiment(raw)
    fed = exp.federation
    before = {k: v.clone() for k, v in exp.server.model.state_dict().items()}
    seen = spy_replies(exp)
    exp.run()
    (_, _, replies), = seen
    cids = sorted(replies)
    new = exp.server.model.state_dict()
    multimodal_clients = [c for c in cids if set(fed.modalities_of(c)) == {"image", "features"}]
    assert multimodal_clients == [0, 1]
    for k in float_keys(new):
        holders = [c for c in cids if k in replies[c].arrays]
        if not k.startswith(("encoders.", "proj.")):  # heads, ...: stay on the clients
            assert not holders and torch.equal(new[k], before[k]), k
            continue
        assert holders == [c for c in cids if branch_of(k) in fed.modalities_of(c)], k
        weights = [len(fed.clients[c]) * (iot if c in multimodal_clients else 1.0) for c in holders]
        hand = hand_weighted_mean([replies[c].arrays[k] for c in holders], weights)
        assert torch.allclose(new[k].double(), hand, atol=1e-6), k
