"""An algorithm whose update rule is written for SGD steps declares ``Server.train_defaults``;
they fill the ``[train]`` keys a config leaves out (mmfl.config.with_algorithm_defaults), and
keys the user set win. Everything else gets the run-wide defaults (Adam, lr 1e-3)."""

from __future__ import annotations

import pytest

from mmfl.algorithms import ALGORITHMS
from mmfl.config import resolve
from mmfl.schema import TrainConfig


def _train(algorithm: str, train: dict | None = None, **extra):
    raw = {"data": {"name": "digits"}, "algorithm": {"name": algorithm}, **extra}
    if train is not None:
        raw["train"] = train
    return resolve(raw).train


def test_run_wide_defaults_are_adam():
    t = _train("fedavg")
    assert (t.optimizer, t.lr) == ("adam", TrainConfig().lr) == ("adam", 1e-3)


@pytest.mark.parametrize("algorithm", ["scaffold", "pfedwireless"])
def test_sgd_algorithms_get_their_declared_defaults(algorithm):
    declared = ALGORITHMS.get(algorithm).factory.server.train_defaults
    assert declared["optimizer"] == "sgd"
    t = _train(algorithm, model={"name": "multimodal"}) if algorithm == "pfedwireless" else _train(algorithm)
    for k, v in declared.items():
        assert getattr(t, k) == v


def test_keys_the_user_sets_win_over_declared_ones():
    t = _train("scaffold", {"lr": 0.05})
    assert (t.optimizer, t.lr) == ("sgd", 0.05)
    t = _train("scaffold", {"optimizer": "adam"})
    assert (t.optimizer, t.lr) == ("adam", 0.01)  # the declared lr still fills the gap


def test_every_declared_key_is_a_train_setting():
    known = set(TrainConfig.__dataclass_fields__)
    for name in ALGORITHMS.names():
        declared = getattr(ALGORITHMS.get(name).factory.server, "train_defaults", {}) or {}
        assert set(declared) <= known, (name, declared)
