"""Every packaged config (mmfl/configs/*.toml) and the variations the README and docs show
resolve: known names, valid parameters (nothing is trained or loaded here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmfl.config import load_config

CONFIGS = sorted((Path(__file__).parents[1] / "mmfl" / "configs").glob("*.toml"))


def test_there_are_packaged_configs():
    names = {p.name for p in CONFIGS}
    assert {"demo.toml", "fedcmi.toml", "creamfl.toml", "creamfl_mfeat.toml", "partialfl_digits.toml",
            "partialfl_emoji.toml", "wireless_digits.toml", "wireless_mfeat.toml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_packaged_config_resolves(path):
    cfg = load_config(path, [])
    assert cfg.run.name and cfg.algorithm.name and cfg.data.name


@pytest.mark.parametrize("path,over", [
    ("creamfl.toml", ["algorithm.name=creamfl_fedavg", "client_models=[]"]),
    ("creamfl.toml", ["algorithm.name=fedgems"]),
    ("creamfl_mfeat.toml", ["algorithm.name=creamfl_fediot", "client_models=[]"]),
    ("partialfl_digits.toml", ['algorithm={name="split_learning"}', 'privacy.labels="shareable"']),
    ("partialfl_emoji.toml", ['algorithm={name="split_learning_u"}']),
    ("partialfl_digits.toml", ['partition={name="dirichlet", num_clients=20, beta=0.5}', "clients_per_round=10"]),
    ("partialfl_digits.toml", ["algorithm.name=pfl_centralized"]),
    ("partialfl_emoji.toml", ["algorithm.global_model=both"]),
    ("wireless_mfeat.toml", ['algorithm={name="fedfomo"}']),
])
def test_documented_variations_resolve(path, over):
    cfg = load_config(Path(__file__).parents[1] / "mmfl" / "configs" / path, over)
    assert cfg.algorithm.name
