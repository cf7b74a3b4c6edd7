"""CreamFL and its baselines: the LCR terms (eq. 1-3) by hand, GCA (eq. 4-6) filtering a
drifted client, the aggregation rules of the baselines, what crosses the network, model
heterogeneity, resume, and every registered name running from the CLI."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mmfl.algorithms import ALGORITHMS
from mmfl.algorithms.creamfl import CreamFLParams, CreamFLServer
from mmfl.algorithms.creamfl_terms import (entropy_selection_weights, info_nce, inter_loss, intra_loss, select_public,
                                           variance_weights)
from mmfl.algorithms.public_terms import global_local_contrastive_scores
from mmfl.cli import main as cli_main
from mmfl.errors import ConfigError
from mmfl.report import load_metrics

from helpers import experiment, run_config

NAMES = ["creamfl", "reamfl_mean", "reamfl_avg", "reamfl_iot", "fedmd", "fedet", "fedgems",
         "creamfl_fedavg", "creamfl_fediot"]


# ----------------------------------------------------------------------------- the terms by hand


def test_inter_loss_by_hand():
    # eq. 1 with tau: local [1, 0] of public sample 1 against global others [[1, 0], [0, 1], [-1, 0]]
    local = torch.tensor([[1.0, 0.0]])
    other = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    got = inter_loss(local, other, torch.tensor([1]), tau=0.5)
    logits = [2.0, 0.0, -2.0]  # dot products / 0.5
    hand = -(logits[1] - math.log(sum(math.exp(v) for v in logits)))
    assert got.item() == pytest.approx(hand, rel=1e-6)


def test_intra_loss_by_hand():
    # eq. 2: -log e^{l.g/tau} / (e^{l.g/tau} + e^{l.p/tau})
    local = torch.tensor([[0.6, 0.8], [1.0, 0.0]])
    glob = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    prev = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    got = intra_loss(local, glob, prev, tau=0.5)
    hand = []
    for (l1, l2), (g1, g2), (p1, p2) in zip(local.tolist(), glob.tolist(), prev.tolist()):
        a, b = (l1 * g1 + l2 * g2) / 0.5, (l1 * p1 + l2 * p2) / 0.5
        hand.append(-(a - math.log(math.exp(a) + math.exp(b))))
    assert got.item() == pytest.approx(sum(hand) / 2, rel=1e-6)


def test_info_nce_is_symmetric_cross_entropy():
    a = F.normalize(torch.tensor([[1.0, 0.2], [0.1, 1.0]]), dim=-1)
    b = F.normalize(torch.tensor([[0.9, 0.0], [0.0, 1.0]]), dim=-1)
    logits = a @ b.T / 0.1
    hand = 0.5 * (F.cross_entropy(logits, torch.arange(2)) + F.cross_entropy(logits.T, torch.arange(2)))
    assert info_nce(a, b, 0.1).item() == pytest.approx(hand.item())


def _reps(seed=0, P=40, d=12, noise=0.1):
    g = torch.Generator().manual_seed(seed)
    img = F.normalize(torch.randn(P, d, generator=g), dim=-1)
    txt = F.normalize(img + noise * torch.randn(P, d, generator=g), dim=-1)  # global: paired by row
    return g, img, txt


def test_gca_weights_sum_to_one_and_fall_for_a_shuffled_or_random_client():
    g, gimg, gtxt = _reps()
    P, d = gimg.shape
    good = [F.normalize(gimg + 0.2 * torch.randn(P, d, generator=g), dim=-1) for _ in range(2)]
    shuffled = gimg[torch.randperm(P, generator=g)]  # right representations of the wrong samples
    rand = F.normalize(torch.randn(P, d, generator=g), dim=-1)
    local = torch.stack([*good, shuffled, rand])
    w = torch.softmax(global_local_contrastive_scores(local, gtxt), dim=0)  # eq. 4-5
    assert torch.allclose(w.sum(0), torch.ones(P), atol=1e-6)
    mean_w = w.mean(1)
    assert mean_w[2] < 0.25 and mean_w[3] < 0.25 and mean_w[0] > 0.25 and mean_w[1] > 0.25
    assert mean_w[2] < 0.5 * mean_w[0] and mean_w[3] < 0.5 * mean_w[0]


def test_gca_aggregation_in_the_server_by_hand():
    # two clients, P = 2, d = 1; the server scores images against global text (eq. 4), softmax over
    # clients (eq. 5) and sums (eq. 6)
    from mmfl.core.message import Message

    server = CreamFLServer.__new__(CreamFLServer)
    server.params, server.pair = CreamFLParams(), ("image", "text")
    li = torch.tensor([[[1.0], [0.0]], [[0.5], [1.0]]])
    glob = {"image": torch.zeros(2, 1), "text": torch.tensor([[1.0], [2.0]])}
    replies = {0: Message(arrays={"rep/image": li[0]}, scalars={"num_examples": 3}),
               1: Message(arrays={"rep/image": li[1]}, scalars={"num_examples": 1})}
    agg, info = server.aggregate_reps(replies, glob)
    s = [[1 - math.log(math.e + math.e ** 2), 0 - math.log(2)],  # client 0, samples 0 and 1
         [0.5 - math.log(math.exp(0.5) + math.exp(1.0)), 2 - math.log(math.exp(1) + math.exp(2))]]
    for k in range(2):
        a0 = math.exp(s[0][k]) / (math.exp(s[0][k]) + math.exp(s[1][k]))
        assert agg["image"][k, 0].item() == pytest.approx(a0 * li[0, k, 0].item() + (1 - a0) * li[1, k, 0].item(),
                                                          rel=1e-5)
    assert "text" not in agg and info["clients/image"] == 2
    server.params = CreamFLParams(aggregation="avg")
    agg, _ = server.aggregate_reps(replies, glob)
    assert torch.allclose(agg["image"], 0.75 * li[0] + 0.25 * li[1])


def test_baseline_weight_rules():
    local = torch.tensor([[[1.0, 0.0, 0.0]], [[1.0, 1.0, 1.0]], [[3.0, 0.0, 0.0]]])  # C=3, P=1, d=3
    v = variance_weights(local)  # FedET: share of each client's representation variance
    var = [1 / 3, 0.0, 3.0]
    assert v[:, 0].tolist() == pytest.approx([x / sum(var) for x in var])
    e = entropy_selection_weights(local)  # FedGEMS: clients at or below the mean entropy, uniformly
    h = [-sum(q * math.log(q) for q in torch.softmax(r[0], 0).tolist()) for r in local]  # 0.98, 1.10, 0.37
    keep = [x <= sum(h) / 3 for x in h]
    assert keep == [False, False, True] and e[:, 0].tolist() == pytest.approx([0.0, 0.0, 1.0])
    two = entropy_selection_weights(torch.stack([local[2], local[2], local[1]]))
    assert two[:, 0].tolist() == pytest.approx([0.5, 0.5, 0.0])
    # near-equal entropies (unit vectors in d = 256: all about log 256) whose float32 mean rounds
    # below every one of them: still weights that sum to one, never 0/0
    flat = F.normalize(torch.randn(3, 50, 256, generator=torch.Generator().manual_seed(0)), dim=-1)
    w = entropy_selection_weights(flat)
    assert torch.isfinite(w).all() and torch.allclose(w.sum(0), torch.ones(50))
    same = entropy_selection_weights(torch.full((3, 2, 4), 0.5))
    assert torch.allclose(same, torch.full((3, 2), 1 / 3))
    assert torch.allclose(e.sum(0), torch.ones(1))


def test_public_subset_is_the_same_for_server_and_clients():
    from mmfl.data.base import ArrayDataset

    pub = ArrayDataset({"a": torch.arange(10.0).unsqueeze(1)}, torch.zeros(10, dtype=torch.long))
    s1, s2 = select_public(pub, 4), select_public(pub, 4)
    assert len(s1) == 4 and torch.equal(s1.indices, s2.indices)
    assert select_public(pub, 0) is pub and select_public(pub, 99) is pub


def test_bad_params_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="algorithm.aggregation"):
        CreamFLParams(aggregation="median")
    with pytest.raises(ConfigError, match="algorithm.lcr_temperature"):
        CreamFLParams(lcr_temperature=0)
    with pytest.raises(ConfigError, match="algorithm.public_size"):
        CreamFLParams(public_size=-1)


# ----------------------------------------------------------------------------- federations


def raw_config(tmp_path, algo="creamfl", **over):
    """mfeat_pair (image [1,16,15] + features): a public share; clients 0-1 hold both, client 2
    only the image, client 3 only the features; client models narrower than the server's."""
    raw = {"name": algo, "rounds": 2, "seed": 0, "output_dir": str(tmp_path), "threads": 1,
           "data": {"name": "mfeat_pair", "public_fraction": 0.3},
           "partition": {"name": "iid", "num_clients": 4},
           "modalities": {"name": "explicit",
                          "holds": [["image", "features"], ["image", "features"], ["image"], ["features"]]},
           "model": {"name": "multimodal", "feat_dim": 16, "cnn_channels": [8, 8], "mlp_hidden": [64]},
           "client_models": [{"for_modalities": ["image"], "cnn_channels": [4, 4]},
                             {"for_modalities": ["features"], "mlp_hidden": [16]},
                             {"for_modalities": ["features", "image"], "mlp_hidden": [32], "cnn_channels": [4, 8]}],
           "algorithm": {"name": algo, "server_batch_size": 64} if not algo.startswith("creamfl_") else {"name": algo},
           "train": {"local_epochs": 1, "batch_size": 64, "optimizer": "adam", "lr": 0.001}}
    for k, v in over.items():
        raw[k] = v
    return raw


def test_unimodal_clients_never_send_the_modality_they_lack_and_models_differ(tmp_path, monkeypatch):
    sent, received = {}, {}
    orig = CreamFLServer.aggregate_reps

    def spy(self, replies, glob):
        for c, r in replies.items():
            sent[c] = sorted(r.arrays)
        return orig(self, replies, glob)

    monkeypatch.setattr(CreamFLServer, "aggregate_reps", spy)
    exp = experiment(raw_config(tmp_path))
    send = exp.transport.send

    def spy_send(route, messages):
        for c, m in messages.items():
            received[c] = sorted(m.arrays)
        return send(route, messages)

    exp.transport.send = spy_send
    exp.run()
    P = len(exp.federation.public)
    assert sent == {0: ["rep/features", "rep/image"], 1: ["rep/features", "rep/image"], 2: ["rep/image"],
                    3: ["rep/features"]}
    # inter needs the other modality's global representations, intra the same one's
    assert received[2] == ["global/features", "global/image"] and received[0] == received[2]
    row = load_metrics(tmp_path / "creamfl")[-1]
    d = 16
    up = {int(c): v["up"] for c, v in row["bytes_per_client"].items()}
    assert up[2] == up[3] and up[0] - up[2] == P * d * 4 < up[2]  # one [P, d] float32 per modality held
    for key in ("i2t_r1", "t2i_r1", "i2t_r10", "r1_sum", "rsum"):
        assert math.isfinite(row[key])
    assert row["clients/image"] == 3 and row["clients/features"] == 3
    # heterogeneous widths in one federation: server, image-text, image and feature clients differ
    server = exp.server.model
    widths = {c: exp.store.load(c) for c in range(4)}
    shapes = {c: {k: tuple(v.shape) for k, v in st.items() if k.startswith("model/encoders")}
              for c, st in widths.items()}
    assert shapes[0]["model/encoders.features.net.1.weight"] == (32, 123)
    assert shapes[3]["model/encoders.features.net.1.weight"] == (16, 123)
    assert not any("image" in k for k in shapes[3]) and not any("features" in k for k in shapes[2])
    assert dict(server.named_parameters())["encoders.features.net.1.weight"].shape == (64, 123)


def _server_after_one_round(tmp_path, optimizer):
    raw = raw_config(tmp_path, "creamfl", rounds=1)
    raw.pop("client_models"), raw.pop("modalities")
    raw["model"]["encoders"] = {"image": "mlp"}  # no BatchNorm: train-mode = eval-mode representations
    raw["algorithm"].update(server_optimizer=optimizer, server_lr_schedule="constant")
    exp = experiment(raw)
    exp.run()  # one round: the server's Adam has state from a public epoch and a real distillation
    return exp.server


@pytest.mark.parametrize("optimizer, moves", [("restart", False), ("shared", True), ("per_phase", True)])
def test_distilling_the_server_toward_its_own_representations_leaves_it_unchanged(tmp_path, optimizer, moves):
    """Eq. 7 with the server's own representations as targets has zero gradient; the distillation
    phase must then not move the server. With "restart" (the default) it does not move at all; one
    Adam carried across phases ("shared", the authors' code) keeps stepping along the public
    epoch's momentum, and a persistent per-phase Adam along the last round's distillation."""
    from mmfl.algorithms.creamfl_terms import public_reps

    server = _server_after_one_round(tmp_path, optimizer)
    server.train_public(1)
    own = public_reps(server.model, server.public, server.pair)
    before = {k: v.clone() for k, v in server.model.state_dict().items()}
    server.distill(own, 1)
    after = server.model.state_dict()
    changed = max(float((after[k] - before[k]).abs().max()) for k in before)
    if moves:
        assert changed > 1e-4
    else:
        assert changed == 0.0


def test_restart_zeroes_the_first_moment_and_keeps_the_second(tmp_path):
    server = _server_after_one_round(tmp_path, "restart")
    st = next(iter(server.opt.state.values()))
    v = st["exp_avg_sq"].clone()
    assert float(st["exp_avg"].abs().max()) > 0
    server.begin_phase(server.opt)
    assert float(st["exp_avg"].abs().max()) == 0.0 and torch.equal(st["exp_avg_sq"], v)


def test_server_lr_follows_the_cosine_schedule(tmp_path):
    server = _server_after_one_round(tmp_path, "restart")
    server.params = CreamFLParams(server_lr=1e-3)  # default: cosine over the run's rounds
    server.ctx.rounds = 4
    assert [server.server_lr(r) for r in range(4)] == pytest.approx(
        [1e-3 * (1 + math.cos(math.pi * r / 4)) / 2 for r in range(4)])
    server.params = CreamFLParams(server_lr=1e-3, server_lr_schedule="constant")
    assert server.server_lr(3) == 1e-3


def test_target_quality_scores_the_distillation_targets_against_the_servers_own():
    from mmfl.algorithms.creamfl_terms import target_quality

    g, img, txt = _reps(P=30)
    glob = {"image": img, "text": txt}
    same = target_quality(glob, {"image": img, "text": txt}, ("image", "text"))
    assert same["target_public_r1_sum"] == same["server_public_r1_sum"] > 150  # nearly every pair retrieved
    assert same["target_cos/image"] == pytest.approx(1.0)
    perm = torch.randperm(30, generator=g)
    shuffled = target_quality(glob, {"image": img[perm], "text": txt}, ("image", "text"))
    assert shuffled["target_public_r1_sum"] < 0.2 * same["server_public_r1_sum"]
    assert shuffled["target_cos/image"] < 0.5


def test_resume_continues_exactly(tmp_path):
    run_config(raw_config(tmp_path / "a", "fedmd"))
    raw = raw_config(tmp_path / "b", "fedmd")
    run_config({**raw, "rounds": 1})
    run_config(raw, resume=True)
    a, b = load_metrics(tmp_path / "a" / "fedmd"), load_metrics(tmp_path / "b" / "fedmd")
    keys = ("i2t_r1", "t2i_r5", "distill_loss", "train_loss", "bytes_up")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]


def test_weight_sharing_needs_one_architecture(tmp_path):
    with pytest.raises(ConfigError, match="server's architecture"):
        run_config(raw_config(tmp_path, "creamfl_fedavg"))


def test_weight_sharing_averages_the_held_modules(tmp_path):
    raw = raw_config(tmp_path, "creamfl_fediot", rounds=1)
    raw.pop("client_models")
    exp = experiment(raw)
    before = {k: v.clone() for k, v in exp.server.model.state_dict().items()}
    exp.run()
    after = exp.server.model.state_dict()
    assert not torch.equal(before["encoders.image.net.0.weight"], after["encoders.image.net.0.weight"])
    assert torch.equal(before["heads.image.weight"], after["heads.image.weight"])  # heads stay on clients
    row = load_metrics(tmp_path / "creamfl_fediot")[-1]
    assert math.isfinite(row["r1_sum"])


def test_a_data_set_without_a_public_set_is_refused(tmp_path):
    raw = raw_config(tmp_path)
    raw["data"] = {"name": "mfeat_pair"}
    with pytest.raises(ConfigError, match="no public set"):
        experiment(raw)


@pytest.mark.parametrize("name", NAMES)
def test_every_method_runs_from_the_cli(tmp_path, name, capsys):
    assert name in ALGORITHMS
    over = ["rounds=1", f"algorithm.name={name}", f"output_dir={tmp_path}", "data.name=mfeat_pair",
            "data.public_fraction=0.2", "partition.num_clients=3", "model.name=multimodal", "model.feat_dim=8",
            "model.cnn_channels=[4]", "model.mlp_hidden=[16]", "train.local_epochs=1", "threads=1"]
    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "cli"\n')
    argv = ["run", str(cfg), "--no-progress"]
    for o in over:
        argv += ["--set", o]
    assert cli_main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert '"final_r1_sum"' in out and '"final_i2t_r10"' in out


@pytest.mark.parametrize("module", ["mmfl.engine.client_runtime", "mmfl.flower.client_app"])
def test_entry_modules_import_first(module):
    # a Flower SuperNode imports the ClientApp module first: no circular import through the algorithms
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
