"""benchmarks/missing: the grid's table spec (tables.toml, kinds of mmfl/bench/spec_setting_rows.py) over
fixture runs (tests/bench_spec_fixtures.py) writes, section by section, exactly what the script it
replaced wrote over the same runs (benchmarks/missing/paired.py, commit 853cc14; goldens
tests/fixtures/bench_specs/missing-{audio,long,image}.md, rendered by that script); and the post-run
split evaluation (mmfl.bench.split_eval) on real runs through ``mmfl bench``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_spec_fixtures import CUSTOM, fixture_grid, render_lines

import mmfl
from mmfl.bench import load_grid
from mmfl.bench.spec import TableSpec
from mmfl.cli import main
from mmfl.data.base import PRESENT
from mmfl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "bench_specs"
GRID = ROOT / "benchmarks" / "missing" / "grid.toml"


def test_spec_renders_what_paired_py_rendered(tmp_path, monkeypatch):
    g = fixture_grid(GRID, tmp_path / "raw")
    CUSTOM["missing"](g)
    text = render_lines(g, monkeypatch)
    at = 0
    for group in ("audio", "long", "image"):
        old = (GOLDEN / f"missing-{group}.md").read_text()
        assert old in text[at:], group
        at = text.index(old, at) + len(old)
    assert text.rstrip().endswith("## Reading")  # the grid's keep_below marker closes the generated part


def test_grid_plans_the_three_sweeps_it_replaced():
    g = load_grid(GRID)
    runs = {r.name: r.raw for r in g.runs()}
    assert len(runs) == 45 + 15 + 30
    assert runs["drop-fedcmi-s3"]["modalities"]["missing_policy"] == "drop_modality:audio"
    assert runs["drop-fedcmi-s3"]["model"]["two_projector"] is True
    assert runs["long-complete-mfedavg-s0"]["rounds"] == 24
    img = runs["image-drop-fedcmi-s4"]["modalities"]
    assert img["missing_policy"] == "drop_modality:image" and img["missing_rate"] == {"audio": 0.0, "image": 0.4}
    assert img["test_missing_rate"] == {"audio": 0.0, "image": 0.4} and runs["image-drop-fedcmi-s4"]["seed"] == 4


def test_setting_rows_needs_known_keys(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text('[[blocks]]\nkind = "setting_rows"\ngroup = "g"\ncels = "{v.x}"\n')
    with pytest.raises(ConfigError, match="unknown key 'cels'"):
        TableSpec(p)


CONFIG = """\
name = "sm"
seed = 0
rounds = 2
threads = 1
[data]
name = "mfeat"
views = ["pix", "fou"]
[partition]
name = "dirichlet"
num_clients = 4
beta = 5.0
[modalities]
name = "all"
missing_rate = { fou = 0.4 }
test_missing_rate = { fou = 0.4 }
[model]
name = "multimodal"
feat_dim = 8
mlp_hidden = [16]
[algorithm]
name = "mfedavg"
[train]
local_epochs = 1
batch_size = 64
lr = 0.05
"""

GRID_TOML = """\
name = "sm"
raw_dir = "raw"
tables = "tables.toml"
seeds = [0]
workers = 1
config = "base.toml"
[groups.g]
template = "{setting}-{method}-s{seed}"
post = { call = "split_json", writes = "split.json" }
[groups.g.settings.mask]
set = { "modalities.missing_policy" = "mask" }
[groups.g.settings.drop]
label = "drop_modality:fou"
set = { "modalities.missing_policy" = "drop_modality:fou" }
[groups.g.methods]
mfedavg = { label = "MFedAvg" }
"""

TABLES = """\
hooks = "mmfl.bench.split_eval"
[[blocks]]
kind = "setting_rows"
group = "g"
col_head = "{label} with / without"
cell = "{v.with} / {v.without}"
values.with = { key = "accuracy/with:fou", reader = "split.json", agg = "mean_pstd_n", digits = 2 }
values.without = { key = "accuracy/without:fou", reader = "split.json", agg = "mean_pstd_n", digits = 2 }
"""


@pytest.mark.usefixtures("one_thread")
def test_split_evaluation_after_the_runs_splits_the_final_accuracy(tmp_path, capsys):
    """After ``mmfl bench`` (the group's post), each run's split.json holds the final model's accuracy
    on the test rows with / without ``fou``: exactly 40 % lack it, the same rows under ``drop_modality``
    (its test set has no ``fou``: the rows the same seed masks), and the two mix into the run's final
    test accuracy."""
    for name, text in (("base.toml", CONFIG), ("grid.toml", GRID_TOML), ("tables.toml", TABLES)):
        (tmp_path / name).write_text(text)
    assert main(["bench", str(tmp_path / "grid.toml")]) == 0
    report = capsys.readouterr().out
    ref = mmfl.load_run(tmp_path / "raw" / "mask-mfedavg-s0").federation().test
    has = ref.features[PRESENT + "fou"].numpy()[ref.base_rows()]
    assert abs(has.mean() - 0.6) < 0.01
    for policy in ("mask", "drop"):
        run = tmp_path / "raw" / f"{policy}-mfedavg-s0"
        split = json.loads((run / "split.json").read_text())
        mix = (has.sum() * split["accuracy/with:fou"] + (~has).sum() * split["accuracy/without:fou"]) / len(has)
        assert mix == pytest.approx(json.loads((run / "summary.json").read_text())["final_accuracy"], abs=1e-6)
        assert f"{100 * split['accuracy/with:fou']:.2f} ± 0.00 / " in report
    assert "fou" not in mmfl.load_run(tmp_path / "raw" / "drop-mfedavg-s0").federation().test.modalities
