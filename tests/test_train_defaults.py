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


def test_an_untouched_train_table_decays_the_lr_by_a_cosine():
    """The default recipe (docs/recipe.md): no optimizer, lr or lr_schedule named -> cosine over
    the run's rounds, recorded in the saved config so a resumed run keeps it."""
    t = _train("fedavg")
    assert (t.optimizer, t.lr, t.lr_schedule, t.lr_min, t.lr_rounds) == ("adam", 1e-3, "cosine", 0.0, 0)
    assert _train("fedavg", {"local_epochs": 2, "batch_size": 16}).lr_schedule == "cosine"
    assert _train("centralized").lr_schedule == "cosine"
    cfg = resolve({"data": {"name": "digits"}})
    assert 'lr_schedule = "cosine"' in cfg.to_toml()


@pytest.mark.parametrize("train", [{"optimizer": "adam"}, {"optimizer": "sgd"}, {"lr": 1e-3}, {"lr": 3e-4},
                                   {"lr_schedule": "constant"}])
def test_a_train_table_that_names_its_optimizer_lr_or_schedule_keeps_what_it_says(train):
    t = _train("fedavg", train)
    assert t.lr_schedule == "constant"
    for k, v in train.items():
        assert getattr(t, k) == v


@pytest.mark.parametrize("algorithm", ["scaffold", "pfedwireless"])
def test_declared_train_defaults_count_as_named(algorithm):
    t = _train(algorithm, model={"name": "multimodal"}) if algorithm == "pfedwireless" else _train(algorithm)
    assert t.lr_schedule == "constant"  # their update rules' lr, as declared
    assert _train("scaffold", {"lr_schedule": "cosine"}).lr_schedule == "cosine"


def test_the_default_schedule_reaches_training(tmp_path):
    """Removing the default from config resolution fails here: an untouched [train] trains as an
    explicit cosine does, bit for bit, and not as a constant lr (round 2 of 3 runs at 7.5e-4)."""
    import mmfl

    def losses(name, **train):
        cfg = {"name": name, "rounds": 3, "threads": 1, "output_dir": str(tmp_path), "data": {"name": "digits"},
               "partition": {"name": "iid", "num_clients": 2}, "train": {"local_epochs": 1, **train}}
        return list(mmfl.run(cfg, progress=False).metrics["train_loss"])

    untouched = losses("untouched")
    assert untouched == losses("cosine", lr_schedule="cosine")
    constant = losses("constant", lr_schedule="constant")
    assert untouched[0] == constant[0] and untouched[1:] != constant[1:]
