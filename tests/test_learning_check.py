"""A run that does not learn says so once (mmfl.engine.learning_check): a learning rate far too
small leaves train_loss at ln K and prints one note naming train.lr / train.optimizer; a
centralized run whose learning rate is far too large fails with "lower train.lr", not with the
advice to drop clients; a run that learns prints nothing."""

from __future__ import annotations

import io
import math

import pytest

import mmfl
from mmfl.engine.learning_check import LearningCheck, diverged
from mmfl.errors import MMFLError

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(tmp_path, name, **train):
    """sklearn's digits (10 classes), 3 iid clients, the default mlp, 4 short rounds."""
    return {"name": name, "rounds": 4, "threads": 1, "output_dir": str(tmp_path),
            "data": {"name": "digits"}, "partition": {"name": "iid", "num_clients": 3},
            "train": {"local_epochs": 1, "batch_size": 64, **train}}


def notes(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("mmfl: note: train_loss")]


def test_lr_too_small_prints_one_note_naming_the_knobs(tmp_path, capsys):
    res = mmfl.run(tiny(tmp_path, "small", optimizer="sgd", lr=1e-7, momentum=0.0), progress=False)
    lines = notes(capsys.readouterr().err)
    assert len(lines) == 1, lines  # once per run, though rounds 3 and 4 both sit at ln 10
    assert f"ln(10) = {math.log(10):.2f}" in lines[0] and "for 3 rounds" in lines[0]
    assert 'train.optimizer = "adam"' in lines[0] and "train.lr" in lines[0]
    assert "when-a-run-does-not-learn" in lines[0]
    assert all(abs(v - math.log(10)) < 0.05 * math.log(10) for v in res.metrics["train_loss"])


def test_a_run_that_learns_prints_no_note(tmp_path, capsys):
    res = mmfl.run(tiny(tmp_path, "default"), progress=False)  # the default [train]: adam, lr 1e-3, cosine
    assert notes(capsys.readouterr().err) == []
    # it learns: 1.86 after 4 rounds (the cosine's round-4 lr is 1.5e-4; 1.55 with a constant lr), 78 % accuracy
    assert res.metrics["train_loss"].iloc[-1] < 0.85 * math.log(10) and res.metrics["accuracy"].iloc[-1] > 0.5


def test_diverged_centralized_run_says_lower_the_learning_rate(tmp_path, capsys):
    cfg = tiny(tmp_path, "big", optimizer="sgd", lr=999.0)  # the largest lr the schema allows is 1000
    cfg["algorithm"] = {"name": "centralized"}
    with pytest.raises(MMFLError) as e:
        mmfl.run(cfg, progress=False)
    msg = str(e.value)
    assert "lower train.lr" in msg and "on_nonfinite" in msg and "only client" in msg
    cfg["algorithm"] = {"name": "fedavg"}  # a federated run keeps the advice to drop clients
    cfg["name"] = "big-fed"
    with pytest.raises(MMFLError, match='set on_nonfinite = "drop"'):
        mmfl.run(cfg, progress=False)


def test_rising_loss_and_chance_rules():
    out = io.StringIO()
    check = LearningCheck(4, "adam", 1e-3, stream=out)
    said = [check.update({"round": r + 1, "train_loss": v}) for r, v in enumerate([1.0, 0.9, 1.0, 1.1, 1.2, 1.3])]
    assert said[:4] == [None] * 4 and said[4] is not None and said[5] is None  # the 3rd rise in a row; once
    assert "risen for 3 rounds" in said[4] and "train.lr" in said[4] and out.getvalue().count("\n") == 1
    check = LearningCheck(2, "sgd", 0.01, stream=io.StringIO())
    ln2 = math.log(2)
    assert [check.update({"round": r, "train_loss": v}) is None
            for r, v in enumerate([ln2, ln2 * 1.03, 0.5, ln2, ln2, ln2 * 0.99])] == [True] * 5 + [False]
    check = LearningCheck(10, "sgd", 0.05, stream=io.StringIO())  # at ln K but falling steadily: learning
    assert all(check.update({"round": r, "train_loss": v}) is None for r, v in enumerate([2.30, 2.25, 2.20, 2.19]))
    check = LearningCheck(4, "adam", 1e-3, stream=io.StringIO())  # a fitted model's loss jitters: no sign
    jitter = [1e-4, 2e-4, 4e-4, 8e-4, 0.01]
    assert all(check.update({"round": r, "train_loss": v}) is None for r, v in enumerate(jitter))
    check = LearningCheck(3, "sgd", 0.01, stream=io.StringIO())  # a first-round loss of 8398 (raw inputs)
    said = check.update({"round": 1, "train_loss": 8398.0})
    assert said is not None and "8398 in round 1, over 100 x ln(K)" in said and "standardize" in said
    rise = [1.0, 0.9, 1.0, 1.1, 1.2, 1.3]  # under a decaying lr the mean local loss rises by design: no sign
    check = LearningCheck(4, "adam", 1e-3, stream=io.StringIO(), decaying=True)
    assert all(check.update({"round": r + 1, "train_loss": v}) is None for r, v in enumerate(rise))
    check = LearningCheck(4, "adam", 1e-3, stream=io.StringIO(), decaying=True)  # stuck still counts
    assert [check.update({"round": r, "train_loss": math.log(4)}) is None for r in range(3)] == [True, True, False]
    check = LearningCheck(1, "sgd", 0.01, stream=io.StringIO())  # one class: no ln K rule, no error
    assert check.update({"round": 1, "train_loss": 0.0}) is None
    assert check.update({"round": 2, "accuracy": 0.5}) is None  # no train_loss (an algorithm without one)


def test_diverged_rewrites_only_pooled_nonfinite_errors():
    e = MMFLError("client 0 sent a non-finite value in 'w' (round 1, route train); "
                  'set on_nonfinite = "drop" to skip such clients')
    assert diverged(e, pooled=False) is e
    assert "lower train.lr" in str(diverged(e, pooled=True))
    other = MMFLError("something else")
    assert diverged(other, pooled=True) is other


def test_a_decaying_lr_does_not_read_as_a_rising_loss(tmp_path, capsys):
    """The untouched [train] decays its lr by a cosine; label-skewed clients' mean local loss then
    rises in the last rounds while accuracy climbs. The runner tells the check (decaying=True):
    no note. Replayed without it, the same losses would get the "risen" note."""
    cfg = {"name": "cos", "rounds": 12, "threads": 1, "output_dir": str(tmp_path), "data": {"name": "digits"},
           "partition": {"name": "dirichlet", "num_clients": 5, "beta": 0.3}, "train": {"local_epochs": 5}}
    res = mmfl.run(cfg, progress=False)
    assert notes(capsys.readouterr().err) == []
    loss, acc = list(res.metrics["train_loss"]), list(res.metrics["accuracy"])
    assert acc[-1] > acc[-4] and loss[-1] > loss[-2] > loss[-3] > loss[-4]  # 0.76 -> 0.80 while 0.34 -> 0.62
    replay = LearningCheck(10, "adam", 1e-3, stream=io.StringIO())
    assert any(replay.update({"round": r + 1, "train_loss": v}) for r, v in enumerate(loss))
