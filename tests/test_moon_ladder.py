"""The MOON ladder (benchmarks/moon/grid-ladder.toml + tables-ladder.toml, rendered by mmfl/bench/spec.py): the grid plans the
rungs the issue names with valid configs, and the table spec pairs MOON with FedAvg per rung
and writes its section into the report between its markers (replaced, not appended, on a rebuild)."""

import json
from pathlib import Path

from mmfl.bench import load_grid
from mmfl.bench.runner import render

GRID = Path(__file__).resolve().parent.parent / "benchmarks" / "moon" / "grid-ladder.toml"


def test_ladder_grid_plans_epochs_x_beta_x_four_methods_x_five_seeds():
    import mmfl

    runs = load_grid(GRID).runs()
    assert len(runs) == 120
    cells = {(r.raw["partition"]["beta"], r.raw["train"]["local_epochs"]) for r in runs}
    assert cells == {(b, e) for b in (0.1, 0.5) for e in (1, 5, 10)}
    assert {r.method for r in runs} == {"fedavg", "moon", "fedprox", "scaffold"}
    assert {r.seed for r in runs} == {0, 1, 2, 3, 4}
    fedavg = [r for r in runs if r.method == "fedavg"]
    assert all(r.raw["algorithm"] == {"name": "moon", "mu": 0.0} for r in fedavg)  # FedAvg with the probe
    assert len({r.raw["rounds"] for r in runs}) == 1  # the rungs differ only in beta and epochs
    for r in runs[:8]:
        mmfl.configure(r.raw)  # every config resolves (loads no data)


def _fake_run(raw: Path, name: str, curve: list[float]) -> None:
    d = raw / name
    d.mkdir(parents=True)
    rows = [{"round": i + 1, "accuracy": a, "moon/cos_glob": 0.9, "moon/cos_prev": 0.95} for i, a in enumerate(curve)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (d / "summary.json").write_text(json.dumps({"final_accuracy": curve[-1], "wall_time_s": 1.0}))


def test_ladder_tables_pair_moon_with_fedavg_and_replace_their_section(tmp_path):
    sets = [f'params.section="{tmp_path / "moon.md"}"']
    grid = load_grid(GRID, sets)
    import dataclasses

    grid = dataclasses.replace(grid, raw_dir=tmp_path / "raw")
    for s in range(5):  # MOON 2 points above FedAvg in every seed at beta 0.5, E = 10
        _fake_run(grid.raw_dir, f"ladder-b0.5-e10-fedavg-s{s}", [0.2, 0.4, 0.5, 0.55, 0.60 + 0.01 * s])
        _fake_run(grid.raw_dir, f"ladder-b0.5-e10-moon-s{s}", [0.2, 0.4, 0.5, 0.57, 0.62 + 0.01 * s])
    report = tmp_path / "moon.md"
    report.write_text("# MOON\n\n<!-- analysis -->\nhand-written\n")
    render(grid)
    render(grid)  # a rebuild replaces the section
    text = report.read_text()
    assert text.count("## Ladder toward the paper's regime") == 1 and "hand-written" in text
    row = next(x for x in text.splitlines() if x.startswith("| β = 0.5, E = 10: MOON"))
    assert "− FedAvg | +2.00 |" in row
    assert "(5 seeds)" in row
    assert "| β = 0.5, E = 10 (target 62.0) | MOON (μ = 1, τ = 0.5) | 5 |" in text
    assert "-0.050" in text  # cos(z, z_glob) − cos(z, z_prev) in the probe table
