"""Per-modality metrics only for heads an algorithm trains (``Server.trains_modality_heads``):
centralized / FedAvg on a multimodal model never train ``heads[m]`` and their rows carry no
``accuracy/<m>``, ``uar/<m>``, ``class_accuracy/<m>`` (they scored about chance and read as a
result); MFedAvg's probes do (and not with ``probe = false``); FedCMI always."""

import pytest

from mmfl.algorithms.registry import ALGORITHMS

from helpers import rows, run_config


def last_row(tmp_path, algorithm: dict) -> dict:
    name = algorithm["name"] + ("_noprobe" if algorithm.get("probe") is False else "")
    raw = {"name": name, "rounds": 1, "seed": 0, "output_dir": str(tmp_path), "threads": 1,
           "data": {"name": "mfeat", "views": ["pix", "fou"]}, "partition": {"num_clients": 3},
           "model": {"name": "multimodal", "feat_dim": 8, "mlp_hidden": [16],
                     "two_projector": algorithm["name"] == "fedcmi"},
           "algorithm": algorithm, "train": {"local_epochs": 1, "batch_size": 64}}
    return rows(run_config(raw))[-1]


@pytest.mark.parametrize("algorithm,trained", [
    ({"name": "centralized"}, False), ({"name": "fedavg"}, False), ({"name": "mfedavg"}, True),
    ({"name": "mfedavg", "probe": False}, False), ({"name": "fedcmi"}, True)])
def test_rows_hold_per_modality_metrics_only_of_trained_heads(tmp_path, algorithm, trained):
    row = last_row(tmp_path, algorithm)
    assert "accuracy" in row and "uar" in row and "class_accuracy" in row  # the joint output: always
    per_mod = {k for k in row if k.split("/")[0] in ("accuracy", "uar", "class_accuracy") and "/" in k}
    assert per_mod == ({f"{b}/{m}" for b in ("accuracy", "uar", "class_accuracy") for m in ("pix", "fou")}
                       if trained else set())


def test_the_declaration():
    spec = lambda n: ALGORITHMS.get(n).factory  # noqa: E731
    assert not spec("fedavg").server.trains_modality_heads and not spec("centralized").server.trains_modality_heads
    for name in ("mfedavg", "fedcmi", "fedogm", "fedmsplit", "partialfl", "pfedwireless", "split_learning"):
        assert spec(name).server.trains_modality_heads, name
