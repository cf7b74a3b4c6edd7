"""PCME (Chun et al., CVPR 2021) as CreamFL's image-text loss: the match probability, the soft
contrastive loss and the KL term by hand; gradients reach a, b and the variance heads; the
mechanism on a tiny paired set; a CreamFL run with multimodal_loss = "pcme", and the default
(InfoNCE) path left as it was."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mmfl.algorithms.creamfl import CreamFLParams
from mmfl.algorithms.creamfl_terms import info_nce, pair_loss
from mmfl.algorithms.pcme import (kl_to_standard_normal, match_logits, match_probability, pcme_loss,
                                  pcme_pair_loss, sample_embeddings, soft_contrastive_loss)
from mmfl.errors import ConfigError
from mmfl.models.multimodal import MultimodalModel, MultimodalParams
from mmfl.models.uncertainty import INIT_A, INIT_B
from mmfl.report import load_metrics

from helpers import run_config

sys.path.insert(0, str(Path(__file__).parent))
from test_creamfl import raw_config  # noqa: E402  (the tiny CreamFL federation)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ----------------------------------------------------------------------------- the terms by hand


def test_one_sample_at_zero_variance_is_the_sigmoid_of_the_distance():
    # J = 1, sigma = 0: z = mu, p(m | x_k, y_l) = sigmoid(-a ||x_k - y_l|| + b) (eq. 5)
    mx = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    my = torch.tensor([[0.6, 0.8], [-1.0, 0.0]])
    none = torch.full_like(mx, float("-inf"))  # exp(-inf / 2) = 0: no noise at all
    zx, zy = sample_embeddings(mx, none, 1), sample_embeddings(my, none, 1)
    assert torch.equal(zx[:, 0], mx) and zx.shape == (2, 1, 2)
    a, b = torch.tensor(2.0), torch.tensor(1.5)
    p = match_probability(match_logits(zx, zy, a, b))
    for k in range(2):
        for l in range(2):
            d = math.dist(mx[k].tolist(), my[l].tolist())
            assert p[k, l].item() == pytest.approx(sigmoid(-2.0 * d + 1.5), rel=1e-5)


def test_match_probability_is_the_mean_over_the_j_by_j_sample_pairs():
    # eq. 4 / 7 with J = 2 given samples: 1/J^2 sum_{j, j'} sigmoid(-a ||z^j - z'^j'|| + b)
    zx = torch.tensor([[[0.0, 0.0], [1.0, 0.0]]])  # one item, two samples
    zy = torch.tensor([[[0.0, 1.0], [0.0, 0.0]]])
    a, b = torch.tensor(1.0), torch.tensor(0.5)
    logits = match_logits(zx, zy, a, b)
    assert logits.shape == (1, 1, 2, 2)
    dists = [[1.0, 0.0], [math.sqrt(2.0), 1.0]]
    hand = sum(sigmoid(-d + 0.5) for row in dists for d in row) / 4
    assert match_probability(logits).item() == pytest.approx(hand, rel=1e-5)


def test_soft_contrastive_loss_is_the_pairwise_binary_cross_entropy():
    # eq. 3, mean over the 2 x 2 pairs: -log p on the diagonal, -log(1 - p) off it
    logits = torch.tensor([[2.0, -1.0], [0.5, 3.0]]).reshape(2, 2, 1, 1)
    matched = torch.eye(2, dtype=torch.bool)
    p = [[sigmoid(2.0), sigmoid(-1.0)], [sigmoid(0.5), sigmoid(3.0)]]
    hand = -(math.log(p[0][0]) + math.log(1 - p[0][1]) + math.log(1 - p[1][0]) + math.log(p[1][1])) / 4
    assert soft_contrastive_loss(logits, matched).item() == pytest.approx(hand, rel=1e-6)
    # with J^2 samples the log of the Monte-Carlo mean, not the mean of the logs
    two = torch.tensor([4.0, -4.0]).reshape(1, 1, 1, 2)
    hand = -math.log((sigmoid(4.0) + sigmoid(-4.0)) / 2)
    assert soft_contrastive_loss(two, torch.ones(1, 1, dtype=torch.bool)).item() == pytest.approx(hand, rel=1e-6)
    # far apart and unmatched: finite, about 0 (log space, no log(0))
    far = torch.tensor([-200.0]).reshape(1, 1, 1, 1)
    assert soft_contrastive_loss(far, torch.zeros(1, 1, dtype=torch.bool)).item() == pytest.approx(0.0, abs=1e-12)
    assert soft_contrastive_loss(far, torch.ones(1, 1, dtype=torch.bool)).item() == pytest.approx(200.0, rel=1e-6)


def test_kl_to_standard_normal_by_hand():
    mu = torch.tensor([[0.6, 0.8]])
    logvar = torch.tensor([[0.0, math.log(2.0)]])
    hand = 0.5 * ((1 + 0.36 - 1 - 0) + (2 + 0.64 - 1 - math.log(2.0)))
    assert kl_to_standard_normal(mu, logvar).item() == pytest.approx(hand, rel=1e-6)
    assert kl_to_standard_normal(torch.zeros(1, 3), torch.zeros(1, 3)).item() == 0.0


def test_pcme_loss_is_the_soft_contrastive_loss_plus_the_scaled_kl():
    g = torch.Generator().manual_seed(0)
    mx, my = F.normalize(torch.randn(3, 4, generator=g), dim=-1), F.normalize(torch.randn(3, 4, generator=g), dim=-1)
    lx, ly = torch.randn(3, 4, generator=g) - 3, torch.randn(3, 4, generator=g) - 3
    a, b = torch.tensor(INIT_A), torch.tensor(INIT_B)
    loss, info = pcme_loss(mx, lx, my, ly, a, b, samples=5, vib_weight=0.1, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(1)  # the same draws: x's samples first, then y's
    logits = match_logits(sample_embeddings(mx, lx, 5, gen), sample_embeddings(my, ly, 5, gen), a, b)
    soft = soft_contrastive_loss(logits, torch.eye(3, dtype=torch.bool))
    kl = kl_to_standard_normal(mx, lx).sum() + kl_to_standard_normal(my, ly).sum()
    assert loss.item() == pytest.approx((soft + 0.1 / (2 * 9) * kl).item(), rel=1e-6)
    assert info["soft_contrastive"] == pytest.approx(soft.item(), rel=1e-6)


def test_zero_samples_is_the_soft_contrastive_loss_of_the_means():
    # the CreamFL authors' code: the means only (J = 1 at zero variance), no KL whatever beta
    mx = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    my = torch.tensor([[0.6, 0.8], [-1.0, 0.0]])
    lv = torch.zeros(2, 2)
    a, b = torch.tensor(2.0), torch.tensor(1.5)
    loss, _ = pcme_loss(mx, lv, my, lv, a, b, samples=0, vib_weight=1.0)
    p = [[sigmoid(-2.0 * math.dist(mx[k].tolist(), my[l].tolist()) + 1.5) for l in range(2)] for k in range(2)]
    hand = -(math.log(p[0][0]) + math.log(1 - p[0][1]) + math.log(1 - p[1][0]) + math.log(p[1][1])) / 4
    assert loss.item() == pytest.approx(hand, rel=1e-5)


def test_samples_follow_the_gaussian():
    mu, logvar = torch.tensor([[1.0, -2.0]]), torch.tensor([[math.log(0.25), math.log(4.0)]])
    z = sample_embeddings(mu, logvar, 20000, torch.Generator().manual_seed(0))[0]
    assert z.mean(0).tolist() == pytest.approx([1.0, -2.0], abs=0.05)
    assert z.var(0).tolist() == pytest.approx([0.25, 4.0], rel=0.05)


# ----------------------------------------------------------------------------- the model's heads


def tiny_model(**kw) -> MultimodalModel:
    torch.manual_seed(0)
    return MultimodalModel({"a": (6,), "b": (5,)}, 3, feat_dim=16, mlp_hidden=[32], **kw)


def test_default_model_is_unchanged_and_heads_are_built_last():
    plain, with_heads = tiny_model(), tiny_model(uncertainty=True)
    sd, sdu = plain.state_dict(), with_heads.state_dict()
    assert plain.uncertainty is None and not any(k.startswith("uncertainty.") for k in sd)
    assert set(sdu) - set(sd) == {"uncertainty.a", "uncertainty.b", "uncertainty.logvar.a.weight",
                                  "uncertainty.logvar.a.bias", "uncertainty.logvar.b.weight",
                                  "uncertainty.logvar.b.bias"}
    assert all(torch.equal(sd[k], sdu[k]) for k in sd)  # every other module draws the same tensors
    assert with_heads.uncertainty.logvar["a"].bias[0].item() == pytest.approx(math.log(0.1 ** 2 / 16), rel=1e-6)
    one = tiny_model(uncertainty=True).keep_only(["a"])
    assert list(one.uncertainty.logvar) == ["a"]  # an image-only client keeps no text head
    with pytest.raises(ConfigError, match="model.uncertainty"):
        MultimodalParams(uncertainty="yes")
    with pytest.raises(ConfigError, match="model.uncertainty_init_noise"):
        MultimodalParams(uncertainty_init_noise=-1.0)
    with pytest.raises(ConfigError, match="model.uncertainty_init_ab"):
        MultimodalParams(uncertainty_init_ab=0.0)
    h = tiny_model(uncertainty=True, uncertainty_init_ab=10.0).uncertainty
    assert h.a.item() == 10.0 and h.b.item() == 10.0


def test_gradients_reach_a_b_and_the_uncertainty_heads():
    model = tiny_model(uncertainty=True)
    g = torch.Generator().manual_seed(0)
    inputs = {"a": torch.randn(4, 6, generator=g), "b": torch.randn(4, 5, generator=g)}
    pcme_pair_loss(model, inputs, ("a", "b"), samples=3, vib_weight=1e-3).backward()
    h = model.uncertainty
    for p in (h.a, h.b, h.logvar["a"].weight, h.logvar["b"].weight, model.encoders["a"].net[1].weight,
              model.proj["b"][0].weight):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_pcme_without_heads_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match="model.uncertainty = true"):
        pcme_pair_loss(tiny_model(), {"a": torch.zeros(2, 6), "b": torch.zeros(2, 5)}, ("a", "b"))
    with pytest.raises(ConfigError, match="algorithm.multimodal_loss"):
        CreamFLParams(multimodal_loss="clip")
    with pytest.raises(ConfigError, match="algorithm.pcme_samples"):
        CreamFLParams(pcme_samples=-1)
    with pytest.raises(ConfigError, match="algorithm.pcme_vib_weight"):
        CreamFLParams(pcme_vib_weight=-1.0)


def test_default_pair_loss_is_infonce():
    assert CreamFLParams().multimodal_loss == "infonce"
    z = {"a": F.normalize(torch.tensor([[1.0, 0.2], [0.1, 1.0]]), dim=-1),
         "b": F.normalize(torch.tensor([[0.9, 0.0], [0.0, 1.0]]), dim=-1)}
    got = pair_loss(tiny_model(uncertainty=True), {}, z, ("a", "b"), CreamFLParams())
    assert got.item() == info_nce(z["a"], z["b"], 0.1).item()


# ----------------------------------------------------------------------------- mechanism


def paired_set(n=32, seed=0):
    """Constructed pairs: y is a fixed nonlinear function of x plus noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = torch.tanh(x @ torch.randn(6, 5, generator=g)) + 0.1 * torch.randn(n, 5, generator=g)
    return {"a": x, "b": y}


@torch.no_grad()
def match_stats(model, inputs):
    """Mean match probability of the positive pairs and of the negatives (J = 7, fixed draws),
    and image-to-text R@1 of the mean embeddings."""
    mu = {m: F.normalize(model.proj[m](model.encoders[m](inputs[m])), dim=-1) for m in "ab"}
    lv = {m: model.uncertainty.logvar[m](model.encoders[m](inputs[m])) for m in "ab"}
    _, info = pcme_loss(mu["a"], lv["a"], mu["b"], lv["b"], model.uncertainty.a, model.uncertainty.b, 7, 0.0,
                        torch.Generator().manual_seed(1))
    r1 = ((mu["a"] @ mu["b"].t()).argmax(1) == torch.arange(len(mu["a"]))).float().mean().item()
    return info["p_pos"], info["p_neg"], r1


def train_pcme(model, inputs, steps=100):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(steps):
        loss = pcme_pair_loss(model, inputs, ("a", "b"))
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_pcme_raises_the_match_probability_of_positive_pairs_and_retrieval():
    model = tiny_model(uncertainty=True)
    inputs = paired_set()
    p_pos0, p_neg0, r1_0 = match_stats(model, inputs)
    train_pcme(model, inputs)
    p_pos, p_neg, r1 = match_stats(model, inputs)
    assert abs(p_pos0 - p_neg0) < 0.1 and p_pos - p_neg > 0.5  # positives now match, negatives do not
    assert r1 >= 0.8 and r1_0 <= 0.2  # chance is 1/32


def test_with_the_authors_initial_variance_pcme_has_not_started_after_the_same_steps():
    # the reason for uncertainty_init_noise = 0.1: PyTorch's default init of the variance heads
    # (log sigma^2 ~ 0, noise of norm ~ sqrt(feat_dim) around unit-norm means) buries the distances
    model = tiny_model(uncertainty=True, uncertainty_init_noise=0.0)
    inputs = paired_set()
    train_pcme(model, inputs)
    p_pos, p_neg, r1 = match_stats(model, inputs)
    assert p_pos - p_neg < 0.1 and r1 <= 0.2


# ----------------------------------------------------------------------------- CreamFL


def run_creamfl(tmp_path, rounds=2, loss="infonce", uncertainty=False):
    raw = raw_config(tmp_path, rounds=rounds)
    raw["model"] = {**raw["model"], "uncertainty": uncertainty}
    raw["algorithm"] = {**raw["algorithm"], "multimodal_loss": loss}
    exp = run_config(raw)
    return exp, load_metrics(tmp_path / "creamfl")


def test_creamfl_with_pcme_runs_and_sends_the_same_bytes(tmp_path):
    exp, rows = run_creamfl(tmp_path / "pcme", loss="pcme", uncertainty=True)
    _, ref = run_creamfl(tmp_path / "infonce", uncertainty=True)
    for row in rows:
        assert all(math.isfinite(row[k]) for k in ("r1_sum", "rsum", "train_loss", "server_public_loss"))
    assert [r["bytes_up"] for r in rows] == [r["bytes_up"] for r in ref]  # the mean is what is exchanged
    assert [r["bytes_down"] for r in rows] == [r["bytes_down"] for r in ref]
    assert [r["train_loss"] for r in rows] != [r["train_loss"] for r in ref]
    # image-text clients (0, 1) keep their heads and a, b in their own state, trained
    for c in (0, 1):
        st = exp.store.load(c)
        assert {"model/uncertainty.a", "model/uncertainty.logvar.image.weight",
                "model/uncertainty.logvar.features.weight"} <= set(st)
        assert st["model/uncertainty.a"].item() != INIT_A and st["model/uncertainty.b"].item() != INIT_B
    heads = exp.server.model.uncertainty  # the server's public epoch trains with PCME too
    assert heads.a.item() != INIT_A and heads.b.item() != INIT_B


def test_infonce_runs_are_unchanged_by_the_heads(tmp_path):
    # the default loss never touches the heads: with or without them every reported number is equal
    _, plain = run_creamfl(tmp_path / "plain", rounds=1)
    _, heads = run_creamfl(tmp_path / "heads", rounds=1, uncertainty=True)
    keys = ("r1_sum", "rsum", "train_loss", "task_loss", "lcr_loss", "distill_loss", "server_public_loss",
            "bytes_up", "bytes_down")
    assert [[r[k] for k in keys] for r in plain] == [[r[k] for k in keys] for r in heads]


def test_pcme_without_heads_stops_the_run_with_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="model.uncertainty = true"):
        run_creamfl(tmp_path, rounds=1, loss="pcme")


def test_a_pcme_run_resumes_exactly(tmp_path):
    # the heads, a, b and their Adam state are checkpointed; the noise is drawn from seeded generators
    raw = raw_config(tmp_path / "a", rounds=2)
    raw["model"] = {**raw["model"], "uncertainty": True}
    raw["algorithm"] = {**raw["algorithm"], "multimodal_loss": "pcme"}
    run_config(raw)
    half = {**raw, "output_dir": str(tmp_path / "b")}
    run_config({**half, "rounds": 1})
    run_config(half, resume=True)
    keys = ("r1_sum", "rsum", "train_loss", "server_public_loss", "distill_loss")
    a, b = load_metrics(tmp_path / "a" / "creamfl"), load_metrics(tmp_path / "b" / "creamfl")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
