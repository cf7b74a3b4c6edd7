"""The default recipe (docs/recipe.md): the [train] defaults are Adam at lr 1e-3 (decayed by a cosine
over the rounds where [train] names neither optimizer nor lr), every packaged
config pins its optimizer (so its numbers do not follow a change of default), and the recipe
benchmark's "after" runs leave [train] and [data] (but name and root) untouched while its "before" runs
pin the old values (SGD, raw inputs)."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from mmfl.config import TrainConfig, resolve

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "recipe"))
import prepare  # noqa: E402

_spec = importlib.util.spec_from_file_location("recipe_run", ROOT / "benchmarks" / "recipe" / "run.py")
recipe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(recipe)

PACKAGED = sorted((ROOT / "mmfl" / "configs").glob("*.toml")) + sorted((ROOT / "docs" / "examples").glob("*.toml"))


def test_train_defaults_are_adam_1e3():
    t = TrainConfig()
    assert (t.optimizer, t.lr) == ("adam", 1e-3)
    assert {k: asdict(t)[k] for k in recipe.NEW_TRAIN} == recipe.NEW_TRAIN  # the benchmark's "after" is the default
    assert {k: asdict(t)[k] for k in recipe.OLD_TRAIN} != recipe.OLD_TRAIN


@pytest.mark.parametrize("path", PACKAGED, ids=lambda p: p.name)
def test_packaged_configs_pin_their_optimizer(path):
    train = tomllib.loads(path.read_text()).get("train", {})
    assert "optimizer" in train and "lr" in train, f"{path.name}: [train] must pin optimizer and lr"
    # so the untouched recipe's cosine (mmfl.config.with_recipe_schedule) never reaches them
    assert train.get("lr_schedule", "constant") == resolve(tomllib.loads(path.read_text())).train.lr_schedule


def test_recipe_configs_leave_train_untouched_after_and_pin_it_before(tmp_path):
    prepare.build("wine", tmp_path / "wine")  # scikit-learn's bundled set: always there
    for variant in ("fedavg", "centralized", "fedavg-r30", "centralized-r30", "fedavg-raw"):
        raw = recipe.config(tmp_path, "wine", variant, 0, tmp_path / "runs")
        assert "train" not in raw, variant
        assert resolve(raw).train == replace(TrainConfig(), **recipe.RECIPE_SCHEDULE)  # the cosine of an untouched [train]
    for variant in ("fedavg", "centralized", "fedavg-r30", "centralized-r30"):  # "after": [data] untouched too
        raw = recipe.config(tmp_path, "wine", variant, 0, tmp_path / "runs")
        assert set(raw["data"]) == {"name", "root"} and raw["partition"] == {"name": "dirichlet", "num_clients": 5}
        assert set(raw) <= {"name", "seed", "threads", "output_dir", "data", "partition", "algorithm", "rounds"}
        assert resolve(raw).data.params.normalize == "auto"
    before = resolve(recipe.config(tmp_path, "wine", "fedavg-sgd", 0, tmp_path / "runs"))
    assert {k: asdict(before.train)[k] for k in recipe.OLD_TRAIN} == recipe.OLD_TRAIN
    assert before.train.lr_schedule == "constant"  # it names optimizer and lr: no recipe schedule
    assert before.data.params.normalize is False
    assert resolve(recipe.config(tmp_path, "wine", "fedavg-raw", 0, tmp_path / "runs")).data.params.normalize is False


def test_prepare_writes_a_two_modality_manifest_mmfl_reads(tmp_path):
    from mmfl.data import DATASETS

    prepare.build("breast_cancer", tmp_path / "bc")
    b = DATASETS.get("manifest").factory(DATASETS.params("manifest", {"root": str(tmp_path / "bc")}))
    assert dict(b.meta.modalities) == {"mean": (10,), "extremes": (20,)}
    assert b.meta.num_classes == 2 and len(b.train) + len(b.test) == 569
    ts = tmp_path / "t.ts"
    ts.write_text("@problemName t\n@classLabel true a b\n@data\n1,2,3,4:a\n4,3,2,1:b\n")
    rows = prepare.read_ts(ts)
    assert [lab for _, lab in rows] == ["a", "b"] and rows[0][0].shape == (1, 4)
    parts = prepare.derivative(("x", "dx"))(rows[0][0])
    assert parts["dx"].tolist() == [[1.0, 1.0, 1.0]]
