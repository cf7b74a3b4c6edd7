"""benchmarks/leakage/grid.toml + tables.toml (which replaced run.py and seeds.py): over real run
folders (17 of the audited runs, tests/fixtures/bench_specs/leakage_runs: audit.json, summary.json,
metrics.jsonl, config.toml) every table row equals what the old scripts' table(), reps_block() and
block() rendered over the same runs (tests/fixtures/bench_specs/leakage-rows.md, written by them
before they were deleted), and the grid plans exactly those runs' configs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bench_spec_fixtures import render_lines

from mmfl.bench import load_grid
from mmfl.config import resolve
from mmfl.config_raw import load_raw

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "tests" / "fixtures" / "bench_specs" / "leakage_runs"


def test_leakage_spec_renders_the_rows_the_old_scripts_rendered(tmp_path, monkeypatch):
    g = load_grid(ROOT / "benchmarks/leakage/grid.toml")
    g = dataclasses.replace(g, raw_dir=RUNS, report=tmp_path / "leakage.md")
    text = render_lines(g, monkeypatch)
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert rows == (RUNS.parent / "leakage-rows.md").read_text().splitlines()
    assert "`.venv/bin/mmfl bench benchmarks/leakage/grid.toml --group reps` (seed 1; 32 shadow clients" in text
    assert text.count("<!-- reps -->") == text.count("<!-- /seeds -->") == 1


def test_the_grid_plans_the_configs_of_the_audited_runs():
    runs = {r.name: r for r in load_grid(ROOT / "benchmarks/leakage/grid.toml").runs()}
    for d in sorted(RUNS.iterdir()):
        old = load_raw(d / "config.toml")
        new = resolve({**runs[d.name].raw, "name": old["name"], "output_dir": old["output_dir"]})
        assert new.to_toml().strip() == (d / "config.toml").read_text().strip(), d.name
