"""MOON's mechanism: the model-contrastive term moves the local representation toward the
global model's relative to the previous local model's (what l_con optimizes), the global and
previous models stay frozen in eval mode, and the representation probe's numbers by hand.
(mu = 0 equals FedAvg and round 0 equals FedAvg: tests/test_algorithms.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from mmfl.algorithms.moon import PREV, MoonParams, model_contrastive_loss, representation_probe

from mmfl.errors import ConfigError

from helpers import DIGITS, config, experiment, rows, run

BASE = [*DIGITS, "rounds=3", "algorithm.name=moon"]


def run_rows(tmp_path, name, *over):
    exp = run(tmp_path, name, *over, base=BASE, rounds=None)
    return exp, rows(exp)


def test_representation_probe_hand_values():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    z_prev = torch.tensor([[-1.0, 0.0], [3.0, 0.0]])
    out = representation_probe(z, z_glob, z_prev, tau=0.5)
    # cos(z, glob) = 1/sqrt2, 1; cos(z, prev) = -1, 0; cos(glob, prev) = -1/sqrt2, 0
    assert out["cos_glob"] == pytest.approx((1 / math.sqrt(2) + 1) / 2)
    assert out["cos_prev"] == pytest.approx(-0.5)
    assert out["cos_glob_prev"] == pytest.approx(-1 / (2 * math.sqrt(2)))
    assert out["con"] == pytest.approx(float(model_contrastive_loss(z, z_glob, z_prev, 0.5)))
    assert set(representation_probe(z, z_glob, None, 0.5)) == {"cos_glob"}  # no previous model yet


def test_moon_term_moves_local_representation_toward_global_relative_to_previous(tmp_path):
    # same data, seed and start; only mu differs. l_con rewards cos(z, z_glob) - cos(z, z_prev).
    _, r0 = run_rows(tmp_path, "mu0", "algorithm.mu=0.0")
    _, r5 = run_rows(tmp_path, "mu5", "algorithm.mu=5.0")
    assert r0[0]["moon/cos_glob"] == pytest.approx(r5[0]["moon/cos_glob"], abs=1e-6)  # round 1: no l_con
    assert "moon/cos_prev" not in r0[0]
    for a, b in zip(r0[1:], r5[1:]):
        gap0 = a["moon/cos_glob"] - a["moon/cos_prev"]
        gap5 = b["moon/cos_glob"] - b["moon/cos_prev"]
        # without the term a client returns next to its previous model (gap < 0); with it, z ends
        # closer to the global model's representation than to the previous one (gap > 0)
        assert gap0 < -0.1 and gap5 > 0.2, (gap0, gap5)
        assert b["moon/con"] < a["moon/con"] - 0.3
        assert b["moon/cos_prev"] < a["moon/cos_prev"] - 0.3


def test_moon_global_and_previous_models_are_frozen_in_eval_mode(tmp_path):
    from mmfl.algorithms.base import ClientContext
    from mmfl.algorithms.moon import MoonClient

    exp = experiment(config(tmp_path, "frozen", base=BASE, rounds=1))
    fed, pool = exp.federation, {}
    make = exp.make_model

    def model_pool(key):
        return pool.setdefault(key, make())

    glob_state = {k: v.clone() for k, v in make().state_dict().items()}
    state = {PREV + k: v + 0.01 for k, v in glob_state.items()}
    ctx = ClientContext(cid=0, rnd=1, seed=0, data=fed.clients[0], test_data=None, meta=fed.meta,
                        train=exp.cfg.train, state=state, model_pool=model_pool)
    client = MoonClient(MoonParams(mu=5.0), ctx)
    loss_fn = client.loss_fn(glob_state)
    local = model_pool("local").train()
    inputs, labels = fed.clients[0].get(torch.arange(32))
    loss_fn(local, inputs, labels).backward()
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in local.parameters())
    for key in ("global", "prev"):
        assert not pool[key].training
        assert all(p.grad is None for p in pool[key].parameters()), key


def test_moon_probe_rows_is_validated():
    with pytest.raises(ConfigError, match="algorithm.probe_rows"):
        MoonParams(probe_rows=-1)
