"""CreamFL's server distillation (eq. 7) and BatchNorm: on the packaged mfeat config (a CNN image
encoder with BatchNorm), distilling the server toward its own representations must leave it
unchanged, parameters and running statistics alike (``algorithm.distill_norm = "eval"``, the
default); in train mode (the authors' code) the batch statistics make the targets unreachable
and the same distillation moves it. docs/algorithms/creamfl.md, "BatchNorm in the distillation"."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from mmfl.algorithms.creamfl_terms import public_reps

from helpers import experiment

PACKAGED = Path(__file__).resolve().parent.parent / "mmfl" / "configs" / "creamfl_mfeat.toml"


def _packaged_server(tmp_path, distill_norm: str):
    raw = tomllib.loads(PACKAGED.read_text())
    raw.update(rounds=1, output_dir=str(tmp_path), threads=1)
    raw["train"]["local_epochs"] = 1
    raw["algorithm"].update(distill_norm=distill_norm, server_lr_schedule="constant")
    exp = experiment(raw)
    exp.run()  # one round: a public epoch, clients, a real distillation (the Adam has state)
    return exp.server


@pytest.mark.parametrize("distill_norm", ["eval", "train"])
def test_self_distillation_on_the_packaged_batchnorm_model(tmp_path, distill_norm):
    server = _packaged_server(tmp_path, distill_norm)
    bns = [m for m in server.model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert bns, "the packaged mfeat server model has BatchNorm (its CNN image encoder)"
    server.train_public(1)
    own = public_reps(server.model, server.public, server.pair)  # eval mode, as the engine computes them
    before = {k: v.clone() for k, v in server.model.state_dict().items()}
    server.distill(own, 1)
    after = server.model.state_dict()
    stats = [k for k in before if k.endswith(("running_mean", "running_var"))]
    params = [k for k, _ in server.model.named_parameters()]
    moved_stats = max(float((after[k] - before[k]).abs().max()) for k in stats)
    moved_params = max(float((after[k] - before[k]).abs().max()) for k in params)
    if distill_norm == "eval":
        assert moved_stats == 0.0 and moved_params == 0.0
        assert all(torch.equal(after[k], before[k]) for k in before)
    else:  # batch statistics: the server's own targets are not a fixed point
        assert moved_stats > 1e-4 and moved_params > 1e-6
