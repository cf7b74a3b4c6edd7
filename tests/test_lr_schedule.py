"""The cosine learning-rate schedule over rounds (``train.lr_schedule``): the formula by hand,
every client of a round trains with that round's lr (sequential and batched paths), a
server's persistent optimizer follows it, resume stays exact, bad values are one-line errors."""

from __future__ import annotations

import math

import pytest

from mmfl.algorithms.fedavg import FedAvgClient
from mmfl.config import TrainConfig
from mmfl.core.training import cosine_lr, train_at_round, train_for_run
from mmfl.errors import ConfigError

from helpers import config, rows, run


def test_cosine_lr_by_hand():
    # lr_min + (lr - lr_min) (1 + cos(pi t / T)) / 2, t clamped to [0, T]
    assert cosine_lr(0.1, 0, 4) == pytest.approx(0.1)
    assert cosine_lr(0.1, 2, 4) == pytest.approx(0.05)
    assert cosine_lr(0.1, 1, 4) == pytest.approx(0.1 * (1 + math.cos(math.pi / 4)) / 2)
    assert cosine_lr(0.1, 4, 4, lr_min=0.01) == pytest.approx(0.01)
    assert cosine_lr(0.1, 9, 4, lr_min=0.01) == pytest.approx(0.01)  # past the period: stays at lr_min


def test_train_at_round_constant_is_unchanged_and_cosine_needs_a_period():
    train = TrainConfig(optimizer="sgd", lr=0.2)
    assert train_at_round(train, 7) is train
    cos = TrainConfig(optimizer="sgd", lr=0.2, lr_schedule="cosine")
    with pytest.raises(ValueError, match="unresolved"):
        train_at_round(cos, 1)
    run = train_for_run(cos, 10)
    assert run.lr_rounds == 10 and train_for_run(TrainConfig(optimizer="sgd", lr=0.2, lr_schedule="cosine", lr_rounds=3), 10).lr_rounds == 3
    assert train_at_round(run, 5).lr == pytest.approx(0.1) and train_at_round(run, 0).lr == pytest.approx(0.2)


@pytest.mark.parametrize("batch", [False, True])
def test_every_client_of_a_round_trains_with_that_rounds_lr(tmp_path, monkeypatch, batch):
    seen: dict[int, set] = {}
    orig = FedAvgClient.train

    def spy(self, msg):
        seen.setdefault(self.ctx.rnd, set()).add(self.ctx.train.lr)
        return orig(self, msg)

    monkeypatch.setattr(FedAvgClient, "train", spy)
    if batch:  # the batched path builds its contexts itself
        from mmfl.engine import batched_delivery as batched

        orig_stacked = batched.train_stacked

        def spy_stacked(model, client, tasks, datas, gens, train, epochs=None):
            seen.setdefault(client.ctx.rnd, set()).add(train.lr)
            return orig_stacked(model, client, tasks, datas, gens, train, epochs)

        monkeypatch.setattr(batched, "train_stacked", spy_stacked)
    run(tmp_path, "cos", 'train.lr_schedule="cosine"', "train.lr_min=0.01",
        f"batch_clients={'true' if batch else 'false'}", rounds=4)
    assert sorted(seen) == [0, 1, 2, 3]
    for r, lrs in seen.items():  # one lr per round, the schedule's
        assert len(lrs) == 1 and lrs.pop() == pytest.approx(0.01 + 0.04 * (1 + math.cos(math.pi * r / 4)) / 2)
    assert all(r.get("batched_clients", 0) == (3 if batch else 0) for r in rows(tmp_path / "cos"))
    saved = (tmp_path / "cos" / "config.toml").read_text()
    assert "lr_rounds = 0" in saved  # the period stays 'the run's rounds', so resume may extend it


def test_resume_with_a_cosine_schedule_equals_the_uninterrupted_run(tmp_path):
    over = ['train.lr_schedule="cosine"', "train.lr_rounds=3"]

    def timeless_rows(name, rounds, resume=False):
        return [{k: v for k, v in r.items() if "time" not in k}
                for r in rows(run(tmp_path, name, *over, rounds=rounds, resume=resume))]

    full = timeless_rows("a", 3)
    timeless_rows("b", 1)
    assert timeless_rows("b", 3, resume=True) == full


@pytest.mark.parametrize("over, field", [
    ('train.lr_schedule="linear"', "train.lr_schedule"),
    ("train.lr_min=1.0", "train.lr_min"),
    ("train.lr_rounds=-1", "train.lr_rounds"),
])
def test_bad_schedule_values_are_one_line_errors(tmp_path, over, field):
    with pytest.raises(ConfigError, match=field):
        config(tmp_path, "bad", over, rounds=None)
