"""Models: output shapes, parameter names/counts, config errors, gradients, FLOPs."""

import pytest
import torch
from torch import nn

from mmfl.data.base import DatasetMeta
from mmfl.errors import ConfigError
from mmfl.models import MODELS, build_model
from mmfl.models.flops import count_flops

FMNIST = DatasetMeta("fmnist", 10, {"image": (1, 28, 28)})
CIFAR100 = DatasetMeta("cifar100", 100, {"image": (3, 32, 32)})
VECTORS = DatasetMeta("vec", 5, {"b": (7,), "a": (2, 3)})
B = 4


def batch(meta, b=B):
    torch.manual_seed(0)
    return {m: torch.randn(b, *s) for m, s in meta.modalities.items()}


CASES = [
    ("simple_cnn", {}, FMNIST, 256, 84),
    ("simple_cnn", {}, CIFAR100, 256, 84),
    ("simple_cnn", {"projection_head": False}, CIFAR100, 84, 84),
    ("resnet", {}, FMNIST, 256, 64),
    ("resnet", {"depth": 14, "norm": "group", "out_dim": 32}, CIFAR100, 32, 64),
    ("resnet", {"depth": 20, "width": 2, "norm": "none", "projection_head": False}, FMNIST, 128, 128),
    ("mlp", {}, VECTORS, 128, 128),
    ("mlp", {"hidden": [16], "projection_head": True, "out_dim": 8, "dropout": 0.1}, VECTORS, 8, 16),
    ("mlp", {}, FMNIST, 128, 128),
]


@pytest.mark.parametrize("name,values,meta,rep_dim,feat_dim", CASES)
def test_output_shapes_and_names(name, values, meta, rep_dim, feat_dim):
    model = build_model(name, values, meta)
    out = model(batch(meta))
    assert out["logits"].shape == (B, meta.num_classes)
    assert out["rep"].shape == (B, rep_dim)
    assert out["features"].shape == (B, feat_dim)
    names = [n for n, _ in model.named_parameters()]
    assert all(n.split(".")[0] in ("features", "projection", "classifier") for n in names), names
    has_head = values.get("projection_head", name != "mlp")  # mlp has none by default
    assert any(n.startswith("projection.") for n in names) == has_head


@pytest.mark.parametrize("name,values,meta,rep_dim,feat_dim", CASES)
def test_gradients_flow(name, values, meta, rep_dim, feat_dim):
    model = build_model(name, values, meta)
    out = model(batch(meta))
    loss = nn.functional.cross_entropy(out["logits"], torch.arange(B) % meta.num_classes) + out["rep"].pow(2).mean()
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())


def test_simple_cnn_param_count_fmnist():
    model = build_model("simple_cnn", {}, FMNIST)
    conv1 = 1 * 6 * 5 * 5 + 6  # 156
    conv2 = 6 * 16 * 5 * 5 + 16  # 2416
    fc1 = (16 * 4 * 4) * 120 + 120  # 28 -> 24 -> 12 -> 8 -> 4: 30840
    fc2 = 120 * 84 + 84  # 10164
    l1 = 84 * 84 + 84  # 7140
    l2 = 84 * 256 + 256  # 21760
    cls = 256 * 10 + 10  # 2570
    assert conv1 + conv2 + fc1 + fc2 + l1 + l2 + cls == 75046
    assert sum(p.numel() for p in model.parameters()) == 75046
    cifar = build_model("simple_cnn", {}, DatasetMeta("c10", 10, {"image": (3, 32, 32)}))
    assert cifar.features.fc1.in_features == 16 * 5 * 5


def test_registered():
    assert {"simple_cnn", "resnet", "mlp"} <= set(MODELS.names())


@pytest.mark.parametrize("name,values,meta", [
    ("simple_cnn", {"modality": "audio"}, FMNIST),
    ("resnet", {"modality": "audio"}, FMNIST),
    ("mlp", {"modalities": ["a", "zz"]}, VECTORS),
    ("simple_cnn", {}, VECTORS),  # no image-like modality
    ("simple_cnn", {}, DatasetMeta("two", 3, {"x": (1, 28, 28), "y": (3, 32, 32)})),  # ambiguous
    ("simple_cnn", {"modality": "b"}, VECTORS),  # not image-like
    ("resnet", {"depth": 10}, FMNIST),
    ("resnet", {"norm": "layer"}, FMNIST),
    ("simple_cnn", {"outdim": 3}, FMNIST),  # unknown key
    ("nope", {}, FMNIST),
])
def test_config_errors(name, values, meta):
    with pytest.raises(ConfigError):
        build_model(name, values, meta)


def test_explicit_modality_among_several():
    meta = DatasetMeta("two", 3, {"x": (1, 28, 28), "y": (3, 32, 32)})
    model = build_model("simple_cnn", {"modality": "y"}, meta)
    assert model(batch(meta))["logits"].shape == (B, 3)


def test_mlp_concatenates_sorted_modalities():
    model = build_model("mlp", {"hidden": []}, VECTORS)  # features = the raw concatenation
    x = batch(VECTORS)
    expected = torch.cat([x["a"].flatten(1), x["b"]], dim=1)
    assert torch.equal(model(x)["features"], expected)


def test_count_flops_linear():
    lin = nn.Linear(3, 4)
    assert count_flops(lin, torch.randn(1, 3)) == 2 * 3 * 4
    assert count_flops(lin, torch.randn(5, 3)) == 5 * 2 * 3 * 4


def test_count_flops_simple_cnn_and_mode_restored():
    model = build_model("simple_cnn", {}, FMNIST)
    model.train()
    conv = 2 * (1 * 25) * 6 * 24 * 24 + 2 * (6 * 25) * 16 * 8 * 8
    fc = 2 * (256 * 120 + 120 * 84 + 84 * 84 + 84 * 256 + 256 * 10)
    assert count_flops(model, batch(FMNIST, 1)) == conv + fc
    assert model.training
