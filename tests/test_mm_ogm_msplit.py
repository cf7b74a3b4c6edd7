"""FedOGM (OGM-GE in local training): hand-computed scores and coefficients, gradient
modulation, and a tiny end-to-end run. (FedMSplit's tests are in tests/test_fedmsplit.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from mmfl.algorithms.base import ClientContext
from mmfl.algorithms.fedogm import (FedOGMClient, FedOGMParams, modality_outputs, ogm_coefficients,
                                    true_class_scores)
from mmfl.config import TrainConfig
from mmfl.data.base import PRESENT, ArrayDataset, DatasetMeta
from mmfl.core.message import Message
from mmfl.engine.runner import Experiment
from mmfl.errors import ConfigError
from mmfl.report import load_metrics
from mmfl.models.multimodal import MultimodalModel

from helpers import MFEAT_D as BASE, run


META = DatasetMeta("tiny", 3, {"a": (4,), "b": (3,)})


def tiny_model(seed: int = 0) -> MultimodalModel:
    torch.manual_seed(seed)
    return MultimodalModel(dict(META.modalities), META.num_classes, feat_dim=2, mlp_hidden=[5])


# ============================================================================= FedOGM


def test_scores_and_coefficients_by_hand():
    logits = {"a": torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]),
              "b": torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [5.0, 0.0, 0.0]])}
    y = torch.tensor([0, 1, 2])
    e = math.e
    s = true_class_scores(logits, y)  # OGM-GE eq. 9
    assert s["a"] == pytest.approx(e ** 2 / (e ** 2 + 2) + e / (e + 2) + 1 / 3)
    assert s["b"] == pytest.approx(2 / 3 + 1 / (e ** 5 + 2))
    s = true_class_scores(logits, y, torch.tensor([True, True, False]))  # only the masked rows
    assert s["b"] == pytest.approx(2 / 3)

    k, dom, ratio = ogm_coefficients({"a": 1.5, "b": 0.5}, alpha=0.8)  # eq. 10, 11
    assert (dom, ratio) == ("a", pytest.approx(3.0))
    assert k == {"a": pytest.approx(1 - math.tanh(0.8 * 3.0)), "b": 1.0}  # 1 - tanh(alpha * rho)
    k, dom, ratio = ogm_coefficients({"a": 0.7, "b": 1.4}, alpha=0.5)
    assert dom == "b" and ratio == pytest.approx(2.0) and k == {"a": 1.0, "b": pytest.approx(1 - math.tanh(0.5 * 2.0))}
    k, _, ratio = ogm_coefficients({"a": 1.0, "b": 1.0}, alpha=0.8)  # balanced: no modulation
    assert ratio == 1.0 and k == {"a": 1.0, "b": 1.0}
    # M > 2: dominant = argmax, ratio = s_dom / mean of the others
    k, dom, ratio = ogm_coefficients({"a": 1.0, "b": 2.0, "c": 4.0}, alpha=1.0)
    assert dom == "c" and ratio == pytest.approx(4 / 1.5)
    assert k == {"a": 1.0, "b": 1.0, "c": pytest.approx(1 - math.tanh(4 / 1.5))}
    # the hand value: rho = 1.17, alpha = 0.8 gives 1 - tanh(0.936) = 0.2667 (the old
    # relu(rho - 1) form gave 0.87, 3-10x too weak a modulation)
    k, _, _ = ogm_coefficients({"a": 1.17, "b": 1.0}, alpha=0.8)
    assert k["a"] == pytest.approx(0.26662, abs=1e-4)
    k, _, _ = ogm_coefficients({"a": 1.0 + 1e-9, "b": 1.0}, alpha=0.8)  # barely dominant: full strength
    assert k["a"] == pytest.approx(1 - math.tanh(0.8), abs=1e-6)


def ogm_client(seed: int = 11, **params) -> FedOGMClient:
    data = ArrayDataset({"a": torch.zeros(4, 4), "b": torch.zeros(4, 3)}, torch.zeros(4, dtype=torch.int64))
    ctx = ClientContext(cid=0, rnd=0, seed=seed, data=data, test_data=None, meta=META, train=TrainConfig(),
                        state={}, model_pool=None, modalities=("a", "b"))
    return FedOGMClient(FedOGMParams(**params), ctx)


def ogm_step(client: FedOGMClient, model: MultimodalModel):
    """One step's loss/backward/before_step on a batch where b dominates; returns (grads before, after)."""
    g = torch.Generator().manual_seed(0)
    inputs = {"a": torch.randn(4, 4, generator=g), "b": torch.randn(4, 3, generator=g),
              PRESENT + "b": torch.tensor([True, True, True, False])}
    labels = torch.tensor([0, 0, 1, 2])
    with torch.no_grad():  # heads by hand: a uniform, b favours class 0
        model.heads["a"].weight.zero_(), model.heads["a"].bias.zero_()
        model.heads["b"].weight.zero_(), model.heads["b"].bias.copy_(torch.tensor([3.0, 0.0, 0.0]))
    client.begin(model, Message())
    model.zero_grad()
    client.loss(model, inputs, labels, Message()).backward()
    before = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    coeffs = dict(client._coeffs)
    client.before_step()
    after = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return coeffs, before, after


def test_client_coefficient_and_modulated_gradients_by_hand():
    client, model = ogm_client(ge=False), tiny_model()
    coeffs, before, after = ogm_step(client, model)
    # rows 0..2 hold both modalities (row 3 lacks b): s_a = 3 * 1/3, s_b = (2 e^3 + 1) / (e^3 + 2)
    e3 = math.exp(3)
    ratio = (2 * e3 + 1) / (e3 + 2)
    k = 1 - math.tanh(0.8 * ratio)  # OGM-GE eq. 11
    assert coeffs == {"a": 1.0, "b": pytest.approx(k)}
    assert client._log == [(pytest.approx(k), pytest.approx(ratio))]
    assert any(n.startswith("encoders.b.") for n in before)
    for n, g in before.items():
        if n.startswith("encoders.b."):
            assert torch.allclose(after[n], g * k, rtol=1e-6, atol=0), n  # the dominant encoder: k * g
        else:
            assert torch.equal(after[n], g), n  # the weak encoder, projectors, heads, classifier: untouched
    reply = client.reply_scalars(model, {"train_loss": 0.0, "steps": 1})
    assert reply["ogm_coeff"] == pytest.approx(k) and reply["ogm_ratio"] == pytest.approx(ratio)


def test_ge_noise_is_added_and_reproducible_from_the_seed():
    runs = [ogm_step(ogm_client(seed=s, ge=True), tiny_model()) for s in (11, 11, 12)]
    (k, before, a1), (_, _, a2), (_, _, a3) = runs
    enc = [n for n in before if n.startswith("encoders.")]
    for n in enc:  # both modalities' encoders get noise (as the authors' code), the dominant one scaled
        assert not torch.allclose(a1[n], before[n] * k[n.split(".")[1]]), n
        assert torch.equal(a1[n], a2[n]), n  # same ctx.seed: the same noise
    assert any(not torch.equal(a1[n], a3[n]) for n in enc)  # another seed: other noise
    for n in before:
        if not n.startswith("encoders."):
            assert torch.equal(a1[n], before[n]), n


def test_ogm_classifier_split_scores_and_config_errors():
    model = tiny_model()
    out = model({"a": torch.randn(2, 4), "b": torch.randn(2, 3)})
    w, b = model.classifier.weight, model.classifier.bias  # concat slots: a = columns 0..1, b = 2..3
    split = modality_outputs(model, out, "classifier")
    assert torch.allclose(split["b"], out["mod_reps"]["b"] @ w[:, 2:4].T + b / 2)
    assert torch.allclose(modality_outputs(model, out, "head")["a"], out["mod_logits"]["a"])
    with pytest.raises(ConfigError):
        FedOGMParams(alpha=-1.0)
    with pytest.raises(ConfigError):
        FedOGMParams(probe=False)  # score = "head" needs trained heads
    with pytest.raises(ConfigError):
        FedOGMParams(modulation_start_round=3, modulation_end_round=2)


def test_ogm_outside_the_modulation_window_is_mfedavg():
    client, model = ogm_client(ge=True, modulation_start_round=1), tiny_model()
    client.begin(model, Message())
    assert not client._active


# ============================================================================= end to end

# mfeat views pix + fou, 4 clients, FedCMI's case D (Dirichlet + half the clients unimodal).
def run_exp(tmp_path, name, *over, rounds=2, resume=False) -> Experiment:
    return run(tmp_path, name, *over, base=BASE, rounds=rounds, resume=resume)


def check_rows(rows, n):
    assert len(rows) == n
    for r in rows:
        for key in ("accuracy", "accuracy/pix", "accuracy/fou", "train_loss"):
            assert math.isfinite(r[key]), key


def test_fedogm_end_to_end(tmp_path):
    rows = load_metrics(run_exp(tmp_path, "ogm", "algorithm.name=fedogm").run_dir)
    check_rows(rows, 2)
    assert all(0.0 < r["ogm_coeff"] <= 1.0 and r["ogm_ratio"] >= 1.0 for r in rows)
