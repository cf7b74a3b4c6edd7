"""Sample-level DP-SGD ([dp] mode = "sample", mmfl.core.dpsgd): without noise and clipping it is SGD on
the Poisson batches; clipping bounds each sample's contribution; the step equals Opacus's DPOptimizer;
epsilon matches Opacus's accountant stepped directly; a bit-exact resume; one-line errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmfl.config import load_config
from mmfl.core.dpsgd import (clip_and_noise, dpsgd_train, history_epsilon, model_blocker, per_sample_gradients,
                             poisson_batches, record_steps, sample_rate, steps_per_epoch)
from mmfl.data.base import ArrayDataset
from mmfl.engine.runner import Experiment, sample_cohort
from mmfl.errors import ConfigError
from mmfl.report import compare
from mmfl.schema import TrainConfig

from helpers import DIGITS, rows, run, timeless

BASE = [*DIGITS, "partition.num_clients=4", "clients_per_round=3", "dp.mode=sample"]


def run_exp(tmp_path, name, *over, rounds=2, resume=False) -> Experiment:
    return run(tmp_path, name, *over, base=BASE, rounds=rounds, resume=resume)


def rows_of(exp) -> list[dict]:
    return timeless(rows(exp))


class Tiny(nn.Module):
    """An MLP on a dict of inputs, as mmfl's models take them."""

    def __init__(self, d=5, k=3, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(d, 8), nn.ReLU(), nn.Linear(8, k))

    def forward(self, inputs):
        return {"logits": self.net(inputs["x"])}


def tiny_data(n=40, d=5, k=3, seed=1) -> ArrayDataset:
    g = torch.Generator().manual_seed(seed)
    return ArrayDataset({"x": torch.randn(n, d, generator=g)}, torch.randint(0, k, (n,), generator=g))


def ce_per_sample(model, inputs, labels):
    return F.cross_entropy(model(inputs)["logits"], labels, reduction="none")


def test_dpsgd_with_noise_multiplier_zero_and_huge_clip_norm_equals_sgd_on_the_same_poisson_batches():
    data, train = tiny_data(), TrainConfig(optimizer="sgd", local_epochs=2, batch_size=8, lr=0.1, momentum=0.9, weight_decay=1e-3)
    dp_model, ref = Tiny(), Tiny()
    stats = dpsgd_train(dp_model, data, train, clip_norm=1e12, noise_multiplier=0.0,
                        generator=torch.Generator().manual_seed(7), noise_generator=torch.Generator().manual_seed(8),
                        sample_loss=ce_per_sample)
    # plain SGD (same optimizer) on the same Poisson batches, loss = summed CE / expected batch size q n
    q = sample_rate(len(data), 8)
    steps = steps_per_epoch(len(data), 8) * 2
    assert (q, steps, stats["steps"]) == (0.2, 10, 10)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    sizes = []
    for rows in poisson_batches(len(data), q, steps, torch.Generator().manual_seed(7)):
        sizes.append(len(rows))
        opt.zero_grad()
        inputs, labels = data.get(rows)
        (ce_per_sample(ref, inputs, labels).sum() / (q * len(data))).backward()
        opt.step()
    assert len(set(sizes)) > 1  # Poisson batches: their sizes vary
    for (name, a), b in zip(dp_model.named_parameters(), ref.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name  # float32: per-sample sums vs the batch gradient


def test_opacus_hooks_give_each_samples_own_gradient():
    model, data = Tiny(), tiny_data(6)
    inputs, labels = data.get()
    with per_sample_gradients(model):
        ce_per_sample(model, inputs, labels).sum().backward()
        got = [p.grad_sample.clone() for p in model.parameters()]
    assert not hasattr(next(model.parameters()), "grad_sample")  # hooks and attributes removed on exit
    for i in range(6):
        model.zero_grad()
        ce_per_sample(model, {"x": inputs["x"][i:i + 1]}, labels[i:i + 1]).sum().backward()
        for g, p in zip(got, model.parameters()):
            assert torch.allclose(g[i], p.grad, atol=1e-6)


def test_per_sample_clipping_bounds_each_samples_contribution():
    # one sample with a huge input has a huge gradient; with or without it, the clipped sum moves by <= C
    model, data = Tiny(), tiny_data(9)
    inputs, labels = data.get()
    inputs = {"x": inputs["x"].clone()}
    inputs["x"][4] *= 1e4
    with per_sample_gradients(model):
        ce_per_sample(model, inputs, labels).sum().backward()
        samples = [p.grad_sample.clone() for p in model.parameters()]
    norms = torch.stack([g.reshape(9, -1).norm(dim=1) for g in samples], 1).norm(dim=1)
    C = 1.5
    assert float(norms[4]) > 100 * C and float(norms.min()) < C  # one sample far above C, some below
    full = clip_and_noise(samples, C, 0.0, 1.0, None)
    without = clip_and_noise([torch.cat([g[:4], g[5:]]) for g in samples], C, 0.0, 1.0, None)
    diff = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(full, without)))
    assert float(diff) <= C and float(diff) == pytest.approx(C, rel=1e-4)  # the outlier counts exactly C
    for i in range(9):  # every sample alone: its clipped gradient has norm min(||g_i||, C)
        one = clip_and_noise([g[i:i + 1] for g in samples], C, 0.0, 1.0, None)
        n1 = float(torch.sqrt(sum((t ** 2).sum() for t in one)))
        assert n1 <= C and n1 == pytest.approx(min(float(norms[i]), C), rel=1e-4)


def test_clip_and_noise_equals_opacus_dpoptimizer_draw_for_draw():
    from opacus.optimizers import DPOptimizer

    model, data = Tiny(), tiny_data(12)
    inputs, labels = data.get()
    with per_sample_gradients(model):
        ce_per_sample(model, inputs, labels).sum().backward()
        params = list(model.parameters())
        samples = [p.grad_sample.clone() for p in params]
        mine = clip_and_noise(samples, 0.7, 1.3, 10.0, torch.Generator().manual_seed(3))
        opt = DPOptimizer(torch.optim.SGD(params, lr=0.1), noise_multiplier=1.3, max_grad_norm=0.7,
                          expected_batch_size=10, generator=torch.Generator().manual_seed(3))
        opt.pre_step()
        for a, p in zip(mine, params):
            assert torch.equal(a, p.grad)


def test_epsilon_grows_with_rounds_and_matches_opacus_accountant_stepped_directly(tmp_path):
    from opacus.accountants import RDPAccountant

    z, delta = 1.1, 1e-4
    exp = run_exp(tmp_path, "eps", f"dp.noise_multiplier={z}", f"dp.delta={delta}", rounds=4)
    rows = rows_of(exp)
    fed, cfg = exp.federation, exp.cfg
    accountants = {c: RDPAccountant() for c in range(fed.num_clients)}
    for rnd, row in enumerate(rows):
        for c in sample_cohort(cfg, rnd, fed.num_clients):  # every step of every round client c trained
            n = len(fed.clients[c])
            for _ in range(steps_per_epoch(n, 128)):
                accountants[c].step(noise_multiplier=z, sample_rate=min(1.0, 128 / n))
        eps = [a.get_epsilon(delta) for a in accountants.values() if a.history]
        assert row["dp/epsilon"] == pytest.approx(max(eps), rel=1e-12)
        assert row["dp/epsilon_mean"] == pytest.approx(sum(eps) / len(eps), rel=1e-12)
        assert row["dp/delta"] == delta
    # the worst client's epsilon never falls, and grows over the run (its own grows with each round it trains)
    assert all(b["dp/epsilon"] >= a["dp/epsilon"] for a, b in zip(rows, rows[1:]))
    assert rows[-1]["dp/epsilon"] > rows[0]["dp/epsilon"] > 0
    # each client's state holds its accountant's history, merged as RDPAccountant.step merges it
    for c, acc in accountants.items():
        h = exp.store.load(c).get("dpsgd/history")
        assert [tuple(r) for r in h.tolist()] == [(z, acc.history[0][1], float(acc.history[0][2]))]
        assert history_epsilon(h, delta) == pytest.approx(acc.get_epsilon(delta), rel=1e-12)
    assert f"{rows[-1]['dp/epsilon']:.3g} (1e-04)" in compare([exp.run_dir])  # mmfl report's column


def test_record_steps_merges_like_rdpaccountant_and_no_noise_is_infinite_epsilon():
    h = record_steps(None, 1.0, 0.1, 5)
    h = record_steps(h, 1.0, 0.1, 3)
    assert h.tolist() == [[1.0, 0.1, 8.0]]
    h = record_steps(h, 2.0, 0.1, 4)
    assert h.tolist() == [[1.0, 0.1, 8.0], [2.0, 0.1, 4.0]]
    assert history_epsilon(None, 1e-5) == 0.0
    assert history_epsilon(record_steps(None, 0.0, 0.1, 1), 1e-5) == math.inf


@pytest.mark.parametrize("algo", ["fedavg", "fedprox", "moon"])
def test_dpsgd_resume_is_bit_exact(tmp_path, algo):
    over = [f"algorithm.name={algo}", "dp.clip_norm=0.5", "dp.noise_multiplier=0.8"]
    if algo == "fedprox":
        over.append("algorithm.mu=0.1")
    if algo == "moon":
        over += ["model.projection_head=true", "model.out_dim=8"]
    full = run_exp(tmp_path, "full", *over, rounds=3)
    run_exp(tmp_path, "split", *over, rounds=1)
    resumed = run_exp(tmp_path, "split", *over, rounds=3, resume=True)
    a, b = rows_of(full), rows_of(resumed)
    assert [r["round"] for r in b] == [1, 2, 3] and a == b
    for k, v in full.server.state_dict().items():
        assert torch.equal(v, resumed.server.state_dict()[k]), k
    assert "dp_epsilon" in full.server.state_dict()
    for c in range(4):
        sa, sb = full.store.load(c), resumed.store.load(c)
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_noise_changes_the_model_and_batched_or_streamed_runs_equal_the_sequential_one(tmp_path):
    a = run_exp(tmp_path, "a", "dp.noise_multiplier=1.0", rounds=1)
    b = run_exp(tmp_path, "b", "dp.noise_multiplier=0.0", rounds=1)
    # the model itself (the server state also holds the accountant's epsilon, which differs without noise)
    assert any(not torch.equal(a.server.model.state_dict()[k], v) for k, v in b.server.model.state_dict().items())
    assert rows_of(b)[0]["dp/epsilon"] == math.inf
    batched = run_exp(tmp_path, "batched", "dp.noise_multiplier=1.0", "batch_clients=true", rounds=1)
    row = rows_of(batched)[0]
    assert "trained one by one" in row["batched_fallback"]
    assert {k: v for k, v in row.items() if k != "batched_fallback"} == rows_of(a)[0]
    streamed = run_exp(tmp_path, "streamed", "dp.noise_multiplier=1.0", "stream_aggregation=on", rounds=2)
    plain = run_exp(tmp_path, "plain", "dp.noise_multiplier=1.0", "stream_aggregation=off", rounds=2)
    rs = rows_of(streamed)
    assert all(r.pop("replies_streamed") == 3 for r in rs) and rs == rows_of(plain)  # dp/epsilon included
    assert torch.equal(streamed.server.dp_epsilon, plain.server.dp_epsilon)


@pytest.mark.parametrize("over,match", [
    (["algorithm.name=scaffold"], r"^dp: algorithm 'scaffold' does not support sample-level DP-SGD \(mode = "
                                  r"\"sample\", .*\); supported: .*fedavg, .*fedprox, .*moon"),
    (["algorithm.name=mfedavg"], r"^dp: algorithm 'mfedavg' does not support sample-level DP-SGD"),
    (['dp.mode="dp-sgd"'], r"^dp.mode: must be one of \['central', 'local', 'sample', 'rows'\], got 'dp-sgd'$"),
])
def test_bad_dpsgd_configs_are_one_line(tmp_path, over, match):
    from mmfl.algorithms.capabilities import algorithms_with

    with pytest.raises(ConfigError, match=match) as e:
        load_config(None, [*BASE, *over, f"output_dir={tmp_path}"])
    assert "\n" not in str(e.value)
    if "supported: " in str(e.value):  # the list is the declared capability, not a hand-written one
        assert str(e.value).split("supported: ")[1] == ", ".join(sorted(algorithms_with("dp:sample")))


def test_a_client_that_changes_training_through_other_hooks_is_refused():
    from mmfl.algorithms.fedavg import FedAvgClient
    from mmfl.algorithms.fedprox import FedProxClient

    class Corrected(FedAvgClient):
        def before_step(self):
            pass

    assert FedAvgClient.dpsgd_blocker() is None and FedProxClient.dpsgd_blocker() is None
    assert Corrected.dpsgd_blocker() == "Corrected overrides before_step"


def test_batchnorm_model_is_a_one_line_config_error_naming_the_module(tmp_path, capsys):
    from mmfl.cli import demo_config_path, main

    assert model_blocker(Tiny()) is None
    bn = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, affine=False))  # no parameters, still mixes samples
    assert model_blocker(bn) == "BatchNorm1d at '1' (its batch statistics mix the samples of a batch)"
    sets = ["data.name=digits", "model.name=resnet", "dp.mode='sample'", "rounds=1", f"output_dir='{tmp_path}'"]
    rc = main(["run", str(demo_config_path()), *[a for s in sets for a in ("--set", s)]])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith("mmfl: error: dp.mode: DP-SGD (mode = \"sample\") cannot train model 'resnet': "
                             "BatchNorm2d at 'features.stem.1' (its batch statistics mix the samples of a batch)")
    assert err[0].endswith("use a model without BatchNorm (resnet: model.norm = \"group\")")
