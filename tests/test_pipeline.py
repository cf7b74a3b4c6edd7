"""The round as a pipeline (mmfl.engine.pipeline): the runner walks the declared stages, so a new
stage is one module plus one line in ``STAGES`` and changes what a run records; a stage left out
is not done; a stage's ``make`` may refuse a config before any folder is touched."""

from __future__ import annotations

import importlib.util
import inspect

import pytest

from mmfl.engine import pipeline
from mmfl.engine.cohort import sample_cohort
from mmfl.engine.runner import Experiment
from mmfl.engine.stages.record import Checkpoint, Metrics
from mmfl.errors import ConfigError

from helpers import config, experiment, rows, run_config

BASE = ["data.name=digits", "partition.num_clients=4", "model.name=mlp", "model.hidden=[8]", "train.local_epochs=1",
        "train.batch_size=128", "threads=1", "clients_per_round=2", "rounds=2"]

STAGE_FILE = '''
from mmfl.engine.stages.base import Round, Stage


class CohortSum(Stage):
    """A throwaway stage: the sum of the cohort's client ids, and the rounds it saw at the end."""

    def start(self, first_round):
        self.seen = []

    def round(self, r: Round) -> None:
        r.row["cohort_sum"] = sum(r.cohort)
        self.seen.append(r.rnd)

    def finish(self, summary):
        (self.exp.run_dir / "seen.json").write_text(repr(self.seen))
'''


def cfg(tmp_path, name, *over):
    return config(tmp_path, name, *over, base=BASE, rounds=None)


def stage_module(tmp_path):
    """The new stage as a contributor writes it: one module of its own."""
    path = tmp_path / "cohort_sum_stage.py"
    path.write_text(STAGE_FILE)
    spec = importlib.util.spec_from_file_location("cohort_sum_stage", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_new_stage_is_one_module_and_one_line_in_the_declared_list(tmp_path, monkeypatch):
    new = stage_module(tmp_path).CohortSum
    plain = run_config(cfg(tmp_path, "plain"))
    # the one line: the stage's place in STAGES, here before the row is written
    monkeypatch.setattr(pipeline, "STAGES", pipeline.with_stage(pipeline.STAGES, new, before=Metrics))
    exp = run_config(cfg(tmp_path, "with"))
    got, want = rows(exp), rows(plain)
    assert [r["cohort_sum"] for r in got] == [sum(sample_cohort(exp.cfg, rnd, 4)) for rnd in range(2)]
    untimed = lambda r: {k: v for k, v in r.items() if k != "cohort_sum" and not k.endswith("_time_s")}  # noqa: E731
    assert [untimed(r) for r in got] == [untimed(r) for r in want]  # nothing else changed
    assert list(got[0])[-2:] == ["wall_time_s", "cohort_sum"]  # its keys where it stands in the list
    assert (exp.run_dir / "seen.json").read_text() == "[0, 1]"  # its finish hook ran


def test_a_stage_after_the_row_is_written_records_nothing(tmp_path):
    new = stage_module(tmp_path).CohortSum
    exp = run_config(cfg(tmp_path, "x"), stages=pipeline.with_stage(pipeline.STAGES, new, after=Metrics))
    assert all("cohort_sum" not in r for r in rows(exp))
    assert (exp.run_dir / "seen.json").read_text() == "[0, 1]"


def test_a_stage_left_out_is_not_done(tmp_path):
    exp = run_config(cfg(tmp_path, "nockpt"), stages=[s for s in pipeline.STAGES if s is not Checkpoint])
    assert [r["round"] for r in rows(exp)] == [1, 2]
    assert not list((exp.run_dir / "checkpoints").glob("round_*"))


def test_stages_that_do_not_apply_are_not_built_and_a_refusal_comes_before_the_folder(tmp_path):
    names = [type(s).__name__ for s in experiment(cfg(tmp_path, "a")).stages]
    assert "DPEpsilon" not in names and "Latency" not in names and "AttackRecord" not in names
    assert "Track" not in names and "Progress" not in names
    assert names[0] == "Train" and names.index("Metrics") < names.index("Checkpoint")
    with pytest.raises(ConfigError, match="attack.kind: 'shuffle_reps' changes exchanged representations"):
        experiment(cfg(tmp_path, "b", "attack.kind=\"shuffle_reps\""))
    assert not (tmp_path / "b").exists()


def test_with_stage_needs_one_anchor_and_the_round_loop_fits_one_screen():
    with pytest.raises(ValueError, match="exactly one"):
        pipeline.with_stage(pipeline.STAGES, Metrics)
    at = pipeline.STAGES.index(Metrics)
    assert pipeline.with_stage(pipeline.STAGES, Checkpoint, before=Metrics)[at] is Checkpoint
    assert pipeline.with_stage(pipeline.STAGES, Checkpoint, after=Metrics)[at + 1] is Checkpoint
    assert len(inspect.getsource(Experiment._run).splitlines()) <= 25


def test_a_rejected_reply_is_counted_once_in_a_round_without_evaluation(tmp_path):
    """The Dropped stage adds the evaluation's rejected replies only when an evaluation ran: before,
    a round without one listed training's rejected replies twice (the log is reset only to evaluate)."""
    exp = experiment(cfg(tmp_path, "inflate", "attack.kind=\"inflate_examples\"", "attack.fraction=0.5",
                         "clients_per_round=4", "eval_every=2", "rounds=2"))
    exp.run()
    got = rows(exp)
    assert "accuracy" not in got[0] and "accuracy" in got[1]  # round 1 without evaluation, round 2 with
    for r in got:
        assert r["replies_rejected"] == len(r["dropped"]) == 2
        assert sorted(x["client"] for x in r["rejected"]) == r["dropped"]
