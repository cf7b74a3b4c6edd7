"""mmfl.core.optim: torch.optim's SGD/Adam, bit for bit, without importing torch._dynamo."""

import subprocess
import sys

import pytest
from conftest import patience
import torch
from torch import nn

from mmfl.core import optim, state
from mmfl.core.training import make_optimizer, set_lr


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def _train(model, opt, steps=7, seed=1, lr_at=None):
    g = torch.Generator().manual_seed(seed)
    for i in range(steps):
        if lr_at is not None:
            set_lr(opt, lr_at(i))
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


CASES = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.05, weight_decay=1e-3)),
    ("SGD", dict(lr=0.05, momentum=0.5, weight_decay=1e-3)),
    ("Adam", dict(lr=1e-2)),
    ("Adam", dict(lr=1e-2, weight_decay=1e-3)),
]


@pytest.mark.parametrize("name,kw", CASES)
def test_optimizer_bit_identical_to_torch_optim(name, kw):
    ours_m, ref_m = _model(), _model()
    ours = _train(ours_m, getattr(optim, name)(ours_m.parameters(), **kw), lr_at=lambda i: kw["lr"] / (1 + i))
    ref = _train(ref_m, getattr(torch.optim, name)(ref_m.parameters(), **kw), lr_at=lambda i: kw["lr"] / (1 + i))
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)


def test_adam_param_groups_bit_identical():
    """Per-group learning rates (mmfl.core.vqa's head + encoder groups)."""
    def groups(m):
        return [{"params": list(m[0].parameters()), "lr": 1e-2}, {"params": list(m[2].parameters()), "lr": 1e-3}]
    ours_m, ref_m = _model(), _model()
    ours = _train(ours_m, optim.Adam(groups(ours_m), weight_decay=1e-4))
    ref = _train(ref_m, torch.optim.Adam(groups(ref_m), weight_decay=1e-4))
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))


@pytest.mark.parametrize("name,momentum", [("sgd", 0.9), ("adam", 0.0)])
def test_optimizer_state_round_trips_through_state_declaration(name, momentum):
    """Train 4 steps, save the optimizer() field, restore into a fresh optimizer on a copy of
    the model, train 3 more: same parameters as 7 uninterrupted steps."""
    from mmfl.schema import TrainConfig
    train = TrainConfig(optimizer=name, lr=0.01, momentum=momentum, weight_decay=1e-3)
    field = state.optimizer()
    m = _model()
    opt = make_optimizer(list(m.parameters()), train)
    assert isinstance(opt, torch.optim.Optimizer) and isinstance(opt, optim._NoDynamo)
    _train(m, opt, steps=4)
    flat = field.flatten(opt)
    assert flat and all("/" in k for k in flat)
    m2 = _model()
    m2.load_state_dict(m.state_dict())
    opt2 = state.load_field(field, flat, make_optimizer(list(m2.parameters()), train))
    resumed = _train(m2, opt2, steps=3, seed=2)
    full = _model()
    fopt = make_optimizer(list(full.parameters()), train)
    _train(full, fopt, steps=4)
    straight = _train(full, fopt, steps=3, seed=2)
    assert all(torch.equal(a, b) for a, b in zip(resumed, straight))


def test_local_train_does_not_import_dynamo():
    """A fresh process that trains a tiny model through local_train (SGD with momentum, then
    Adam) never imports torch._dynamo (1-1.5 s of CPU with torch.optim's classes)."""
    code = """
import sys, torch
from mmfl.core.training import local_train
from mmfl.data.base import ArrayDataset
from mmfl.schema import TrainConfig
from torch import nn

class M(nn.Module):
    def __init__(self):
        super().__init__(); self.f = nn.Linear(4, 3)
    def forward(self, inputs):
        return {"logits": self.f(inputs["x"])}

data = ArrayDataset({"x": torch.randn(10, 4)}, torch.randint(0, 3, (10,)))
for opt in ("sgd", "adam"):
    local_train(M(), data, TrainConfig(optimizer=opt, lr=0.1, momentum=0.9, batch_size=4, local_epochs=2),
                torch.Generator().manual_seed(0))
print("dynamo" if "torch._dynamo" in sys.modules else "clean")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=patience(120))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"
