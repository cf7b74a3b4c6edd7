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

from mmfl.bench import load_grid  # noqa: E402

GRID = ROOT / "benchmarks" / "recipe" / "grid.toml"
OLD_TRAIN = {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-5}  # the defaults before issue 25
NEW_TRAIN = {"optimizer": "adam", "lr": 1e-3, "momentum": 0.9, "weight_decay": 1e-5}  # the defaults after it
RECIPE_SCHEDULE = {"lr_schedule": "cosine", "lr_min": 0.0, "lr_rounds": 0}  # what an untouched [train] adds


def recipe_config(data_root: Path, name: str, variant: str, seed: int) -> dict:
    """grid.toml's run of ``variant`` on data set ``name`` (its root moved to ``data_root``)."""
    raw = load_grid(GRID).raw_config("table", variant, name, seed)
    return {**raw, "data": {**raw["data"], "root": str(data_root / name)}, "output_dir": str(data_root / "runs")}

PACKAGED = sorted((ROOT / "mmfl" / "configs").glob("*.toml")) + sorted((ROOT / "docs" / "examples").glob("*.toml"))


def test_train_defaults_are_adam_1e3():
    t = TrainConfig()
    assert (t.optimizer, t.lr) == ("adam", 1e-3)
    assert {k: asdict(t)[k] for k in NEW_TRAIN} == NEW_TRAIN  # the benchmark's "after" is the default
    assert {k: asdict(t)[k] for k in OLD_TRAIN} != OLD_TRAIN


@pytest.mark.parametrize("path", PACKAGED, ids=lambda p: p.name)
def test_packaged_configs_pin_their_optimizer(path):
    train = tomllib.loads(path.read_text()).get("train", {})
    assert "optimizer" in train and "lr" in train, f"{path.name}: [train] must pin optimizer and lr"
    # so the untouched recipe's cosine (mmfl.config.with_recipe_schedule) never reaches them
    assert train.get("lr_schedule", "constant") == resolve(tomllib.loads(path.read_text())).train.lr_schedule


def test_recipe_configs_leave_train_untouched_after_and_pin_it_before(tmp_path):
    prepare.build("wine", tmp_path / "wine")  # scikit-learn's bundled set: always there
    for variant in ("fedavg", "centralized", "fedavg-r30", "centralized-r30", "fedavg-raw"):
        raw = recipe_config(tmp_path, "wine", variant, 0)
        assert "train" not in raw, variant
        assert resolve(raw).train == replace(TrainConfig(), **RECIPE_SCHEDULE)  # the cosine of an untouched [train]
    for variant in ("fedavg", "centralized", "fedavg-r30", "centralized-r30"):  # "after": [data] untouched too
        raw = recipe_config(tmp_path, "wine", variant, 0)
        assert set(raw["data"]) == {"name", "root"} and raw["partition"] == {"name": "dirichlet", "num_clients": 5}
        assert set(raw) <= {"seed", "threads", "output_dir", "data", "partition", "algorithm", "rounds"}
        assert resolve(raw).data.params.normalize == "auto"
    before = resolve(recipe_config(tmp_path, "wine", "fedavg-sgd", 0))
    assert {k: asdict(before.train)[k] for k in OLD_TRAIN} == OLD_TRAIN
    assert before.train.lr_schedule == "constant"  # it names optimizer and lr: no recipe schedule
    assert before.data.params.normalize is False
    assert resolve(recipe_config(tmp_path, "wine", "fedavg-raw", 0)).data.params.normalize is False


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


def test_recipe_spec_renders_the_committed_table(tmp_path, monkeypatch):
    """tables.py renders benchmarks/results/recipe.md exactly from run folders whose final accuracies
    give its cells (per seed: the minimum shown and twice the value that makes the mean) and its
    references (computed from the prepared data; here the values it shows). The deleted run.py's
    table() rendered the same text from the same numbers."""
    import json
    import re

    from mmfl.bench.runner import load_spec, redirect, render

    committed = (ROOT / "benchmarks" / "results" / "recipe.md").read_text()
    cols = ["fedavg-sgd", "centralized-sgd", None, "fedavg", "centralized", None, "fedavg-r30", "centralized-r30",
            None, "fedavg-raw", "lr", "rf"]
    refs = {}
    for line in committed.splitlines()[2:]:
        name, shape, *vals = (c.strip() for c in line.strip("|").split("|"))
        refs[name] = {"shape": shape}
        for col, v in zip(cols, vals):
            if col is None:
                continue
            mean, lo = (float(x) / 100 for x in re.fullmatch(r"([\d.]+) \(([\d.]+)\)", v).groups())
            per_seed = [lo, (3 * mean - lo) / 2, (3 * mean - lo) / 2]
            if col in ("lr", "rf"):
                refs[name][col] = [mean] * 3 if col == "lr" else per_seed
                continue
            for seed, acc in enumerate(per_seed):
                d = tmp_path / f"{name}-{col}-s{seed}"
                d.mkdir()
                (d / "summary.json").write_text(json.dumps({"final_accuracy": acc}))
    spec = load_spec(GRID.with_name("tables.py"))
    monkeypatch.setattr(spec, "references", lambda root, seeds: dict(refs[root.name]))
    assert render(redirect(load_grid(GRID), tmp_path)).read_text() == committed


def test_recipe_grids_plan_the_old_scripts_runs():
    """grid.toml: 7 data sets x the table's 7 variants x seeds 0-2; grid-candidates.toml: the
    documented one-change-at-a-time candidates (its label-smoothing pair runs through tables.py's run)."""
    runs = load_grid(GRID).runs()
    assert len(runs) == 147 and runs[0].name == "italy_power-fedavg-s0"
    cand = load_grid(GRID.with_name("grid-candidates.toml")).runs()
    assert {r.group for r in cand} == {"osu_leaf", "breast_cancer"} and len(cand) == 139
    assert {r.seed for r in cand if r.method == "fedavg-r30-cos" and r.setting == "osu_leaf"} == set(range(10))
    ls = next(r for r in cand if r.method == "fedavg-r30-cos-ls")
    assert ls.raw["train"] == {"lr_schedule": "cosine"} and ls.raw["rounds"] == 30
