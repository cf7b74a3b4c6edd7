"""Batched clients (mmfl.core.batched, mmfl.engine.batched_delivery): equal to sequential training within float
tolerance for FedAvg, FedProx, SCAFFOLD and MOON, with SGD and Adam, with unequal client sizes;
visible fallback where batching cannot apply; resume-exact."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

from mmfl.config import TrainConfig
from mmfl.data.base import ArrayDataset
from mmfl.core.batched import BatchedClient, BatchedTask, client_batches, train_stacked
from mmfl.core.training import local_train

from helpers import config, rows, run, run_config, timeless

sys.path.insert(0, str(Path(__file__).parent))
from data_fixtures import write_mnist_dir  # noqa: E402

ATOL = 2e-5


@pytest.fixture(scope="module")
def mnist_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mnist")
    write_mnist_dir(root, n_train=240, n_test=60, hw=(16, 16))
    return root


def cnn_cfg(tmp_path, root, name, *over, rounds=3):
    # 4 clients of unequal size (Dirichlet), 3 per round: client state from earlier rounds
    # matters (MOON's previous model, SCAFFOLD's c_i) and step counts differ within a round
    return config(tmp_path, name, *over, rounds=rounds, base=(
        "data.name=mnist_idx", f"data.root={root}", "partition.name=dirichlet", "partition.num_clients=4",
        "partition.beta=0.5", "clients_per_round=3", "model.name=simple_cnn", "model.out_dim=32",
        "train.local_epochs=1", "train.batch_size=16", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1"))


def comparable(rows):
    return [{k: v for k, v in r.items() if not k.endswith("_time_s") and not k.startswith("batched")} for r in rows]


def assert_close_rows(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(comparable(a), comparable(b)):
        assert ra.keys() == rb.keys()
        for k in ra:
            if isinstance(ra[k], float):
                assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-5), k
            else:
                assert ra[k] == rb[k], k


def assert_close_states(a: dict, b: dict, control_atol: float = ATOL):
    assert a.keys() == b.keys()
    for k in a:
        atol = control_atol if k.startswith("c/") or "/c/" in k else ATOL
        assert torch.allclose(a[k], b[k], rtol=0, atol=atol), (k, float((a[k] - b[k]).abs().max()))


# three real mfeat views, Dirichlet labels over 5 clients, the multimodal model (one encoder per view)
MFEAT3 = ("data.name=mfeat", 'data.views=["pix", "fou", "zer"]', "partition.name=dirichlet", "partition.num_clients=5",
          "partition.beta=0.5", "model.name=multimodal", "model.feat_dim=16", "model.mlp_hidden=[16]",
          'train.optimizer="sgd"', "train.lr=0.01", "train.local_epochs=1", "train.batch_size=32", "threads=1")
ADAM = ["train.optimizer=\"adam\"", "train.lr=0.001", "train.weight_decay=0.0001"]  # the default optimizer


@pytest.mark.parametrize("algo, opt", [(a, "sgd") for a in ["fedavg", "fedprox", "scaffold", "moon", "local", "feddyn",
                                                             "fedavgm"]]
                         + [(a, "adam") for a in ["fedavg", "fedprox", "scaffold", "moon", "local"]])
def test_batched_training_equals_sequential_within_float_tolerance(tmp_path, mnist_root, algo, opt):
    # Adam: per-client moments and step counts, fresh every round as local_train's optimizer
    over = [f"algorithm.name={algo}"] + (["algorithm.mu=0.5"] if algo == "fedprox" else []) \
        + (ADAM if opt == "adam" else [])
    seq = run_config(cnn_cfg(tmp_path, mnist_root, "seq", *over, "batch_clients=false"))
    bat = run_config(cnn_cfg(tmp_path, mnist_root, "bat", *over, "batch_clients=true"))
    got = rows(bat)
    assert all(r["batched_clients"] == 3 and "batched_fallback" not in r for r in got)
    assert not any(k.startswith("batched") for r in rows(seq) for k in r)
    assert_close_rows(rows(seq), got)
    # SCAFFOLD's control variates are (x - y_i) / (K lr): a parameter difference d is d / (K lr) in
    # c_i, and Adam moves every parameter by about lr per step whatever its gradient's scale, so
    # rounding differences in tiny gradients reach y_i: the variates are compared to ATOL / lr
    control = ATOL / 0.001 if (algo, opt) == ("scaffold", "adam") else ATOL
    assert_close_states(seq.server.state_dict(), bat.server.state_dict(), control)
    assert_close_states(seq.store.state_dict(), bat.store.state_dict(), control)  # MOON's prev models, SCAFFOLD's c_i


class _CE(BatchedClient):
    def batched_loss(self, forward, params, inputs, labels, extras, shared):
        return torch.nn.functional.cross_entropy(forward(params, inputs)["logits"], labels, reduction="none")


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_unequal_sizes_short_batches_and_single_samples_match_local_train(opt):
    # sizes: one sample (its batch of one is kept), 17 = 16 + a skipped batch of one,
    # 23 = 16 + a short batch of 7 (padded), 40 = 2 full + 8; two epochs
    from mmfl.models.mlp import MLP

    torch.manual_seed(0)
    feats = {"x": torch.randn(200, 6)}
    labels = torch.randint(0, 3, (200,))
    full = ArrayDataset(feats, labels)
    perm = torch.randperm(200)
    sizes = [1, 17, 23, 40]
    datas, at = [], 0
    for n in sizes:
        datas.append(full.subset(perm[at:at + n].numpy()))
        at += n
    train = TrainConfig(optimizer=opt, local_epochs=2, batch_size=16, lr=0.1 if opt == "sgd" else 0.01, momentum=0.9,
                        weight_decay=1e-3)
    model = MLP(["x"], 6, 3, [8])
    start = {k: v.clone() for k, v in model.state_dict().items()}
    gens = [torch.Generator().manual_seed(100 + i) for i in range(4)]
    assert [len(client_batches(d, 16, 2, torch.Generator().manual_seed(100 + i))) for i, d in enumerate(datas)] \
        == [2, 2, 4, 6]
    outs = train_stacked(model, _CE(), [BatchedTask(start=start) for _ in datas], datas, gens, train)
    for i, d in enumerate(datas):
        ref = MLP(["x"], 6, 3, [8])
        ref.load_state_dict(start)
        stats = local_train(ref, d, train, torch.Generator().manual_seed(100 + i))
        state, got = outs[i]
        assert got["steps"] == stats["steps"]
        assert got["train_loss"] == pytest.approx(stats["train_loss"], rel=1e-5)
        assert_close_states({k: v.detach() for k, v in ref.state_dict().items()}, state)


def test_fallback_is_automatic_and_visible(tmp_path, mnist_root, caplog):
    # dropout: random masks would differ from sequential training -> sequential, logged,
    # reported per round, and then bit-for-bit the sequential run
    over = ["model.name=mlp", "model.hidden=[16]", "model.dropout=0.2", "algorithm.name=fedavg"]
    with caplog.at_level(logging.WARNING, logger="mmfl"):
        bat = run_config(cnn_cfg(tmp_path, mnist_root, "bat", *over, "batch_clients=true", rounds=2))
    assert any("dropout" in r.getMessage() for r in caplog.records)
    got = rows(bat)
    assert all("dropout" in r["batched_fallback"] and "batched_clients" not in r for r in got)
    seq = run_config(cnn_cfg(tmp_path, mnist_root, "seq", *over, "batch_clients=false", rounds=2))
    assert comparable(got) == comparable(rows(seq))
    # SGD and Adam are stacked (tests above); an optimizer without a stacked version would fall back
    from types import SimpleNamespace

    from mmfl.core.batched import model_blocker
    assert "implements SGD and Adam" in model_blocker(torch.nn.Linear(2, 2), SimpleNamespace(optimizer="rmsprop"))
    assert model_blocker(torch.nn.Linear(2, 2), TrainConfig(optimizer="adam")) is None
    bn = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    assert model_blocker(bn, TrainConfig(optimizer="sgd")) is None  # BatchNorm stacks (its own test below)


def test_batched_run_resumes_exactly(tmp_path, mnist_root):
    over = ["algorithm.name=moon", "batch_clients=true"]
    full = run_config(cnn_cfg(tmp_path, mnist_root, "full", *over, rounds=3))
    run_config(cnn_cfg(tmp_path, mnist_root, "split", *over, rounds=2))
    resumed = run_config(cnn_cfg(tmp_path, mnist_root, "split", *over, rounds=3), resume=True)
    assert timeless(rows(full)) == timeless(rows(resumed))
    for k, v in full.server.state_dict().items():
        assert torch.equal(v, resumed.server.state_dict()[k]), k
    for k, v in full.store.state_dict().items():
        assert torch.equal(v, resumed.store.state_dict()[k]), k


def test_a_subclass_that_changes_training_without_batched_methods_is_not_batched(tmp_path, mnist_root):
    # the engine test's NaN client overrides train(): batching it with FedAvg's batched
    # methods would silently drop the override, so it trains sequentially (and is dropped)
    from test_engine import NAN_ALGO  # registers the algorithm

    from mmfl.algorithms import ALGORITHMS
    from mmfl.algorithms.moon import MoonClient
    from mmfl.core.batched import capability_blocker

    assert "overrides train" in capability_blocker(ALGORITHMS.get(NAN_ALGO).factory.client)
    assert capability_blocker(MoonClient) is None
    exp = run_config(cnn_cfg(tmp_path, mnist_root, "nan", f"algorithm.name={NAN_ALGO}", "on_nonfinite=drop",
                             "clients_per_round=4", "batch_clients=true", rounds=1))
    row = rows(exp)[0]
    assert row["dropped"] == [1] and "overrides train" in row["batched_fallback"]


@pytest.mark.parametrize("algo, opt", [("fedavg", "sgd"), ("fedprox", "sgd"), ("fedavg", "adam"), ("fedprox", "adam")])
def test_multimodal_encoders_train_stacked_equal_to_sequential(tmp_path, algo, opt):
    # the multimodal model (one encoder per modality, fusion, classifier) over three real mfeat
    # views: every encoder stacks over the clients, results match one-by-one training
    def trained(batched: bool):
        return run(tmp_path, f"{algo}-{opt}-{batched}", f"algorithm.name={algo}", f"batch_clients={'true' if batched else 'false'}",
                   *(ADAM if opt == "adam" else []), base=MFEAT3)

    seq, bat = trained(False), trained(True)
    assert all(r.get("batched_clients") == 5 for r in rows(bat))
    assert_close_rows(rows(seq), rows(bat))
    a, b = seq.server.model.state_dict(), bat.server.model.state_dict()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < ATOL


class _BNNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.bn, self.out = torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3)

    def forward(self, inputs):
        return {"logits": self.out(torch.relu(self.bn(self.lin(inputs["x"]))))}


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_batchnorm_stacks_with_per_client_running_statistics_equal_to_local_train(opt):
    # sizes not multiples of the batch: last batches differ in width, so BatchNorm clients step
    # per width (padding rows never enter batch statistics); buffers are per client
    torch.manual_seed(0)
    full = ArrayDataset({"x": torch.randn(200, 6)}, torch.randint(0, 3, (200,)))
    perm, datas, at = torch.randperm(200), [], 0
    for n in [30, 37, 18, 64]:
        datas.append(full.subset(perm[at:at + n].numpy()))
        at += n
    # Adam: the clients of one step take it in separate width groups, each with its own step count
    train = TrainConfig(optimizer=opt, local_epochs=2, batch_size=16, lr=0.1 if opt == "sgd" else 0.01, momentum=0.9,
                        weight_decay=1e-3)
    model = _BNNet()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    gens = [torch.Generator().manual_seed(100 + i) for i in range(4)]
    outs = train_stacked(model, _CE(), [BatchedTask(start=start) for _ in datas], datas, gens, train)
    for i, d in enumerate(datas):
        ref = _BNNet()
        ref.load_state_dict(start)
        stats = local_train(ref, d, train, torch.Generator().manual_seed(100 + i))
        state, got = outs[i]
        assert got["train_loss"] == pytest.approx(stats["train_loss"], rel=1e-5)
        assert_close_states({k: v.detach() for k, v in ref.state_dict().items()}, state)
        assert int(state["bn.num_batches_tracked"]) == stats["steps"]  # its own running statistics


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_moon_with_batchnorm_trains_stacked_equal_to_sequential(tmp_path, mnist_root, opt):
    # the multimodal model's CNN encoder has BatchNorm: MOON's frozen references run in eval mode
    def trained(name, batched):
        return run(tmp_path, name, f"batch_clients={batched}", *(ADAM if opt == "adam" else []), base=(
            "data.name=mnist_idx", f"data.root={mnist_root}", "partition.name=dirichlet", "partition.num_clients=4",
            "partition.beta=0.5", "clients_per_round=3", "model.name=multimodal", "model.feat_dim=16",
            "algorithm.name=moon", "train.local_epochs=1", "train.batch_size=16", "train.optimizer=\"sgd\"", "train.lr=0.05",
            "threads=1"))

    seq, bat = trained("bnseq", "false"), trained("bnbat", "true")
    assert all(r.get("batched_clients") == 3 for r in rows(bat))
    assert_close_rows(rows(seq), rows(bat))
    a, b = seq.server.model.state_dict(), bat.server.model.state_dict()
    assert any("running_mean" in k for k in a)
    assert max(float((a[k].double() - b[k].double()).abs().max()) for k in a) < ATOL
