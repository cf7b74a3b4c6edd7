"""Algorithms: aggregation arithmetic, local objectives on hand numbers, and the
reductions between algorithms (FedProx mu=0, SCAFFOLD round 1, MOON mu=0 and
round 0 all equal FedAvg), SOLO's silence and the centralized pooling."""

from __future__ import annotations

import json
import math

import pytest
import numpy as np
import torch
from torch import nn

from mmfl.algorithms.fedavg import weighted_average, weighted_mean_scalar
from mmfl.algorithms.fedprox import proximal_term
from mmfl.algorithms.moon import l2_representation_loss, model_contrastive_loss
from mmfl.algorithms.scaffold import C, DC, control_variate_update, param_names
from mmfl.data import DATASETS
from mmfl.core.message import Message

from helpers import config as make_cfg, rows as rows_of, run as run_exp, experiment

# Tiny and fast: sklearn digits (1,437 train / 360 test), 3 clients, a 16-unit MLP,
# one local epoch of large batches, one torch thread.


def assert_same_model(a: nn.Module, b: nn.Module, atol: float = 1e-7):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.allclose(sa[k], sb[k], rtol=0, atol=atol), f"{k} differs by {(sa[k] - sb[k]).abs().max()}"


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((a.state_dict()[k] - b.state_dict()[k]).abs().max()) for k in a.state_dict())


# ----------------------------------------------------------------------------- FedAvg arithmetic

def test_weighted_average_is_exact_on_hand_tensors():
    s1 = {"w": torch.tensor([1.0, 2.0, -4.0]), "nbt": torch.tensor(3)}
    s2 = {"w": torch.tensor([5.0, 6.0, 8.0]), "nbt": torch.tensor(7)}
    out = weighted_average([s1, s2], [1.0, 3.0])
    # (1*1 + 3*5)/4 = 4, (1*2 + 3*6)/4 = 5, (1*-4 + 3*8)/4 = 5
    assert torch.equal(out["w"], torch.tensor([4.0, 5.0, 5.0]))
    assert out["w"].dtype == torch.float32
    # integer tensors (BatchNorm's num_batches_tracked) take the max, not the mean
    assert out["nbt"].dtype == torch.int64 and int(out["nbt"]) == 7
    # only the ratio of weights matters
    out2 = weighted_average([s1, s2], [10.0, 30.0])
    assert torch.equal(out2["w"], out["w"])
    with pytest.raises(ValueError):
        weighted_average([s1, s2], [0.0, 0.0])


def test_weighted_mean_scalar_weights_by_num_examples():
    replies = {0: Message(scalars={"num_examples": 1, "train_loss": 2.0}),
               1: Message(scalars={"num_examples": 3, "train_loss": 6.0})}
    assert weighted_mean_scalar(replies, "train_loss") == pytest.approx((1 * 2 + 3 * 6) / 4)
    assert weighted_mean_scalar(replies, "missing") is None


# ----------------------------------------------------------------------------- FedProx

def test_proximal_term_is_sum_of_squared_differences():
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.copy_(torch.tensor([3.0]))
    anchor = {"weight": torch.tensor([[0.0, 4.0]]), "bias": torch.tensor([0.5])}
    # (1-0)^2 + (2-4)^2 + (3-0.5)^2 = 1 + 4 + 6.25
    assert float(proximal_term(model, anchor).detach()) == pytest.approx(11.25, abs=1e-6)
    # frozen parameters are not counted
    model.bias.requires_grad_(False)
    assert float(proximal_term(model, anchor).detach()) == pytest.approx(5.0, abs=1e-6)
    # and its gradient is 2 (w - w^t)
    model.weight.grad = None
    proximal_term(model, anchor).backward()
    assert torch.allclose(model.weight.grad, torch.tensor([[2.0, -4.0]]))


def test_fedprox_with_mu_zero_equals_fedavg(tmp_path):
    avg = run_exp(tmp_path, "avg")
    prox = run_exp(tmp_path, "prox0", "algorithm.name=fedprox", "algorithm.mu=0.0")
    assert_same_model(avg.server.model, prox.server.model)
    # sanity: the comparison can fail (a large mu gives a different model)
    prox1 = run_exp(tmp_path, "prox1", "algorithm.name=fedprox", "algorithm.mu=1.0")
    assert max_diff(avg.server.model, prox1.server.model) > 1e-4


# ----------------------------------------------------------------------------- SCAFFOLD

def test_control_variate_update_hand_numbers():
    c_i = {"w": torch.tensor([1.0, 0.0])}
    c = {"w": torch.tensor([0.5, 0.25])}
    x = {"w": torch.tensor([2.0, 1.0])}
    y = {"w": torch.tensor([1.0, 1.5])}
    out = control_variate_update(c_i, c, x, y, steps=2, lr=0.1)
    # c_i - c + (x - y) / (K lr):  1 - 0.5 + 1/0.2 = 5.5;  0 - 0.25 + (-0.5)/0.2 = -2.75
    assert torch.allclose(out["w"], torch.tensor([5.5, -2.75]))


def test_scaffold_round_one_equals_fedavg_then_variates_move(tmp_path):
    avg = run_exp(tmp_path, "avg", rounds=1)
    sca = run_exp(tmp_path, "sca", "algorithm.name=scaffold", rounds=1)
    # round 1: c = c_i = 0, so the gradient correction c - c_i is zero
    assert_same_model(avg.server.model, sca.server.model)
    # after round 1 the server control variate is non-zero and equals sum_i p_i c_i (every client
    # replied; p_i = data share, as in the model average: algorithm.variate_weights = "data")
    c = sca.server.c
    assert set(c) == set(param_names(sca.server.model))
    assert max(float(v.abs().max()) for v in c.values()) > 0
    assert len(sca.store) == 3
    sizes = [len(d) for d in sca.federation.clients]
    assert len(set(sizes)) > 1  # unequal sizes: weighted and uniform means differ
    for k, v in c.items():
        mean_ci = sum(n * sca.store.load(cid)[C + k] for cid, n in enumerate(sizes)) / sum(sizes)
        assert torch.allclose(v, mean_ci, atol=1e-6)
    # round 2 differs from FedAvg's round 2 (the correction is now active)
    avg2 = run_exp(tmp_path, "avg2", rounds=2)
    sca2 = run_exp(tmp_path, "sca2", "algorithm.name=scaffold", rounds=2)
    assert max_diff(avg2.server.model, sca2.server.model) > 1e-6


def test_scaffold_client_variate_follows_option_two(tmp_path):
    # option II as printed, (x - y) / (K lr); the default's K for momentum: tests/test_scaffold.py
    exp = experiment(make_cfg(tmp_path, "sca-client", "algorithm.name=scaffold", "algorithm.option2=printed"))
    srv, tr = exp.server, exp.transport
    tr.begin_round(0)
    msg = srv.configure_train(0, [1])[1]
    x = {k: v.clone() for k, v in msg.arrays.items() if not k.startswith(C)}
    reply = tr.send("train", {1: msg})[1]
    steps, lr = int(reply.scalars["steps"]), exp.cfg.train.lr
    assert steps > 0
    y = {k: v for k, v in reply.arrays.items() if not k.startswith(DC)}
    names = param_names(srv.model)
    zeros = {k: torch.zeros_like(x[k]) for k in names}
    expected = control_variate_update(zeros, zeros, x, y, steps, lr)  # = (x - y) / (K lr)
    state = exp.store.load(1)
    for k in names:
        assert torch.allclose(state[C + k], (x[k] - y[k]) / (steps * lr), atol=1e-5)
        assert torch.allclose(state[C + k], expected[k], atol=1e-6)
        # the reply carries the change c_i+ - c_i (c_i was 0)
        assert torch.allclose(reply.arrays[DC + k], expected[k], atol=1e-6)
    # only client 1 was trained: the store holds nobody else
    assert len(exp.store) == 1


# ----------------------------------------------------------------------------- MOON

def test_model_contrastive_loss_hand_value():
    z = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    z_glob = torch.tensor([[4.0, 3.0], [1.0, 1.0]])
    z_prev = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])
    tau = 0.5
    # cosines by hand: row 0: sim(z, glob) = 24/25, sim(z, prev) = 4/5
    #                  row 1: sim(z, glob) = 1/sqrt(2), sim(z, prev) = -1
    pos = [24 / 25, 1 / math.sqrt(2)]
    neg = [4 / 5, -1.0]
    per_row = [-math.log(math.exp(p / tau) / (math.exp(p / tau) + math.exp(n / tau))) for p, n in zip(pos, neg)]
    expected = sum(per_row) / 2
    got = float(model_contrastive_loss(z, z_glob, z_prev, tau))
    assert got == pytest.approx(expected, abs=1e-6)
    # log(1 + e^-0.32) = 0.54592 and log(1 + e^-(sqrt(2) + 2)) = 0.03235 -> mean 0.28913
    assert expected == pytest.approx(0.28913, abs=1e-4)  # the number itself, so a typo above shows
    # the term is scale-free in each representation (cosine)
    assert float(model_contrastive_loss(10 * z, z_glob, 0.1 * z_prev, tau)) == pytest.approx(expected, abs=1e-6)
    # no previous model: zero
    zero = model_contrastive_loss(z, z_glob, None, tau)
    assert zero.shape == () and float(zero) == 0.0


def test_l2_representation_loss_hand_value():
    z = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    z_glob = torch.tensor([[3.0, 4.0], [1.0, 1.0]])
    # ||(-3, -4)|| = 5 and 0 -> mean 2.5
    assert float(l2_representation_loss(z, z_glob)) == pytest.approx(2.5)


def test_moon_with_mu_zero_equals_fedavg(tmp_path):
    avg = run_exp(tmp_path, "avg")
    moon = run_exp(tmp_path, "moon0", "algorithm.name=moon", "algorithm.mu=0.0")
    assert_same_model(avg.server.model, moon.server.model)


def test_moon_round_zero_equals_fedavg_then_differs(tmp_path):
    avg = run_exp(tmp_path, "avg", rounds=1)
    moon = run_exp(tmp_path, "moon", "algorithm.name=moon", "algorithm.mu=5.0", rounds=1)
    # round 0: no previous local model, so l_con = 0 and the update is FedAvg's
    assert_same_model(avg.server.model, moon.server.model)
    # every client now keeps its model as "prev/"
    assert len(moon.store) == 3
    assert all(any(k.startswith("prev/") for k in moon.store.load(c)) for c in range(3))
    # from round 1 on the contrastive term acts
    avg2 = run_exp(tmp_path, "avg2", rounds=2)
    moon2 = run_exp(tmp_path, "moon2", "algorithm.name=moon", "algorithm.mu=5.0", rounds=2)
    assert max_diff(avg2.server.model, moon2.server.model) > 1e-6


# ----------------------------------------------------------------------------- SOLO and centralized

def test_solo_moves_no_model_bytes_and_reports_std(tmp_path):
    exp = run_exp(tmp_path, "solo", "algorithm.name=local")
    rows = rows_of(exp)
    assert len(rows) == 2
    for row in rows:
        # train: an empty message down; num_examples + train_loss (2 scalars x 8 bytes) up
        assert row["bytes_by_route"] == {"train": {"down": 0, "up": 3 * 16}}
        assert row["bytes_down"] == 0 and row["bytes_up"] == 3 * 16
        assert all(v == {"down": 0, "up": 16} for v in row["bytes_per_client"].values())
        # evaluation: empty messages down; accuracy, accuracy_top5 (10 classes), test_loss, num_examples up
        assert row["eval_bytes_down"] == 0 and row["eval_bytes_up"] == 3 * 32
        accs = row["client_accuracy"]
        assert len(accs) == 3
        assert row["accuracy"] == pytest.approx(sum(accs) / 3)
        assert row["accuracy_std"] == pytest.approx(float(torch.tensor(accs, dtype=torch.float64).std(unbiased=False)))
    summary = json.loads((exp.run_dir / "summary.json").read_text())
    assert summary["final_accuracy_std"] == rows[-1]["accuracy_std"]
    # each client's own model lives in the store; the server model never moved
    assert len(exp.store) == 3
    fresh = exp.make_model()
    assert_same_model(exp.server.model, fresh, atol=0)
    own = [exp.store.load(c) for c in range(3)]
    assert all(set(o) == {"model/" + k for k in fresh.state_dict()} for o in own)
    # and the clients' models differ from each other and from the initial one
    key = "model/" + next(iter(fresh.state_dict()))
    assert not torch.equal(own[0][key], own[1][key])
    assert not torch.equal(own[0][key], fresh.state_dict()[key[len("model/"):]])


def test_centralized_is_one_client_with_every_sample(tmp_path):
    exp = run_exp(tmp_path, "central", "algorithm.name=centralized", rounds=1)
    fed = exp.federation
    assert fed.num_clients == 1
    train = DATASETS.get("digits").factory(DATASETS.params("digits", {})).train
    assert len(fed.clients[0]) == len(train) == 1438  # digits' stratified 80 % train split of 1,797
    # the whole training split, in order (not just what a partition happened to assign)
    assert np.array_equal(fed.clients[0].label_array(), train.label_array())
    row = rows_of(exp)[0]
    assert row["clients"] == 1 and list(row["bytes_per_client"]) == ["0"]
