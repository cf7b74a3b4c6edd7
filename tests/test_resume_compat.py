"""Resuming a run folder written by an older mmfl: a setting added since (absent from its
config.toml) counts at its default, so the run resumes; a setting that really differs still
refuses to resume, naming the key."""

from __future__ import annotations

import tomllib

import pytest
import tomli_w

from mmfl.engine.runner import with_new_defaults
from mmfl.errors import ConfigError

from helpers import config, experiment, rows


def _drop(path, table, key):
    raw = tomllib.loads(path.read_text())
    (raw if table is None else raw[table]).pop(key)
    path.write_text(tomli_w.dumps(raw))


def test_a_setting_added_since_the_run_counts_at_its_default(tmp_path):
    cfg = config(tmp_path, "r", rounds=1)
    experiment(cfg).run()
    saved = cfg.run_dir / "config.toml"
    _drop(saved, None, "personal_eval")  # as an mmfl from before run.personal_eval wrote it
    _drop(saved, "algorithm", "aggregation")  # ... and before algorithm.aggregation
    theirs = with_new_defaults(tomllib.loads(saved.read_text()), cfg)
    assert theirs["personal_eval"] is False and theirs["algorithm"]["aggregation"] == "weighted_mean"
    experiment(config(tmp_path, "r", rounds=2)).run(resume=True)
    assert [r["round"] for r in rows(cfg.run_dir)] == [1, 2]


def test_a_setting_that_differs_still_refuses_to_resume(tmp_path):
    cfg = config(tmp_path, "r", rounds=1)
    experiment(cfg).run()
    _drop(cfg.run_dir / "config.toml", "algorithm", "aggregation")
    exp2 = experiment(config(tmp_path, "r", "algorithm.aggregation=\"mean\"", rounds=2))
    with pytest.raises(ConfigError, match="config differs from the saved run in algorithm"):
        exp2.run(resume=True)

