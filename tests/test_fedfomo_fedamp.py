"""FedFomo (weights eq. 5-6, update eq. 4, epsilon-greedy peers) and FedAMP (attention eq. 5,
cloud models, proximal step): the equations by hand, the multimodal rules (only modules a
client holds travel; distances over the shared modules), end-to-end runs with the
personalized evaluation, and resume = uninterrupted run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmfl.algorithms import ALGORITHMS
from mmfl.algorithms.base import ClientContext
from mmfl.algorithms.fedamp import FedAMPParams, attention_weights, cloud_model, squared_distance
from mmfl.algorithms.fedfomo import (DELTA, PEER, PEERS, WEIGHTS, FedFomoClient, FedFomoParams, affinity_update,
                                     fomo_update, fomo_weights, mean_loss, select_peers, shared_distance,
                                     split_validation)
from mmfl.config import TrainConfig
from mmfl.data.base import ArrayDataset, DatasetMeta
from mmfl.core.message import Message
from mmfl.core.training import load_into, local_train, state_of
from mmfl.errors import ConfigError
from mmfl.models.multimodal import MultimodalModel, branch_of
from mmfl.report import load_metrics

from helpers import experiment, run_config

# ----------------------------------------------------------------------------- FedFomo by hand


def test_fomo_weights_by_hand_clip_and_normalise():
    # L_i(own) = 1.0; peers: better at distance 2, worse at distance 1, better at distance 0.5
    raw, w = fomo_weights(1.0, [0.5, 1.2, 0.8], [2.0, 1.0, 0.5])
    assert raw.tolist() == pytest.approx([0.25, -0.2, 0.4])  # eq. 5
    assert w.tolist() == pytest.approx([0.25 / 0.65, 0.0, 0.4 / 0.65])  # max(0, .) and normalised (eq. 6)
    assert float(w.sum()) == pytest.approx(1.0)
    # every peer worse: all weights 0 (the client keeps its own model)
    raw, w = fomo_weights(1.0, [1.5, 2.0], [1.0, 1.0])
    assert w.tolist() == [0.0, 0.0] and (raw < 0).all()
    # a peer identical to the own model (distance 0) gets 0, not a division by zero
    assert fomo_weights(1.0, [1.0], [0.0])[1].tolist() == [0.0]
    # the affinity row update: signed improvements over |their sum|
    assert affinity_update(torch.tensor([0.25, -0.2, 0.4], dtype=torch.float64)).tolist() == \
        pytest.approx([0.25 / 0.45, -0.2 / 0.45, 0.4 / 0.45])


def test_fomo_update_by_hand_module_wise():
    own = {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.0]), "n": torch.tensor(3)}
    peers = [{"a": torch.tensor([2.0, 0.0])},  # holds only module a
             {"a": torch.tensor([0.0, 4.0]), "b": torch.tensor([3.0]), "n": torch.tensor(9)}]
    new = fomo_update(own, peers, [0.5, 0.25])  # eq. 4
    assert new["a"].tolist() == pytest.approx([1.0, 1.0])  # 0 + .5*(2-0) + .25*(0-0); 0 + .25*4
    assert new["b"].tolist() == pytest.approx([1.5])  # the first peer lacks b: no pull from it
    assert int(new["n"]) == 3  # integer buffers keep the own value
    assert fomo_update(own, peers, [0.0, 0.0])["a"].tolist() == [0.0, 0.0]
    assert shared_distance({"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([5.0])},
                           {"a": torch.tensor([3.0, 4.0])}, ["a", "b"]) == pytest.approx(5.0)


def test_select_peers_epsilon_greedy():
    rng = np.random.default_rng(0)
    assert select_peers(np.array([0.1, 0.9, 0.5]), [3, 5, 7], 2, 0.0, rng) == [5, 7]  # greedy: top affinity
    assert select_peers(np.array([0.1, 0.9, 0.5]), [3, 5, 7], 0, 0.0, rng) == [3, 5, 7]  # M = 0: everyone
    explore = select_peers(np.zeros(5), [0, 1, 2, 3, 4], 3, 1.0, rng)
    assert len(set(explore)) == 3 and set(explore) <= {0, 1, 2, 3, 4}


META = DatasetMeta("tiny", 3, {"a": (4,), "b": (3,)})


def tiny_model(holds=("a", "b")):
    torch.manual_seed(0)
    return MultimodalModel(dict(META.modalities), 3, feat_dim=4, mlp_hidden=[8]).keep_only(list(holds))


def tiny_ctx(holds=("a", "b"), n=40, state=None):
    pool: dict = {}

    def model_pool(key):
        if key not in pool:
            pool[key] = tiny_model(holds)
        return pool[key]

    g = torch.Generator().manual_seed(1)
    feats = {m: torch.randn(n, *META.modalities[m], generator=g) for m in holds}
    data = ArrayDataset(feats, torch.arange(n) % 3)
    return ClientContext(cid=0, rnd=1, seed=5, data=data, test_data=None, meta=META,
                         train=TrainConfig(optimizer="sgd", local_epochs=1, batch_size=8, lr=0.05), state=state or {},
                         model_pool=model_pool, init_model=lambda: tiny_model(holds), modalities=tuple(holds))


def test_fedfomo_client_gives_a_worse_peer_weight_zero_and_sends_only_its_modules():
    params = FedFomoParams(val_fraction=0.25)
    ctx = tiny_ctx(holds=("a",))
    own = state_of(tiny_model(("a",)))
    _, val = split_validation(ctx.data, 0.25, 123)
    # a better peer: the own model trained on the client's validation rows; a worse one: noise
    better = tiny_model(("a",))
    local_train(better, val, TrainConfig(optimizer="sgd", local_epochs=30, batch_size=10, lr=0.1), torch.Generator().manual_seed(0))
    better = state_of(better)
    worse = {k: v + 3.0 * torch.randn_like(v) if v.is_floating_point() else v for k, v in own.items()}
    full_peer = state_of(tiny_model(("a", "b")))  # holds b too: its b modules must be ignored
    assert mean_loss(load_into(tiny_model(("a",)), better), val) < mean_loss(load_into(tiny_model(("a",)), own), val)
    arrays = {**{f"{PEER}4/{k}": v for k, v in better.items()},
              **{f"{PEER}7/{k}": v for k, v in worse.items()},
              **{f"{PEER}9/{k}": v for k, v in full_peer.items()}}
    reply = FedFomoClient(params, ctx).handle("train", Message(arrays=arrays, scalars={"val_seed": 123}))
    assert reply.arrays[PEERS].tolist() == [4, 7, 9]
    w = reply.arrays[WEIGHTS]
    assert float(w[1]) == 0.0  # the worse model: max(0, .) = 0
    assert float(w[0]) > 0 and float(w.sum()) == pytest.approx(1.0)
    assert float(reply.arrays[DELTA][1]) < 0  # and it loses affinity
    assert not any(branch_of(k) == "b" for k in reply.arrays)  # a unimodal client uploads its modules only
    assert reply.scalars["num_examples"] == 30  # trained on the non-validation rows
    assert any(k.startswith("model/") for k in ctx.state)  # it keeps its own model


def test_fedfomo_client_trains_from_the_weighted_combination_of_the_peers_that_help():
    # eq. 4 in the client's round: with a peer that lowers its validation loss the client starts
    # local training from theta_i + sum_j w_j (theta_j - theta_i), so what it sends is nearer that
    # combination than its own model; with no helping peer (all w_j = 0) it starts from its own
    params = FedFomoParams(val_fraction=0.25)
    own = state_of(tiny_model(("a",)))
    _, val = split_validation(tiny_ctx(holds=("a",)).data, 0.25, 123)
    better = tiny_model(("a",))
    local_train(better, val, TrainConfig(optimizer="sgd", local_epochs=30, batch_size=10, lr=0.1), torch.Generator().manual_seed(0))
    better = state_of(better)
    worse = {k: v + 3.0 * torch.randn_like(v) if v.is_floating_point() else v for k, v in own.items()}

    def reply_with(peers):
        arrays = {f"{PEER}{j}/{k}": v for j, state in peers.items() for k, v in state.items()}
        return FedFomoClient(params, tiny_ctx(holds=("a",))).handle("train", Message(arrays=arrays, scalars={"val_seed": 123}))

    helped, alone = reply_with({4: better, 7: worse}), reply_with({7: worse})
    w = helped.arrays[WEIGHTS]
    assert float(w[0]) > 0 and alone.arrays[WEIGHTS].tolist() == [0.0]
    mix = fomo_update(own, [better, worse], w.tolist())
    keys = [k for k, v in own.items() if v.is_floating_point()]

    def dist(a, b):
        return math.sqrt(sum(float(((a[k] - b[k]) ** 2).sum()) for k in keys))

    assert dist(helped.arrays, mix) < dist(helped.arrays, own)  # measured: 2.66 < 3.89
    assert dist(alone.arrays, own) < dist(alone.arrays, mix)


def test_fedfomo_params_validation():
    for bad in ({"num_peers": -1}, {"epsilon": 1.5}, {"epsilon_decay": -0.1}, {"val_fraction": 1.0}):
        with pytest.raises(ConfigError, match="algorithm."):
            FedFomoParams(**bad)


# ----------------------------------------------------------------------------- FedAMP by hand


def test_fedamp_attention_by_hand_rows_sum_to_one():
    self_w, xi, rescaled = attention_weights([0.0, 1.0, 2.0], alpha=0.5, sigma=2.0)
    hand = [0.5 * math.exp(-d / 2.0) / 2.0 for d in (0.0, 1.0, 2.0)]  # alpha * A'(d), A'(x) = e^{-x/s}/s
    assert xi.tolist() == pytest.approx(hand)
    assert self_w == pytest.approx(1.0 - sum(hand)) and not rescaled
    assert self_w + float(xi.sum()) == pytest.approx(1.0)
    assert xi[0] > xi[1] > xi[2]  # closer models attend more
    # alpha * sum A' > 1: the peers' weights are scaled to sum to one, xi_ii = 0
    self_w, xi, rescaled = attention_weights([0.0, 0.0], alpha=2.0, sigma=1.0)
    assert rescaled and self_w == 0.0 and xi.tolist() == pytest.approx([0.5, 0.5])
    # normalized: xi_ii = self_weight, the rest in proportion to A'(d)
    self_w, xi, _ = attention_weights([1.0, 2.0], alpha=1.0, sigma=1.0, mode="normalized", self_weight=0.4)
    e1, e2 = math.exp(-1.0), math.exp(-2.0)
    assert self_w == 0.4 and xi.tolist() == pytest.approx([0.6 * e1 / (e1 + e2), 0.6 * e2 / (e1 + e2)])
    self_w, xi, rescaled = attention_weights([], 1.0, 1.0)  # no peer yet: u_i = w_i
    assert self_w == 1.0 and xi.numel() == 0 and not rescaled


def test_fedamp_cloud_model_by_hand_with_a_missing_module():
    own = {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([2.0]), "n": torch.tensor(1)}
    peers = [{"a": torch.tensor([3.0, 3.0])}, {"a": torch.tensor([5.0, 5.0]), "b": torch.tensor([4.0])}]
    u = cloud_model(own, peers, 0.5, [0.25, 0.25])
    assert u["a"].tolist() == pytest.approx([2.5, 2.5])  # .5*1 + .25*3 + .25*5
    assert u["b"].tolist() == pytest.approx([2.5])  # the peer without b counts as w_i: .5*2 + .25*2 + .25*4
    assert int(u["n"]) == 1
    assert squared_distance(own, peers[1], ["a", "b"]) == pytest.approx(16 + 16 + 4)
    assert squared_distance(own, peers[0], ["a", "b"]) == pytest.approx(8)  # over the shared entries only


def test_fedamp_params_validation():
    for bad in ({"alpha": 0.0}, {"lam": -1.0}, {"sigma": 0.0}, {"self_weight": 1.5}):
        with pytest.raises(ConfigError, match="algorithm."):
            FedAMPParams(**bad)


# ----------------------------------------------------------------------------- end to end


def raw_config(tmp_path, algo, name, rounds=2, **algo_params):
    return {"name": name, "rounds": rounds, "output_dir": str(tmp_path), "threads": 1,
            "data": {"name": "mfeat", "views": ["pix", "fou"]},
            "partition": {"name": "k_classes", "num_clients": 4, "k": 3},
            "modalities": {"name": "mixed"},
            "model": {"name": "multimodal", "feat_dim": 16, "mlp_hidden": [32]},
            "algorithm": {"name": algo, **algo_params}, "train": {"local_epochs": 1, "batch_size": 64}}


def timeless(rows):
    return [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in rows]


def check_personalized(rows, n_clients):
    assert [r["round"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["accuracy"]) and 0.0 <= r["accuracy"] <= 1.0
        assert math.isfinite(r["uar"]) and len(r["client_accuracy"]) == n_clients


@pytest.mark.parametrize("algo", ["fedfomo", "fedamp"])
def test_end_to_end_mixed_modalities_personalized_and_resume(tmp_path, algo):
    assert ALGORITHMS.get(algo).help
    full = experiment(raw_config(tmp_path, algo, "full"))
    holds = full.federation.client_modalities
    assert holds is not None and any(len(h) == 1 for h in holds)  # some clients are unimodal
    full.run()
    rows = load_metrics(full.run_dir)
    check_personalized(rows, 4)
    server = full.server
    assert sorted(server.client_models) == [0, 1, 2, 3]  # one model per client on the server
    for cid, h in enumerate(holds):  # holding only the modules of its modalities
        assert {branch_of(k) for k in server.client_models[cid]} - {None} == set(h)
    # messages carry only the modules the recipient holds
    msgs = server.configure_train(2, [0, 1, 2, 3])
    for cid, msg in msgs.items():
        keys = [k.split("/", 2)[-1] for k in msg.arrays]
        assert {branch_of(k) for k in keys} - {None} <= set(holds[cid])
    if algo == "fedfomo":
        assert rows[1]["fomo_peers"] == 3.0 and "fomo/P" in server.state_dict()
    else:
        assert 0.0 <= rows[1]["amp_self_weight"] <= 1.0
    # resume: one round, then the second from the checkpoint = the uninterrupted run
    run_config(raw_config(tmp_path, algo, "split", rounds=1))
    resumed = run_config(raw_config(tmp_path, algo, "split", rounds=2), resume=True)
    assert timeless(load_metrics(resumed.run_dir)) == timeless(rows)
    a, b = server.state_dict(), resumed.server.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fedamp_attention_rows_over_a_real_federation(tmp_path):
    exp = experiment(raw_config(tmp_path, "fedamp", "rows", rounds=1, attention="normalized",
                                self_weight=0.3))
    exp.run()
    server = exp.server
    for cid in range(4):
        own = server.state_of_client(cid)
        dists = [squared_distance(own, server.client_models[j], server.param_names) for j in range(4) if j != cid]
        self_w, xi, _ = attention_weights(dists, 1.0, 1.0, "normalized", 0.3)
        assert self_w + float(xi.sum()) == pytest.approx(1.0) and self_w == 0.3
        u, s, _ = server.cloud_for(cid)
        assert s == 0.3 and u.keys() == own.keys()
    # the distances sum over the names in float64 in one fixed order (the model's), not a set's, whose
    # order of strings changes with PYTHONHASHSEED: xi then differed in the last bit between processes
    assert server.param_names == [n for n, p in server.model.named_parameters() if p.requires_grad]
