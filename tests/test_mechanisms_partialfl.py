"""Mechanism checks (docs/mechanisms.md) of PartialFL (eq. 1-4): the alignment of the private and
local embeddings toward the server's, beta = 0 as pfl_fedavg, the proximal variant, and the
centralized baseline on the pooled data."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mmfl.algorithms import ALGORITHMS
from mmfl.core.message import Message
from mmfl.core.training import load_into, state_of
from mmfl.models.multimodal import branch_of

from helpers import experiment
from mechanism_helpers import PAIR, exp_client_ctx, pair_model


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ----------------------------------------------------------------------------- PartialFL


@pytest.fixture(scope="module")
def pfl_exp(tmp_path_factory):
    """mfeat_pair: the image private, the features shareable; 3 clients holding both."""
    raw = {**PAIR, "name": "pfl", "output_dir": str(tmp_path_factory.mktemp("pfl")),
           "partition": {"name": "iid", "num_clients": 3}, "modalities": {"name": "all"},
           "algorithm": {"name": "partialfl", "shareable": "features"}}
    return experiment(raw)


def _pfl_train(exp, name, **params):
    """One PartialFL client round of client 0 from the server's initial F_g and F_s, and a local
    model F_k initialised apart from F_s (another seed): the reply, the message (z_T = F_s's
    normalised embeddings of the client's shareable rows) and the client's data."""
    from mmfl.algorithms.partialfl import LOCAL, ZT, PartialFLClient, global_keys

    server, fed = exp.server, exp.federation
    ctx = exp_client_ctx(exp, 0)
    ctx.state.update({LOCAL + k: v for k, v in state_of(pair_model(fed.meta, 321)).items()})
    feats, _ = ctx.data.get()
    p = ALGORITHMS.params(name, {"shareable": "features", **params})
    arrays = {k: server.model.state_dict()[k] for k in global_keys(server.model, "image", "private",
                                                                     fed.modalities_of(0))}
    if p.align:
        arrays[ZT] = server.server_embeddings(feats["features"])
    msg = Message(arrays=arrays)
    return PartialFLClient(p, ctx).handle("train", msg), msg, feats


def test_partialfl_alignment_pulls_private_and_local_embeddings_toward_the_servers(pfl_exp):
    """Eq. 3 (F_g's private embedding z_A against the server's z_T of the same sample) and eq. 4
    (the local model's z'_T against z_T): with beta > 0 both end closer (cosine) to z_T."""
    from mmfl.algorithms.partialfl import ZPRIME, ZT, branch_embed

    cos_a, cos_l = {}, {}
    for beta in (0.0, 1.0):
        reply, msg, feats = _pfl_train(pfl_exp, "partialfl", beta=beta)
        zt = msg.arrays[ZT]
        gmodel = load_into(pfl_exp.make_model(("image", "features")), {
            **pfl_exp.server.model.state_dict(), **{k: v for k, v in reply.arrays.items() if k != ZPRIME}})
        gmodel.eval()
        with torch.no_grad():
            za = F.normalize(branch_embed(gmodel, "image", feats["image"]), dim=-1)
        cos_a[beta] = float((za * zt).sum(-1).mean())
        cos_l[beta] = float((reply.arrays[ZPRIME] * zt).sum(-1).mean())
    # measured: z_A . z_T 0.20 -> 0.47, z'_T . z_T 0.18 -> 0.39
    assert cos_a[1.0] > cos_a[0.0] + 0.1
    assert cos_l[1.0] > cos_l[0.0] + 0.1


def test_partialfl_with_beta_zero_trains_the_global_model_as_pfl_fedavg(pfl_exp):
    """beta = 0: the alignment terms vanish and F_g is exactly the FedAvg baseline's (pfl_fedavg,
    whose clients get no z_T and send nothing of the shareable modality)."""
    from mmfl.algorithms.partialfl import ZPRIME

    base, msg, _ = _pfl_train(pfl_exp, "pfl_fedavg")
    assert "zt" not in msg.arrays and ZPRIME not in base.arrays
    assert not any(branch_of(k) == "features" for k in base.arrays)
    zero, _, _ = _pfl_train(pfl_exp, "partialfl", beta=0.0)
    keys = [k for k in zero.arrays if k != ZPRIME]
    assert sorted(keys) == sorted(base.arrays)
    assert all(torch.equal(zero.arrays[k], base.arrays[k]) for k in keys)
    aligned, _, _ = _pfl_train(pfl_exp, "partialfl", beta=1.0)
    assert any(not torch.equal(aligned.arrays[k], base.arrays[k]) for k in keys)


def test_partialfl_prox_keeps_the_global_model_closer_to_the_servers(pfl_exp):
    from mmfl.algorithms.partialfl import ZPRIME

    params = {n for n, _ in pfl_exp.server.model.named_parameters()}  # not BatchNorm's running statistics
    dist = {}
    for name, mu in (("pfl_fedavg", 0.0), ("pfl_fedprox", 1.0), ("partialfl_prox", 1.0)):
        reply, msg, _ = _pfl_train(pfl_exp, name, mu=mu)
        dist[name] = math.sqrt(sum(float(((reply.arrays[k] - msg.arrays[k]) ** 2).sum())
                                   for k in reply.arrays if k in params))
    # measured: 0.377 (mu = 0), 0.153 (pfl_fedprox), 0.190 (partialfl_prox: with the alignment terms)
    assert dist["pfl_fedprox"] < 0.6 * dist["pfl_fedavg"] and dist["partialfl_prox"] < 0.6 * dist["pfl_fedavg"]


def test_pfl_centralized_trains_the_global_model_on_every_clients_data_pooled(pfl_exp, tmp_path):
    raw = {**PAIR, "name": "pooled", "output_dir": str(tmp_path), "partition": {"name": "iid", "num_clients": 3},
           "modalities": {"name": "all"}, "algorithm": {"name": "pfl_centralized", "shareable": "features"}}
    pooled = experiment(raw)
    fed, parts = pooled.federation, pfl_exp.federation
    assert fed.num_clients == 1 and pooled.server.fs is None  # no server model, no alignment
    assert len(fed.clients[0]) == sum(len(c) for c in parts.clients)
    labels = torch.cat([torch.as_tensor(c.label_array()) for c in parts.clients]).sort().values
    assert torch.equal(torch.as_tensor(fed.clients[0].label_array()).sort().values, labels)
