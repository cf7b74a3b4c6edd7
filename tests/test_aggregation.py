"""Aggregation rules (mmfl.core.aggregation): each rule on tiny tensors against a hand computation,
and the table used by name from the config."""

from __future__ import annotations

import pytest
import torch

from mmfl.config import load_config
from mmfl.core.aggregation import AGGREGATION_RULES, aggregate
from mmfl.engine.runner import Experiment
from mmfl.errors import ConfigError


def _updates():
    a = {"w": torch.tensor([1.0, 2.0]), "enc.img": torch.tensor([4.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}  # b holds no image encoder
    return [a, b]


def test_weighted_mean_is_data_weighted_per_key_over_holders_by_hand():
    prev = {"w": torch.zeros(2), "enc.img": torch.tensor([9.0]), "enc.txt": torch.tensor([7.0]),
            "n": torch.tensor(0)}
    out = aggregate("weighted_mean", _updates(), [1.0, 3.0], prev)
    assert torch.allclose(out["w"], torch.tensor([(1 + 9) / 4, (2 + 18) / 4]))  # (1*a + 3*b) / 4
    assert torch.equal(out["enc.img"], torch.tensor([4.0]))  # only a holds it
    assert torch.equal(out["enc.txt"], torch.tensor([7.0]))  # nobody sent it: keeps its value
    assert int(out["n"]) == 5  # integer buffers take the maximum


def test_weighted_mean_uses_the_longest_module_prefix_weight():
    ups = [{"enc.img": torch.tensor([0.0]), "head": torch.tensor([0.0])},
           {"enc.img": torch.tensor([4.0]), "head": torch.tensor([4.0])}]
    out = aggregate("weighted_mean", ups, [{"": 1.0, "enc.img": 3.0}, {"": 1.0, "enc.img": 1.0}])
    assert float(out["enc.img"]) == pytest.approx(1.0)  # (3*0 + 1*4) / 4
    assert float(out["head"]) == pytest.approx(2.0)  # (1*0 + 1*4) / 2


def test_mean_ignores_data_weights_by_hand():
    out = aggregate("mean", _updates(), [1.0, 3.0])
    assert torch.allclose(out["w"], torch.tensor([2.0, 4.0]))
    assert torch.equal(out["enc.img"], torch.tensor([4.0]))


def test_iot_multiplies_multimodal_weights_by_hand():
    out = aggregate("iot", _updates(), [3.0, 5.0], multimodal=[True, False], multimodal_weight=100.0)
    assert torch.allclose(out["w"], (300 * torch.tensor([1.0, 2.0]) + 5 * torch.tensor([3.0, 6.0])) / 305)


def test_unknown_rule_is_a_config_error_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.aggregation"):
        load_config(None, ["algorithm.name=fedavg", "algorithm.aggregation=medain", f"output_dir={tmp_path}"])
    assert {"weighted_mean", "mean", "iot"} <= set(AGGREGATION_RULES.names())


def _run(tmp_path, name, *over):
    exp = Experiment(load_config(None, ["rounds=2", "threads=1", f"output_dir={tmp_path}", f"name={name}",
                                        "partition.num_clients=4", *over]), progress=False)
    exp.run()
    return exp.server.model.state_dict()


def test_fedavg_with_the_rule_named_explicitly_equals_the_default(tmp_path):
    a = _run(tmp_path, "default", "algorithm.name=fedavg")
    b = _run(tmp_path, "named", "algorithm.name=fedavg", "algorithm.aggregation=weighted_mean")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = _run(tmp_path, "mean", "algorithm.name=fedavg", "algorithm.aggregation=mean")
    assert any(not torch.equal(a[k], c[k]) for k in a)  # the name is used (unequal client sizes)
