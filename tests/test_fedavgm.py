"""FedAvgM (mmfl/algorithms/fedavgm.py): the server momentum step on hand numbers, beta = 0
with server_lr = 1 equals FedAvg, the velocity carries across rounds (and changes the model),
and a resumed run continues the velocity bit-exactly."""

from __future__ import annotations

import json

import pytest
import torch

from mmfl.algorithms.fedavgm import momentum_step
from mmfl.config import load_config
from mmfl.errors import ConfigError

from helpers import run


def test_momentum_step_hand_numbers():
    w = {"a": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    avg = {"a": torch.tensor([2.0, 0.0]), "n": torch.tensor(5)}
    w1, v1 = momentum_step(w, avg, {}, beta=0.5, lr=1.0)  # v = Delta = [1, -2]
    assert torch.equal(v1["a"], torch.tensor([1.0, -2.0])) and torch.equal(w1["a"], torch.tensor([2.0, 0.0]))
    assert torch.equal(w1["n"], torch.tensor(5)) and "n" not in v1  # integer entries pass through
    w2, v2 = momentum_step(w1, {"a": torch.tensor([2.5, 0.0]), "n": torch.tensor(5)}, v1, beta=0.5, lr=2.0)
    # v = 0.5 [1, -2] + [0.5, 0] = [1, -1];  w = [2, 0] + 2 [1, -1] = [4, -2]
    assert torch.equal(v2["a"], torch.tensor([1.0, -1.0])) and torch.equal(w2["a"], torch.tensor([4.0, -2.0]))


def test_fedavgm_with_beta_zero_and_unit_lr_equals_fedavg(tmp_path):
    avg = run(tmp_path, "avg")
    m0 = run(tmp_path, "m0", "algorithm.name=fedavgm", "algorithm.server_momentum=0.0")
    for k, t in avg.server.model.state_dict().items():
        assert torch.allclose(t, m0.server.model.state_dict()[k], rtol=0, atol=1e-6), k
    m9 = run(tmp_path, "m9", "algorithm.name=fedavgm", "algorithm.server_momentum=0.9")  # the check can fail
    assert max(float((t - m9.server.model.state_dict()[k]).abs().max())
               for k, t in avg.server.model.state_dict().items()) > 1e-3
    assert set(m9.server.velocity) == set(dict(m9.server.model.named_parameters()))


def test_fedavgm_resume_continues_the_velocity_bit_exactly(tmp_path):
    full = run(tmp_path, "full", "algorithm.name=fedavgm", rounds=3)
    run(tmp_path, "half", "algorithm.name=fedavgm", rounds=2)
    half = run(tmp_path, "half", "algorithm.name=fedavgm", rounds=3, resume=True)
    for k, t in full.server.model.state_dict().items():
        assert torch.equal(t, half.server.model.state_dict()[k]), k
    rows = [json.loads(x) for x in (half.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]


@pytest.mark.parametrize("bad", ["algorithm.server_momentum=1.0", "algorithm.server_lr=0.0"])
def test_fedavgm_bad_values_name_the_field(bad):
    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        load_config(None, ["algorithm.name=fedavgm", bad])
