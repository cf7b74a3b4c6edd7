"""FedAdagrad, FedYogi, FedAdam (mmfl/algorithms/fedadaptive.py; Reddi et al. 2021, Alg. 2): the
server step on hand numbers; on a real round the trained model is the by-hand step from the round's
FedAvg aggregate (and not that aggregate: the mechanism is in training); FedAdagrad with beta1 = 0
and eta = 2 tau -> inf is FedAvg; the streamed run equals the listed one; a resumed run continues
m and v bit for bit."""

from __future__ import annotations

import json

import pytest
import torch

from mmfl.algorithms.fedadaptive import adaptive_step
from mmfl.config import load_config

from mmfl.errors import ConfigError

from helpers import config, experiment


BASE = ["data.name=digits", "partition.num_clients=3", "model.name=mlp", "model.hidden=[16]",
        "train.local_epochs=1", "train.batch_size=128", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1"]


def run(tmp_path, name, *overrides, rounds=1, resume=False):
    exp = experiment(config(tmp_path, name, *overrides, base=BASE, rounds=rounds))
    start = {k: v.clone() for k, v in exp.server.model.state_dict().items()}
    exp.run(resume=resume)
    return exp, start


def test_the_three_second_moments_on_hand_numbers():
    x, avg = {"a": torch.tensor([1.0, 1.0]), "n": torch.tensor(2)}, {"a": torch.tensor([3.0, 1.0]), "n": torch.tensor(4)}
    # Delta = [2, 0]; m = 0.5 Delta = [1, 0]; v_{-1} = tau^2 = 1
    m0, v0 = {}, {}
    out = {var: adaptive_step(var, x, avg, m0, v0, lr=1.0, beta1=0.5, beta2=0.75, tau=1.0) for var in
           ("adagrad", "yogi", "adam")}
    assert torch.equal(out["adagrad"][2]["a"], torch.tensor([5.0, 1.0]))  # 1 + 4
    assert torch.equal(out["yogi"][2]["a"], torch.tensor([2.0, 1.0]))     # 1 - 0.25 * 4 * sign(1 - 4); 1 - 0
    assert torch.equal(out["adam"][2]["a"], torch.tensor([1.75, 0.75]))   # 0.75 + 0.25 * 4; 0.75 * 1 + 0
    for var, (new_x, new_m, new_v) in out.items():
        assert torch.equal(new_m["a"], torch.tensor([1.0, 0.0]))
        assert torch.allclose(new_x["a"], torch.tensor([1.0, 1.0]) + new_m["a"] / (new_v["a"].sqrt() + 1.0)), var
        assert torch.equal(new_x["n"], torch.tensor(4)) and "n" not in new_m  # integer entries pass through
    # a second step reads m_{t-1}: m = 0.5 [1, 0] + 0.5 [2, 0] = [1.5, 0] with the same Delta from x = [1, 1]
    _, m2, v2 = adaptive_step("yogi", x, avg, out["yogi"][1], out["yogi"][2], lr=1.0, beta1=0.5, beta2=0.75, tau=1.0)
    assert torch.equal(m2["a"], torch.tensor([1.5, 0.0]))
    assert torch.equal(v2["a"], torch.tensor([3.0, 1.0]))  # 2 - 0.25 * 4 * sign(2 - 4)


@pytest.mark.parametrize("variant", ["fedadagrad", "fedyogi", "fedadam"])
def test_a_real_round_is_the_by_hand_step_from_fedavgs_aggregate(tmp_path, variant):
    avg, x0 = run(tmp_path, "avg")  # round 1's clients train from x0 in both runs: the same aggregate
    ada, x0b = run(tmp_path, variant, f"algorithm.name={variant}", "algorithm.server_lr=0.02")
    assert all(torch.equal(x0[k], x0b[k]) for k in x0)
    p = ada.server.params
    want, m, v = adaptive_step(ada.server.variant, x0, avg.server.model.state_dict(), {}, {}, p.server_lr, p.beta1,
                               getattr(p, "beta2", 0.0), p.tau)
    got = ada.server.model.state_dict()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ada.server.v[k], v[k], rtol=1e-4, atol=1e-12)
    # the step is not FedAvg's
    assert max(float((got[k] - avg.server.model.state_dict()[k]).abs().max()) for k in want) > 1e-3


def test_beta1_zero_and_eta_equal_two_tau_to_infinity_is_fedavg(tmp_path):
    avg, _ = run(tmp_path, "avg", rounds=2)
    # FedAdagrad, v_{-1} = tau^2: x + 2 tau Delta / (sqrt(tau^2 + sum Delta^2) + tau) -> x + Delta
    big, _ = run(tmp_path, "big", "algorithm.name=fedadagrad", "algorithm.beta1=0.0", "algorithm.tau=1e6",
                 "algorithm.server_lr=2e6", rounds=2)
    for k, t in avg.server.model.state_dict().items():
        torch.testing.assert_close(big.server.model.state_dict()[k], t, rtol=0, atol=1e-5)


def test_streamed_equals_listed_and_resume_is_bit_exact(tmp_path):
    on, _ = run(tmp_path, "on", "algorithm.name=fedyogi", "stream_aggregation=on", rounds=2)
    off, _ = run(tmp_path, "off", "algorithm.name=fedyogi", "stream_aggregation=off", rounds=2)
    rows = [json.loads(x) for x in (on.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["replies_streamed"] for r in rows] == [3, 3]  # the server step kept streaming
    for k, t in off.server.model.state_dict().items():
        torch.testing.assert_close(on.server.model.state_dict()[k], t, rtol=1e-5, atol=1e-6)
    full, _ = run(tmp_path, "full", "algorithm.name=fedadam", rounds=3)
    run(tmp_path, "half", "algorithm.name=fedadam", rounds=2)
    half, _ = run(tmp_path, "half", "algorithm.name=fedadam", rounds=3, resume=True)
    for k, t in full.server.model.state_dict().items():
        assert torch.equal(t, half.server.model.state_dict()[k]), k
    assert all(torch.equal(full.server.v[k], half.server.v[k]) for k in full.server.v)


@pytest.mark.parametrize("bad", ["algorithm.server_lr=0.0", "algorithm.beta1=1.0", "algorithm.tau=0.0",
                                 "algorithm.beta2=-0.1"])
def test_bad_values_name_the_field(bad):
    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        load_config(None, ["algorithm.name=fedadam", bad])
