"""FedNova (mmfl/algorithms/fednova.py; Wang et al. 2020): a_i on hand numbers; on a real round with
clients taking different numbers of steps the new model is the paper's update written by hand from
the round's replies (and not FedAvg's average of them: the mechanism is in training); with equal
steps FedNova is FedAvg; streamed equals listed; a bad aggregation rule is one ConfigError."""

from __future__ import annotations

import json

import pytest
import torch

from mmfl.algorithms.fedavg import FedAvgServer
from mmfl.algorithms.fednova import FedNovaServer, normalizer, nova_step
import mmfl.algorithms.capabilities as capabilities_module
from mmfl.config import load_config

from mmfl.errors import ConfigError

from helpers import config, experiment


BASE = ["data.name=digits", "partition.num_clients=3", "model.name=mlp", "model.hidden=[16]",
        'partition.name="dirichlet"', "partition.beta=0.5",  # unequal client sizes: unequal steps
        "train.local_epochs=1", "train.batch_size=32", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1"]


def run(tmp_path, name, *overrides, rounds=1):
    exp = experiment(config(tmp_path, name, *overrides, base=BASE, rounds=rounds))
    start = {k: v.clone() for k, v in exp.server.model.state_dict().items()}
    exp.run()
    return exp, start


def test_normalizer_on_hand_numbers():
    assert normalizer(5) == 5.0 and normalizer(5, 0.0) == 5.0
    # tau = 2, rho = 0.5: (1 - 0.5) / 0.5 + (1 - 0.25) / 0.5 = 1 + 1.5
    assert normalizer(2, 0.5) == pytest.approx(2.5)
    assert normalizer(1, 0.9) == pytest.approx(1.0)  # one step moves lr * g whatever the momentum
    assert normalizer(0) == 1.0


def test_nova_step_on_hand_numbers():
    x = {"w": torch.tensor([0.0]), "n": torch.tensor(1)}
    ys = [{"w": torch.tensor([4.0]), "n": torch.tensor(2)}, {"w": torch.tensor([2.0]), "n": torch.tensor(2)}]
    # p = [0.5, 0.5], a = [4, 1]: d = [-1, -2], tau_eff = 2.5, x - 2.5 * (-1.5) = 3.75 (FedAvg: 3)
    out = nova_step(x, ys, [1.0, 1.0], [4.0, 1.0])
    assert torch.equal(out["w"], torch.tensor([3.75])) and torch.equal(out["n"], torch.tensor(2))
    assert torch.equal(nova_step(x, ys, [1.0, 1.0], [3.0, 3.0])["w"], torch.tensor([3.0]))  # equal a_i: FedAvg


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_real_round_is_the_papers_update_by_hand(tmp_path, monkeypatch, request, momentum):
    seen = {}
    original = FedNovaServer.aggregate_train

    def record(self, rnd, replies):
        seen.update({c: (dict(r.arrays), dict(r.scalars)) for c, r in replies.items()})
        return original(self, rnd, replies)

    monkeypatch.setattr(FedNovaServer, "aggregate_train", record)
    # the patch is an override in the class's own dict: capabilities inferred while it is there
    # (FedNova not streaming) must not outlive the test in the process-wide caches
    request.addfinalizer(lambda: (capabilities_module._cached.cache_clear(), capabilities_module.server_streams.cache_clear()))
    exp, x0 = run(tmp_path, f"nova{momentum}", "algorithm.name=fednova", "stream_aggregation=off",
                  f"train.momentum={momentum}")
    cids = sorted(seen)
    steps = [seen[c][1]["steps"] for c in cids]
    assert len(set(steps)) > 1, steps  # the clients took different numbers of steps
    ys = [{k: v for k, v in seen[c][0].items() if k in x0} for c in cids]
    n = [float(seen[c][1]["num_examples"]) for c in cids]
    a = [normalizer(s, momentum) for s in steps]
    want = nova_step(x0, ys, n, a)
    got = exp.server.model.state_dict()
    fedavg = {k: sum(ni * y[k] for ni, y in zip(n, ys)) / sum(n) for k in want if x0[k].is_floating_point()}
    for k in fedavg:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)
    assert max(float((got[k] - fedavg[k]).abs().max()) for k in fedavg) > 1e-4  # not FedAvg's average


def test_equal_steps_is_fedavg_and_streamed_equals_listed(tmp_path):
    equal = ["train.batch_size=2000", "train.local_epochs=2", "train.momentum=0.9"]  # every client: 2 steps
    avg, _ = run(tmp_path, "avg", *equal, rounds=2)
    nova, _ = run(tmp_path, "nova", "algorithm.name=fednova", *equal, rounds=2)
    for k, t in avg.server.model.state_dict().items():
        torch.testing.assert_close(nova.server.model.state_dict()[k], t, rtol=1e-5, atol=1e-6)
    on, _ = run(tmp_path, "on", "algorithm.name=fednova", "stream_aggregation=on", rounds=2)
    off, _ = run(tmp_path, "off", "algorithm.name=fednova", "stream_aggregation=off", rounds=2)
    rows = [json.loads(x) for x in (on.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["replies_streamed"] for r in rows] == [3, 3] and type(on.server).aggregate is FedAvgServer.aggregate
    for k, t in off.server.model.state_dict().items():
        torch.testing.assert_close(on.server.model.state_dict()[k], t, rtol=1e-5, atol=1e-6)


def test_a_rule_without_the_weights_is_one_config_error():
    with pytest.raises(ConfigError, match="algorithm.aggregation: fednova averages with 'weighted_mean'"):
        load_config(None, ["algorithm.name=fednova", "algorithm.aggregation=median"])
