"""The engine's device mechanisms (mmfl.core.device, data placement, memory-aware stacks),
checked on the CPU: data placed once and shared between client views, a batch moved per
step when the data stays in host memory, stacks sized from free memory and split on an
out-of-memory error with the same result, bf16 autocast with fp32 messages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import mmfl.engine.batched_delivery as engine_batched

from mmfl.core.batched import MAX_GROUP, stack_size
from mmfl.core.device import precision_context, resolve_device, to_cpu, to_device, to_fp32
from mmfl.data.base import ArrayDataset, Federation, DatasetMeta
from mmfl.engine.state_store import ClientStateStore, make_store

from helpers import config, experiment, rows, run_config

sys.path.insert(0, str(Path(__file__).parent))
from data_fixtures import write_mnist_dir  # noqa: E402

CPU = torch.device("cpu")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the runs' device (scripts/gpu_check.sh runs these on a GPU)


@pytest.fixture(scope="module")
def mnist_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mnist")
    write_mnist_dir(root, n_train=240, n_test=60, hw=(16, 16))
    return root


def cfg_of(tmp_path, root, name, *over):
    return config(tmp_path, name, *over, base=(
        "data.name=mnist_idx", f"data.root={root}", "partition.name=dirichlet", "partition.num_clients=6",
        "partition.beta=0.5", "model.name=simple_cnn", "model.out_dim=32", "train.local_epochs=1",
        "train.batch_size=16", "train.optimizer=\"sgd\"", "train.lr=0.05", "threads=1", f"device={DEVICE}"))


# ----------------------------------------------------------------------------- placement

def test_federation_to_moves_shared_tensors_once_and_views_share_them():
    x, y = torch.randn(10, 3), torch.arange(10)
    base = ArrayDataset({"x": x}, y)
    fed = Federation([base.subset([0, 1, 2]), base.subset([3, 4])], base.subset([5, 6]),
                     DatasetMeta("t", 10, {"x": (3,)}))
    moved = fed.to(CPU)
    assert moved.clients[0].features["x"] is moved.clients[1].features["x"]  # one copy, shared
    assert torch.equal(moved.clients[1].get()[1], torch.tensor([3, 4]))
    assert fed.nbytes() == x.numel() * 4 + y.numel() * 8 + 3 * 8 + 2 * 8 + 2 * 8


def test_data_kept_in_host_memory_moves_each_batch_and_views_keep_the_device():
    d = ArrayDataset({"x": torch.randn(8, 2)}, torch.arange(8)).to(CPU, keep=False)
    assert d.device == CPU
    for view in (d.subset([1, 2, 3]), d.with_features(["x"]), d.subset([0, 1]).materialize()):
        assert view.device == CPU
    feats, labels = d.subset([4, 5]).get()
    assert torch.equal(labels, torch.tensor([4, 5])) and feats["x"].shape == (2, 2)


def test_batch_order_is_drawn_on_the_cpu_whatever_the_default_device():
    d = ArrayDataset({"x": torch.randn(9, 2)}, torch.arange(9))
    want = [b[1].tolist() for b in d.batches(4, generator=torch.Generator().manual_seed(3))]
    try:
        torch.set_default_device("meta")
        got = [b[1].tolist() for b in d.batches(4, generator=torch.Generator(device="cpu").manual_seed(3))]
    finally:
        torch.set_default_device(None)
    assert got == want


def test_tree_moves_and_fp32():
    t = {"a": torch.ones(2, dtype=torch.bfloat16), "b": [torch.zeros(1)], "c": 3}
    assert to_device(t, CPU)["c"] == 3 and to_cpu(t)["b"][0].device == CPU
    assert to_fp32({"a": t["a"], "i": torch.ones(1, dtype=torch.long)})["a"].dtype == torch.float32
    assert to_fp32({"i": torch.ones(1, dtype=torch.long)})["i"].dtype == torch.long


def test_auto_is_the_cpu_without_an_accelerator_and_a_missing_gpu_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert resolve_device("auto") == CPU
    from mmfl.errors import ConfigError

    with pytest.raises(ConfigError, match="device: 'cuda:1' requested"):
        resolve_device("cuda:1")


def test_store_on_the_cpu_keeps_tensors_as_given():
    assert make_store("memory", 3, "/nonexistent", CPU).device is None
    s = ClientStateStore(CPU)
    s.save(0, {"w": torch.ones(2)})
    assert s.load(0)["w"].device == CPU and s.state_dict()["0/w"].device == CPU


# ----------------------------------------------------------------------------- stacks

def test_stack_size_follows_free_memory_within_bounds():
    assert stack_size(100, None) == MAX_GROUP
    assert stack_size(100, 1000) == 8  # 0.8 * 1000 // 100
    assert stack_size(10**9, 1000) == 1  # never below one client
    assert stack_size(1, 10**12) == MAX_GROUP


def test_out_of_memory_splits_the_stack_with_the_same_result(tmp_path, mnist_root, monkeypatch):
    whole = run_config(cfg_of(tmp_path, mnist_root, "whole", "batch_clients=true"))
    real = engine_batched.train_stacked
    sizes = []

    def tight(model, client, tasks, *args, **kw):  # a device that holds at most two clients
        sizes.append(len(tasks))
        if len(tasks) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, client, tasks, *args, **kw)

    monkeypatch.setattr(engine_batched, "train_stacked", tight)
    split = run_config(cfg_of(tmp_path, mnist_root, "split", "batch_clients=true"))
    assert sizes[:3] == [6, 3, 2] and all(s <= 2 for s in sizes[2:])  # halved until it fits, then kept
    a, b = rows(whole), rows(split)
    assert b[0]["batched_stack_oom"] >= 1 and b[0]["batched_clients"] == 6
    for ra, rb in zip(a, b):
        assert rb["accuracy"] == pytest.approx(ra["accuracy"], abs=1e-6)
        assert rb["train_loss"] == pytest.approx(ra["train_loss"], rel=1e-5)


def test_other_errors_in_a_stack_are_not_retried(tmp_path, mnist_root, monkeypatch):
    def broken(*args, **kw):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(engine_batched, "train_stacked", broken)
    exp = experiment(cfg_of(tmp_path, mnist_root, "broken", "batch_clients=true"))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        exp.run()


# ----------------------------------------------------------------------------- precision

def test_bf16_training_learns_like_fp32_across_optimizer_steps():
    # the context spans a whole round; with autocast's weight cache the forward kept using the
    # weights of the first step and the model never learned (loss stuck at its start)
    torch.manual_seed(0)
    x, y = torch.randn(128, 16), torch.randint(0, 4, (128,))

    def final_loss(precision: str) -> float:
        torch.manual_seed(1)
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        with precision_context(CPU, precision):
            for _ in range(60):
                loss = torch.nn.functional.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        return float(loss.detach())

    fp32, bf16 = final_loss("fp32"), final_loss("bf16")
    assert fp32 < 0.5 and abs(bf16 - fp32) < 0.1, (fp32, bf16)


def test_bf16_autocasts_compute_but_messages_stay_fp32(tmp_path, mnist_root):
    with precision_context(CPU, "bf16"):
        assert (torch.ones(2, 3) @ torch.ones(3, 2)).dtype == torch.bfloat16
    fp32 = run_config(cfg_of(tmp_path, mnist_root, "fp32"))
    bf16 = experiment(cfg_of(tmp_path, mnist_root, "bf16", "precision=bf16"))
    bf16.run()
    a, b = rows(fp32), rows(bf16)
    assert [r["bytes_up"] for r in a] == [r["bytes_up"] for r in b]  # replies are fp32 either way
    assert all(0 <= r["accuracy"] <= 1 and r["train_loss"] == r["train_loss"] for r in b)
    assert a[-1]["train_loss"] != b[-1]["train_loss"]  # bf16 did compute differently
