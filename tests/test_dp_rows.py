"""DP beyond the FedAvg family (issue 27; docs/dp.md): the per-row Gaussian mechanism
(``[dp] mode = "rows"``: PartialFL's shared rows and embeddings, split learning's cut activations
and U-shaped gradients, the weights they send through local DP's randomizer) and DP-SGD with
batch-level clipping (``mode = "sample"`` for FedCMI and CreamFL, whose losses couple a batch's
rows). What the server receives is clipped and noised in real runs; epsilon is Opacus's RDP
accountant of the releases; the audit's probe does worse under DP."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmfl.audit.attacks import probe_rows
from mmfl.config import TrainConfig, resolve
from mmfl.core.dp_rows import batch_dpsgd_train, batch_private_gradients, privatize_rows, row_epsilon
from mmfl.core.dpsgd import history_epsilon, record_steps, sample_rate, steps_per_epoch
from mmfl.data.base import ArrayDataset
from mmfl.errors import ConfigError
from mmfl.report import load_metrics

from helpers import experiment, run_config
from test_partialfl import raw_config  # its federation: mfeat_pair, the image private, the features shareable


def opacus_epsilon(z, q, steps, delta):
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    return get_privacy_spent(orders=orders, rdp=compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=orders),
                             delta=delta)[0]


# ----------------------------------------------------------------------------- the mechanisms by hand


def test_privatize_rows_clips_each_row_and_adds_noise_of_std_z_c():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, 6, generator=g) * torch.tensor([0.1, 10.0]).repeat_interleave(2000)[:, None]
    clipped = privatize_rows(x, 1.0, 0.0, seed=1)
    norms = clipped.norm(dim=1)
    assert float(norms.max()) <= 1.0 + 1e-6
    small = x.norm(dim=1) < 1.0
    assert torch.allclose(clipped[small], x[small])  # rows inside the ball pass unchanged
    noised = privatize_rows(x, 1.0, 3.0, seed=1)
    assert abs(float((noised - clipped).std()) - 3.0) < 0.05
    assert torch.equal(noised, privatize_rows(x, 1.0, 3.0, seed=1))  # seeded


def test_row_epsilon_is_the_gaussian_mechanism_of_multiplier_z_over_2_composed():
    for z, k in ((1.0, 1), (2.0, 7), (4.0, 30)):
        assert row_epsilon(z, k, 1e-5) == pytest.approx(opacus_epsilon(z / 2, 1.0, k, 1e-5), rel=1e-6)
    assert row_epsilon(1.0, 5, 1e-5) > row_epsilon(1.0, 4, 1e-5) > row_epsilon(2.0, 4, 1e-5)


def test_batch_level_clipping_bounds_every_step_and_noise_moves_the_model():
    """DP-SGD with batch-level clipping in training: with SGD (lr, no momentum) each step moves the
    parameters by at most lr C without noise; with noise the model moves by about lr z C per
    coordinate and step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    g = torch.Generator().manual_seed(1)
    data = ArrayDataset({"x": torch.randn(200, 5, generator=g) * 50}, torch.randint(0, 3, (200,), generator=g))
    train = TrainConfig(optimizer="sgd", lr=0.1, momentum=0.0, weight_decay=0.0, batch_size=20, local_epochs=1)

    def steps(z, clip):
        m = copy.deepcopy(model)
        snaps = []

        def loss_fn(mm, inputs, labels):  # called at the start of each step: the parameters then
            snaps.append(torch.cat([p.detach().reshape(-1).clone() for p in mm.parameters()]))
            return F.cross_entropy(mm(inputs["x"]), labels)

        batch_dpsgd_train(m, data, train, clip, z, torch.Generator().manual_seed(2), torch.Generator().manual_seed(3),
                          loss_fn)
        snaps.append(torch.cat([p.detach().reshape(-1) for p in m.parameters()]))
        return [float((b - a).norm()) for a, b in zip(snaps[:-1], snaps[1:])], None, m, m[1]

    moves, _, m, bn = steps(0.0, 0.01)
    assert len(moves) == steps_per_epoch(200, 20) and max(moves) <= 0.1 * 0.01 * (1 + 1e-4)
    assert float(bn.running_mean.abs().max()) == 0.0  # BatchNorm's running statistics never saw a private row
    noisy, _, _, _ = steps(2.0, 0.01)
    n_params = sum(p.numel() for p in model.parameters())
    assert np.median(noisy) == pytest.approx(0.1 * 2.0 * 0.01 * math.sqrt(n_params), rel=0.2)


def test_batch_private_gradients_of_nothing_is_noise_alone():
    p = torch.zeros(1000, requires_grad=True)
    g = batch_private_gradients(None, [p], 0.5, 2.0, torch.Generator().manual_seed(0))[0]
    assert abs(float(g.std()) - 1.0) < 0.1


def test_the_label_probe_does_worse_on_rows_through_the_gaussian_mechanism():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 900)
    rows = torch.tensor(np.eye(3)[y] * 0.8 + rng.normal(0, 0.05, (900, 3)))
    clear = probe_rows(rows[:600].numpy(), None, y[:600], rows[600:].numpy(), None, y[600:])
    private = privatize_rows(rows, 1.0, 4.0, seed=0).numpy()
    noised = probe_rows(rows[:600].numpy(), None, y[:600], private[600:], None, y[600:])
    assert clear["label_accuracy"] > 0.95
    assert noised["label_accuracy"] < 0.5 < clear["label_accuracy"]


# ----------------------------------------------------------------------------- in real runs


def split_raw(tmp_path, algo, dp):
    return {"name": algo, "rounds": 1, "seed": 0, "output_dir": str(tmp_path), "threads": 1,
            "data": {"name": "mfeat_pair"}, "partition": {"name": "iid", "num_clients": 2},
            "modalities": {"name": "explicit", "holds": [["image", "features"], ["image"]]},
            "model": {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16]},
            "algorithm": {"name": algo}, "dp": dp,
            "train": {"optimizer": "sgd", "lr": 0.01, "local_epochs": 2, "batch_size": 128}}


def spied(exp) -> list:
    sent, send = [], exp.transport.send

    def spy(route, messages):
        replies = send(route, messages)
        sent.extend((route, cid, messages[cid], replies.get(cid)) for cid in messages)
        return replies

    exp.transport.send = spy
    return sent


def test_split_learning_rows_dp_clips_and_noises_every_activation_gradient_and_weight_sent(tmp_path):
    """U-shaped split learning with [dp] mode = "rows": every cut-activation row and grad_rep row the
    server receives has norm <= C without noise and far above C with it; the sl_end weights are
    within C of the session's start; epsilon counts each row's releases."""
    c = 0.05
    exp = experiment(split_raw(tmp_path / "clip", "split_learning_u",
                               {"mode": "rows", "clip_norm": c, "noise_multiplier": 0.0}))
    sent = spied(exp)
    exp.run()
    acts = [t for r, _, _, rep in sent if r == "sl_forward" for k, t in rep.arrays.items() if k.startswith("act/")]
    grads = [rep.arrays["grad_rep"] for r, _, _, rep in sent if r == "sl_tail"]
    assert acts and grads
    assert max(float(t.reshape(len(t), -1).norm(dim=1).max()) for t in acts + grads) <= c * (1 + 1e-4)
    begins = {cid: msg.arrays for r, cid, msg, _ in sent if r == "sl_begin"}
    for r, cid, _, rep in sent:
        if r == "sl_end":
            d = torch.sqrt(sum(((rep.arrays[k].double() - begins[cid][k].double()) ** 2).sum()
                               for k in rep.arrays if rep.arrays[k].is_floating_point()))
            assert float(d) <= c * (1 + 1e-4)

    z = 2.0
    exp = experiment(split_raw(tmp_path / "noise", "split_learning_u",
                               {"mode": "rows", "clip_norm": c, "noise_multiplier": z}))
    sent = spied(exp)
    exp.run()
    acts = [t for r, _, _, rep in sent if r == "sl_forward" for k, t in rep.arrays.items() if k.startswith("act/")]
    grads = [rep.arrays["grad_rep"] for r, _, _, rep in sent if r == "sl_tail"]
    for t in acts + grads:
        d = t.reshape(len(t), -1).shape[1]
        assert float(t.reshape(len(t), -1).norm(dim=1).median()) == pytest.approx(z * c * math.sqrt(d), rel=0.5)
    row = load_metrics(tmp_path / "noise" / "split_learning_u")[-1]
    # client 0 holds 2 modalities: 2 epochs x (2 activations + 1 grad_rep) + the weights = 7 releases
    assert row["dp/epsilon"] == pytest.approx(row_epsilon(z, 7, 1e-5), rel=1e-9)
    assert row["dp/epsilon"] == pytest.approx(opacus_epsilon(z / 2, 1.0, 7, 1e-5), rel=1e-6)


def test_partialfl_rows_dp_clips_and_noises_the_shared_rows_embeddings_and_model(tmp_path):
    c, z = 0.05, 3.0
    raw = raw_config(tmp_path, rounds=1, clients_per_round=3, dp={"mode": "rows", "clip_norm": c, "noise_multiplier": 0.0})
    exp = experiment(raw)
    sent = spied(exp)
    exp.run()
    shared = [t for r, _, _, rep in sent if r in ("upload", "train") for k, t in rep.arrays.items()
              if k.startswith("x/") or k == "zprime"]
    assert len(shared) == 4  # x/features and zprime of the two clients holding the shareable modality
    assert max(float(t.reshape(len(t), -1).norm(dim=1).max()) for t in shared) <= c * (1 + 1e-4)
    for r, cid, msg, rep in sent:
        if r == "train":
            keys = [k for k in msg.arrays if k != "zt" and msg.arrays[k].is_floating_point()]
            d = torch.sqrt(sum(((rep.arrays[k].double() - msg.arrays[k].double()) ** 2).sum() for k in keys))
            assert float(d) <= c * (1 + 1e-4)

    raw = raw_config(tmp_path / "z", rounds=1, clients_per_round=3, dp={"mode": "rows", "clip_norm": c, "noise_multiplier": z})
    exp = experiment(raw)
    sent = spied(exp)
    exp.run()
    for r, _, _, rep in sent:
        for k, t in rep.arrays.items():
            if k.startswith("x/") or k == "zprime":
                d = t.reshape(len(t), -1).shape[1]
                assert float(t.reshape(len(t), -1).norm(dim=1).median()) == pytest.approx(z * c * math.sqrt(d), rel=0.3)
    row = load_metrics(tmp_path / "z" / "partialfl")[-1]
    assert row["dp/epsilon"] == pytest.approx(row_epsilon(z, 3, 1e-5), rel=1e-9)  # x/S once, zprime, F_g


def test_fedcmi_dpsgd_batch_level_epsilon_is_opacus_at_half_the_multiplier(tmp_path):
    raw = {"name": "cmi", "rounds": 2, "output_dir": str(tmp_path), "threads": 1, "case": "D", "clients_per_round": 4,
           "data": {"name": "mfeat", "views": ["pix", "fou"]}, "partition": {"num_clients": 4},
           "model": {"name": "multimodal", "feat_dim": 16, "mlp_hidden": [32], "two_projector": True},
           "algorithm": {"name": "fedcmi"}, "dp": {"mode": "sample", "noise_multiplier": 1.5},
           "train": {"local_epochs": 1, "batch_size": 64}}
    exp = run_config(raw)
    rows = load_metrics(tmp_path / "cmi")
    sizes = [len(exp.federation.clients[c]) for c in range(4)]
    want = [opacus_epsilon(0.75, sample_rate(n, 64), 2 * steps_per_epoch(n, 64), 1e-5) for n in sizes]
    assert rows[-1]["dp/epsilon"] == pytest.approx(max(want), rel=1e-6)
    hist = record_steps(None, 0.75, sample_rate(sizes[0], 64), 2 * steps_per_epoch(sizes[0], 64))
    assert history_epsilon(hist, 1e-5) == pytest.approx(want[0], rel=1e-6)


def test_creamfl_dpsgd_batch_level_trains_the_private_task_privately_and_accounts_it(tmp_path):
    """CreamFL's clients (classification and image-text InfoNCE) under [dp] mode = "sample": their
    epsilon is Opacus's at (z / 2, q, steps) of their private rows, and the noise reaches the
    representations they send (two noise seeds, two different replies)."""
    raw = {"name": "cream", "rounds": 1, "seed": 0, "output_dir": str(tmp_path), "threads": 1,
           "data": {"name": "mfeat_pair", "public_fraction": 0.2}, "partition": {"name": "iid", "num_clients": 3},
           "modalities": {"name": "explicit", "holds": [["image", "features"], ["image"], ["features"]]},
           "model": {"name": "multimodal", "feat_dim": 8, "cnn_channels": [4], "mlp_hidden": [16]},
           "algorithm": {"name": "creamfl", "server_batch_size": 64}, "dp": {"mode": "sample", "noise_multiplier": 2.0},
           "train": {"local_epochs": 2, "batch_size": 32, "optimizer": "adam", "lr": 0.001}}
    exp = experiment(raw)
    sent = spied(exp)
    exp.run()
    row = load_metrics(tmp_path / "cream")[-1]
    sizes = [len(exp.federation.clients[c]) for c in range(3)]
    want = [opacus_epsilon(1.0, sample_rate(n, 32), 2 * steps_per_epoch(n, 32), 1e-5) for n in sizes]
    assert row["dp/epsilon"] == pytest.approx(max(want), rel=1e-6)
    assert row["dp/epsilon_mean"] == pytest.approx(sum(want) / 3, rel=1e-6)
    raw2 = dict(raw, seed=0, name="cream2", dp={"mode": "sample", "noise_multiplier": 0.0})
    exp2 = experiment(raw2)
    sent2 = spied(exp2)
    exp2.run()
    reps = {cid: rep.arrays for r, cid, _, rep in sent if r == "train"}
    reps2 = {cid: rep.arrays for r, cid, _, rep in sent2 if r == "train"}
    for cid in reps:  # the same batches and public passes: only the private steps' noise differs
        assert any(not torch.allclose(reps[cid][k], reps2[cid][k], atol=1e-3) for k in reps[cid])


@pytest.mark.parametrize("algo,mode,match", [
    ("fedavg", "rows", "does not support dp.mode = \"rows\".*send model parameters"),
    ("creamfl_fedavg", "sample", "does not support sample-level"),
    ("split_learning", "sample", "does not support sample-level"),
])
def test_modes_an_algorithm_does_not_take_are_one_line(algo, mode, match):
    from mmfl.algorithms.capabilities import algorithms_with
    from mmfl.config import resolve_dp
    from mmfl.schema import Component

    with pytest.raises(ConfigError, match=match):
        resolve_dp({"mode": mode}, Component(algo, {}))
    assert {"partialfl", "split_learning", "split_learning_u"} <= set(algorithms_with("dp:rows"))
    assert {"fedcmi", "creamfl"} <= set(algorithms_with("dp:sample"))


def test_the_audits_row_ground_truth_under_rows_dp_is_the_clients_seeded_schedule(tmp_path):
    """Noised activations match no clean row, so under [dp] mode = "rows" the audit takes the rows of
    a split client's first batch from its seeded schedule; where matching is exact (z = 0, C huge,
    the features' MLP activations) both give the same rows."""
    from mmfl.algorithms.split_cut import client_forward
    from mmfl.audit import audit as A
    from mmfl.audit.replay import replay
    from mmfl.core.dp_rows import fixed_batchnorm

    raw = split_raw(tmp_path, "split_learning_u", {"mode": "rows", "clip_norm": 1e9, "noise_multiplier": 0.0})
    raw["train"]["batch_size"] = 32
    view = replay(resolve(raw), 1)
    fed = view.federation
    e = next(x for x in view.exchanges if x.route == "sl_forward" and x.client == 0)
    begin = next(x for x in view.exchanges if x.route == "sl_begin" and x.client == 0)
    model = view.make_model(fed.modalities_of(0), fed.group_of(0), fed.meta_of(0))
    state = model.state_dict()
    state.update({k: v for k, v in begin.sent.arrays.items() if k in state})
    model.load_state_dict(state)
    x, y = fed.clients[0].get()
    with torch.no_grad(), fixed_batchnorm(model):
        mine = client_forward(model, x, True)["features"]
    got = e.reply.arrays["act/features"]
    nearest = torch.cdist(got.double(), mine.double()).argmin(1)
    assert torch.equal(A._first_batch_rows(view, e, len(y), None), nearest) and len(nearest) == 32
