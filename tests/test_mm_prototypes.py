"""MFedProto and FedPMR (mmfl.algorithms.prototypes): prototype aggregation, the FedProto
term and local prototypes on hand numbers, PMR's choice of the weak modality and its
terms, and both algorithms end to end (case D) with MFedProto's resume."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from mmfl.algorithms.base import ServerContext
from mmfl.algorithms.prototypes import (PROTO, PROTO_COUNT, STATE, FedPMRParams, MFedProtoClient,
                                        MFedProtoParams, MFedProtoServer, aggregate_prototypes, class_means,
                                        fedproto_term, pmr_terms)
from mmfl.config import TrainConfig
from mmfl.data.base import PRESENT, ArrayDataset, DatasetMeta
from mmfl.core.message import Message
from mmfl.engine.runner import Experiment
from mmfl.core.training import state_of
from mmfl.errors import ConfigError
from mmfl.report import load_metrics
from mmfl.models.multimodal import MultimodalModel

from helpers import run as run_with

META = DatasetMeta("tiny", 3, {"a": (4,), "b": (3,)})


def tiny_model() -> MultimodalModel:
    """Encoders Linear(., 2) + ReLU picking the first two input coordinates, no projector:
    z_m = f_m = relu(x_m[:, :2])."""
    torch.manual_seed(0)
    model = MultimodalModel(dict(META.modalities), META.num_classes, feat_dim=2, mlp_hidden=[], projector="none")
    with torch.no_grad():
        for m, n in (("a", 4), ("b", 3)):
            lin = model.encoders[m].net[1]
            lin.weight.copy_(torch.eye(2, n))
            lin.bias.zero_()
    return model


def tiny_batch():
    inputs = {"a": torch.tensor([[1.0, 2, 9, 9], [3, 1, 9, 9], [0, 4, 9, 9]]),
              "b": torch.tensor([[2.0, 2, 9], [1, 0, 9], [5, 5, 9]]),
              PRESENT + "a": torch.tensor([True, True, False]),
              PRESENT + "b": torch.tensor([True, True, True])}
    return inputs, torch.tensor([0, 1, 2])


# ----------------------------------------------------------------------------- MFedProto


def test_prototype_aggregation_is_the_count_weighted_mean():
    # client 1 has classes 0, 1; client 2 has classes 0, 2 (class 1 missing there)
    p1, n1 = torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]]), torch.tensor([2.0, 1.0, 0.0])
    p2, n2 = torch.tensor([[5.0, 6.0], [0.0, 0.0], [7.0, 8.0]]), torch.tensor([2.0, 0.0, 3.0])
    protos, counts = aggregate_prototypes([p1, p2], [n1, n2])
    # class 0: (2*[1,2] + 2*[5,6]) / 4; class 1: client 1 alone; class 2: client 2 alone
    assert torch.equal(protos, torch.tensor([[3.0, 4.0], [3.0, 4.0], [7.0, 8.0]]))
    assert torch.equal(counts, torch.tensor([4.0, 1.0, 3.0]))
    # a class nobody reports keeps its previous prototype and count
    prev = (torch.tensor([[9.0, 9.0], [8.0, 8.0], [7.0, 7.0]]), torch.tensor([1.0, 5.0, 1.0]))
    protos, counts = aggregate_prototypes([p1], [n1], previous=prev)
    assert torch.equal(protos, torch.tensor([[1.0, 2.0], [3.0, 4.0], [7.0, 7.0]]))
    assert torch.equal(counts, torch.tensor([2.0, 1.0, 1.0]))


def test_server_averages_prototypes_apart_from_the_model_and_checkpoints_them():
    server = MFedProtoServer(MFedProtoParams(), ServerContext(META, TrainConfig(), 0, 2, make_model=tiny_model,
                                                              client_modalities=[("a", "b"), ("a",)]))
    assert server.round_arrays(0) == {}  # no prototypes before the first aggregation
    state = state_of(tiny_model())
    only_a = {k: v for k, v in state.items() if not k.startswith(("encoders.b", "proj.b", "heads.b"))}
    replies = {
        0: Message(arrays={**state, PROTO + "a": torch.tensor([[1.0, 2], [3, 4], [0, 0]]),
                           PROTO_COUNT + "a": torch.tensor([2.0, 1, 0]),
                           PROTO + "b": torch.tensor([[1.0, 1], [0, 0], [0, 0]]),
                           PROTO_COUNT + "b": torch.tensor([1.0, 0, 0])},
                   scalars={"num_examples": 3, "train_loss": 1.0}),
        1: Message(arrays={**only_a, PROTO + "a": torch.tensor([[5.0, 6], [0, 0], [7, 8]]),
                           PROTO_COUNT + "a": torch.tensor([2.0, 0, 3])},
                   scalars={"num_examples": 5, "train_loss": 1.0}),
    }
    server.aggregate_train(0, replies)
    assert torch.equal(server.protos["a"], torch.tensor([[3.0, 4], [3, 4], [7, 8]]))
    assert torch.equal(server.counts["b"], torch.tensor([1.0, 0, 0]))
    # a client receives its own modalities' prototypes only
    msgs = server.configure_train(1, [0, 1])
    assert {PROTO + "a", PROTO + "b", PROTO_COUNT + "b"} <= set(msgs[0].arrays)
    assert PROTO + "a" in msgs[1].arrays and PROTO + "b" not in msgs[1].arrays
    # the prototypes are part of the server state (checkpoint / resume)
    sd = server.state_dict()
    assert torch.equal(sd[STATE + PROTO + "a"], server.protos["a"])
    other = MFedProtoServer(MFedProtoParams(), server.ctx)
    other.load_state_dict(sd)
    assert torch.equal(other.protos["a"], server.protos["a"])
    assert torch.equal(other.counts["b"], server.counts["b"])


def test_fedproto_term_and_local_prototypes_on_hand_numbers():
    model = tiny_model()
    inputs, labels = tiny_batch()
    out = model(inputs)
    arrays = {PROTO + "a": torch.tensor([[0.0, 0], [1, 1], [0, 0]]), PROTO_COUNT + "a": torch.tensor([1.0, 1, 0]),
              PROTO + "b": torch.tensor([[1.0, 1], [0, 0], [4, 4]]), PROTO_COUNT + "b": torch.tensor([2.0, 0, 1])}
    # a: samples 0, 1 (sample 2 lacks a): (||[1,2]-[0,0]||^2 + ||[3,1]-[1,1]||^2) / 2 = (5 + 4) / 2
    # b: samples 0, 2 (class 1 has no global prototype): (||[2,2]-[1,1]||^2 + ||[5,5]-[4,4]||^2) / 2 = 2
    term = fedproto_term(out["mod_reps"], out["present"], labels, arrays)
    assert float(term.detach()) == pytest.approx((4.5 + 2.0) / 2)  # averaged over the d = 2 dimensions (MSE)
    assert float(fedproto_term(out["mod_reps"], out["present"], labels, {})) == 0.0  # round 1: no prototypes

    # the client's loss adds lambda times it to MFedAvg's
    msg = Message(arrays=arrays)
    plain = MFedProtoClient(MFedProtoParams(lam=0.0), SimpleNamespace()).loss(model, inputs, labels, msg)
    with_lam = MFedProtoClient(MFedProtoParams(lam=2.0), SimpleNamespace()).loss(model, inputs, labels, msg)
    assert float((with_lam - plain).detach()) == pytest.approx(2.0 * 3.25, rel=1e-6)
    with pytest.raises(ConfigError):
        MFedProtoParams(lam=-1.0)

    # local prototypes: mean z_m per class over the samples holding m
    data = ArrayDataset(inputs, labels)
    local = class_means(model, data, "mod_reps", 3)
    protos_a, counts_a = local["a"]
    assert torch.equal(protos_a, torch.tensor([[1.0, 2], [3, 1], [0, 0]]))
    assert torch.equal(counts_a, torch.tensor([1.0, 1, 0]))  # sample 2 (class 2) lacks a
    assert torch.equal(local["b"][0], torch.tensor([[2.0, 2], [1, 0], [5, 5]]))
    assert model.training  # the model's mode is restored


# ----------------------------------------------------------------------------- PMR


def pmr_case(sharp: str):
    """Two classes; modality ``sharp`` sits on its prototypes (s ~ 2), the other halfway
    between its two (s = 1). Sample 2 lacks the other modality (its feature is junk)."""
    blunt = "b" if sharp == "a" else "a"
    protos = {sharp: (torch.tensor([[0.0, 0.0], [4.0, 0.0]]), torch.tensor([1.0, 1.0])),
              blunt: (torch.tensor([[0.0, 0.0], [2.0, 0.0]]), torch.tensor([1.0, 1.0]))}
    feats = {sharp: torch.tensor([[0.0, 0.0], [4.0, 0.0], [4.0, 0.0]], requires_grad=True),
             blunt: torch.tensor([[1.0, 0.0], [1.0, 0.0], [100.0, 100.0]], requires_grad=True)}
    present = {sharp: torch.tensor([True, True, True]), blunt: torch.tensor([True, True, False])}
    return feats, present, torch.tensor([0, 1, 1]), protos, blunt


@pytest.mark.parametrize("sharp", ["a", "b"])
def test_pmr_weak_modality_gets_the_prototype_cross_entropy(sharp):
    feats, present, labels, protos, blunt = pmr_case(sharp)
    step = pmr_terms(feats, present, labels, protos, alpha=0.7)
    assert step.dominant == sharp and step.weak == [blunt]
    assert step.scores[blunt] == pytest.approx(1.0)  # two samples at p = 1/2 (sample 2 lacks it)
    assert step.scores[sharp] == pytest.approx(2 / (1 + math.exp(-16)))
    # alpha * CE over the weak modality's samples: -log(1/2) each
    assert float(step.loss.detach()) == pytest.approx(0.7 * math.log(2))
    step.loss.backward()
    assert torch.count_nonzero(feats[sharp].grad) == 0  # nothing on the dominant modality
    assert torch.count_nonzero(feats[blunt].grad[:2]) > 0
    assert torch.count_nonzero(feats[blunt].grad[2]) == 0  # the sample lacking it


def test_pmr_entropy_on_the_dominant_and_balanced_or_unimodal_batches():
    feats, present, labels, protos, _ = pmr_case("a")
    step = pmr_terms(feats, present, labels, protos, alpha=1.0, beta=0.5)
    # dominant a: every sample holds it; sample 0: softmax([0, -16]), samples 1, 2: softmax([-16, 0])
    p = 1 / (1 + math.exp(-16))
    h = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert float(step.loss.detach()) == pytest.approx(math.log(2) - 0.5 * h, rel=1e-6)
    # balanced batch (rho = 1): no term
    same = {"a": protos["a"], "b": protos["a"]}
    f = {"a": feats["a"].detach(), "b": feats["a"].detach()}
    step = pmr_terms(f, {"a": present["a"], "b": present["a"]}, labels, same, alpha=1.0)
    assert step.weak == [] and float(step.loss.detach()) == 0.0
    # one modality: nothing to rebalance
    assert pmr_terms({"a": feats["a"]}, present, labels, protos, alpha=1.0).dominant is None
    with pytest.raises(ConfigError):
        FedPMRParams(alpha=-1.0)


# ----------------------------------------------------------------------------- end to end

BASE = ["data.name=mfeat", 'data.views=["pix", "fou"]', "case=D", "modalities.missing_rate={fou=0.3}",
        "partition.num_clients=4", "clients_per_round=3", "model.name=multimodal", "model.feat_dim=16",
        "model.mlp_hidden=[32]", "train.local_epochs=1", "train.batch_size=64", "train.optimizer=adam",
        "train.lr=0.001", "threads=1"]


def run(tmp_path, name, *over, rounds=2, resume=False) -> Experiment:
    return run_with(tmp_path, name, *over, base=BASE, rounds=rounds, resume=resume)


def timeless(rs):
    return [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in rs]


def assert_finite_accuracies(rs):
    assert [r["round"] for r in rs] == [1, 2]
    for r in rs:
        for k in ("accuracy", "accuracy/pix", "accuracy/fou"):
            assert math.isfinite(r[k]) and 0.0 <= r[k] <= 1.0, k


def test_fedpmr_runs_case_d_and_reports_the_ratio(tmp_path):
    rs = load_metrics(run(tmp_path, "pmr", "algorithm.name=fedpmr").run_dir)
    assert_finite_accuracies(rs)
    assert any("pmr_ratio" in r for r in rs)
    for r in rs:
        if "pmr_ratio" in r:
            assert math.isfinite(r["pmr_ratio"]) and r["pmr_ratio"] > 0
            assert r["pmr_weak/pix"] + r["pmr_weak/fou"] <= 1.0 + 1e-9


def test_mfedproto_runs_case_d_and_resume_equals_uninterrupted_run(tmp_path):
    full = run(tmp_path, "full", "algorithm.name=mfedproto")
    assert_finite_accuracies(load_metrics(full.run_dir))
    sd = full.server.state_dict()
    assert any(bool((sd[STATE + PROTO_COUNT + m] > 0).any()) for m in ("pix", "fou"))
    run(tmp_path, "split", "algorithm.name=mfedproto", rounds=1)
    resumed = run(tmp_path, "split", "algorithm.name=mfedproto", resume=True)
    assert timeless(load_metrics(full.run_dir)) == timeless(load_metrics(resumed.run_dir))
    for k, v in sd.items():
        assert torch.equal(v, resumed.server.state_dict()[k]), k
