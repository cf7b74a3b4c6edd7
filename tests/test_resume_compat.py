"""Resuming a run folder written by an older mmfl: a setting added since (absent from its
config.toml) counts at its default, so the run resumes; a setting that really differs still
refuses to resume, naming the key."""

from __future__ import annotations

import json
import tomllib

import pytest
import tomli_w

from mmfl.config import load_config
from mmfl.engine.runner import Experiment, with_new_defaults
from mmfl.errors import ConfigError

TINY = ["data.name=digits", "partition.num_clients=3", "model.name=mlp", "model.hidden=[16]",
        "train.local_epochs=1", "rounds=2", "threads=1"]


def _run(tmp_path, rounds, *extra):
    cfg = load_config(None, [*TINY, f"output_dir={str(tmp_path)!r}".replace("'", '"'), "name=r",
                             f"rounds={rounds}", *extra])
    return cfg, Experiment(cfg, progress=False)


def _drop(path, table, key):
    raw = tomllib.loads(path.read_text())
    (raw if table is None else raw[table]).pop(key)
    path.write_text(tomli_w.dumps(raw))


def test_a_setting_added_since_the_run_counts_at_its_default(tmp_path):
    cfg, exp = _run(tmp_path, 1)
    exp.run()
    saved = cfg.run_dir / "config.toml"
    _drop(saved, None, "personal_eval")  # as an mmfl from before run.personal_eval wrote it
    _drop(saved, "algorithm", "aggregation")  # ... and before algorithm.aggregation
    theirs = with_new_defaults(tomllib.loads(saved.read_text()), cfg)
    assert theirs["personal_eval"] is False and theirs["algorithm"]["aggregation"] == "weighted_mean"
    _, exp2 = _run(tmp_path, 2)
    exp2.run(resume=True)
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]


def test_a_setting_that_differs_still_refuses_to_resume(tmp_path):
    cfg, exp = _run(tmp_path, 1)
    exp.run()
    _drop(cfg.run_dir / "config.toml", "algorithm", "aggregation")
    _, exp2 = _run(tmp_path, 2, "algorithm.aggregation=\"mean\"")
    with pytest.raises(ConfigError, match="config differs from the saved run in algorithm"):
        exp2.run(resume=True)

