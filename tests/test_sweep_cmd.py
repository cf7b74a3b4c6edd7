"""``mmfl sweep``: a user's grid file (base, seeds, [axes]) run in worker processes, resumed, checked
before any run starts, and summarised as a mean ± std table that equals the runs' own summaries."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from mmfl.bench.sweep_grid import load_sweep
from mmfl.cli import demo_config_path, main

GRID = f"""
base = "{demo_config_path()}"
seeds = [0, 1]
[set]
rounds = 2
threads = 1
[axes]
"algorithm.name" = ["fedavg", "fedprox"]
"""


def _write(folder: Path, text: str, name: str = "grid.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(text)
    return p


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The 2 methods x 2 seeds demo grid, 2 rounds, run once with 2 workers (one thread each)."""
    grid = _write(tmp_path_factory.mktemp("sweep"), GRID)
    rc = main(["sweep", str(grid), "--workers", "2"])
    return grid, grid.parent / "grid", rc


def test_sweep_runs_every_planned_run_into_the_folder_next_to_the_grid(swept):
    grid, out, rc = swept
    assert rc == 0
    names = ["fedavg-s0", "fedprox-s0", "fedavg-s1", "fedprox-s1"]
    for n in names:
        assert (out / n / "summary.json").is_file()
        assert json.loads((out / n / "summary.json").read_text())["rounds"] == 2
    assert {f.name for f in out.iterdir()} >= {"results.md", "results.csv", "results.png"}
    assert (out / "results.png").stat().st_size > 10_000


def test_table_mean_and_std_equal_the_runs_summaries(swept):
    """The CSV's mean/std of each method (over seeds) are np.mean/np.std of the runs'
    summary.json final_accuracy, and the Markdown cell shows them in percent."""
    _, out, _ = swept
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["method"], r["metric"]) for r in rows] == [("fedavg", "accuracy"), ("fedprox", "accuracy")]
    md = (out / "results.md").read_text()
    for r in rows:
        accs = [json.loads((out / f"{r['method']}-s{s}" / "summary.json").read_text())["final_accuracy"]
                for s in (0, 1)]
        assert float(r["mean"]) == pytest.approx(np.mean(accs), abs=1e-12)
        assert float(r["std"]) == pytest.approx(np.std(accs), abs=1e-12)
        assert int(r["n"]) == 2 and int(r["failed"]) == 0 and r["algorithm.name"] == r["method"]
        assert f"| {r['method']} | {100 * np.mean(accs):.2f} ± {100 * np.std(accs):.2f} |" in md


def test_rerun_skips_finished_runs_and_reruns_a_missing_one(swept, monkeypatch, capsys):
    import mmfl.sweep as pool

    grid, out, _ = swept
    ran = []
    monkeypatch.setattr(pool, "run_pool", lambda todo, fn, raw_dir, workers, progress=False: ran.extend(
        n for n, _ in todo) or len(todo))
    assert main(["sweep", str(grid), "--workers", "2"]) == 0
    assert ran == [] and "4 finished, 0 to do" in capsys.readouterr().out
    summary = out / "fedprox-s1" / "summary.json"
    kept = summary.read_text()
    summary.unlink()  # as if that run had been interrupted
    try:
        main(["sweep", str(grid), "--workers", "2"])
        assert ran == ["fedprox-s1"]
    finally:
        summary.write_text(kept)


def test_dry_run_lists_the_planned_runs_and_runs_nothing(tmp_path, capsys):
    grid = _write(tmp_path, GRID + '"partition.beta" = [0.1, 0.5]\n')
    assert main(["sweep", str(grid), "--dry-run", "--out", str(tmp_path / "o")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "8 runs planned" in lines[0]
    assert sorted(line.split()[0] for line in lines[1:]) == sorted(
        f"beta{b}-{m}-s{s}" for b in (0.1, 0.5) for m in ("fedavg", "fedprox") for s in (0, 1))
    assert all("to do" in line for line in lines[1:])
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("axis, needle", [('"algorithm.name" = ["fedavg", "fedprx"]', "unknown algorithm 'fedprx'"),
                                          ('"partition.bta" = [0.1]', "partition.bta"),
                                          ('"train.lr" = []', "non-empty list")])
def test_a_bad_axis_is_one_line_exit_2_before_any_run(tmp_path, capsys, axis, needle):
    grid = _write(tmp_path, f'base = "{demo_config_path()}"\nseeds = [0]\n[axes]\n"train.local_epochs" = [1]\n{axis}\n')
    assert main(["sweep", str(grid)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mmfl: error: ") and needle in err and "\n" not in err
    assert not (tmp_path / "grid").exists()  # nothing ran, no folder made


def test_a_failed_run_is_recorded_reported_with_its_error_and_exits_1(tmp_path, monkeypatch, capsys):
    """A value that diverges at run time (lr 999, under the schema bound of 1000): its runs get failed.txt, the table counts them,
    the report names them with their one-line error; the other cell is complete."""
    import mmfl.sweep as pool

    # in this process, one after the other (the worker function itself, without spawning)
    monkeypatch.setattr(pool, "run_pool", lambda todo, fn, raw_dir, workers, progress=False: [
        fn(n, r, str(raw_dir)) for n, r in todo] and len(todo))
    grid = _write(tmp_path, f'base = "{demo_config_path()}"\nseeds = [0]\n[set]\nrounds = 1\nthreads = 1\n'
                            '[axes]\n"train.lr" = [0.01, 999.0]\n')
    assert main(["sweep", str(grid)]) == 1
    out = capsys.readouterr().out
    failed = tmp_path / "grid" / "lr999.0-s0" / "failed.txt"
    assert failed.is_file() and "non-finite" in failed.read_text()
    assert "**Failed runs** (1" in out and "`lr999.0-s0`: MMFLError: " in out
    assert "| lr = 999.0 | — [1 failed] |" in out
    assert (tmp_path / "grid" / "lr0.01-s0" / "summary.json").is_file()


def test_short_form_crosses_named_methods_with_axes_and_accepts_an_inline_base(tmp_path):
    grid = _write(tmp_path, """
seeds = [3]
[base]
rounds = 1
data = { name = "mfeat" }
partition = { name = "dirichlet", num_clients = 4 }
model = { name = "mlp" }
[methods.prox]
label = "FedProx"
set = { "algorithm.name" = "fedprox" }
[axes]
"algorithm.mu" = [0.1, 1.0]
data = { name = ["mfeat"] }
""")
    g, metrics = load_sweep(grid)
    runs = {r.name: r for r in g.runs()}
    assert sorted(runs) == ["mfeat-prox_mu0.1-s3", "mfeat-prox_mu1.0-s3"]
    raw = runs["mfeat-prox_mu1.0-s3"].raw
    assert raw["algorithm"] == {"name": "fedprox", "mu": 1.0} and raw["seed"] == 3 and raw["rounds"] == 1
    assert raw["partition"]["num_clients"] == 4
    assert [e.label for e in g.methods("sweep").values()] == ["FedProx, mu = 0.1", "FedProx, mu = 1.0"]
    assert g.raw_dir == tmp_path / "grid" and g.workers == 1 and metrics is None


def test_a_benchmark_grid_is_a_sweep_file_too(tmp_path):
    grid = _write(tmp_path, f"""
raw_dir = "raw"
config = "{demo_config_path()}"
seeds = [0, 1]
[groups.t.methods]
avg = {{ set = {{ "algorithm.name" = "fedavg" }} }}
""")
    g, _ = load_sweep(grid, out=tmp_path / "elsewhere")
    assert [r.name for r in g.runs()] == ["t--avg-s0", "t--avg-s1"]
    assert g.raw_dir == (tmp_path / "elsewhere").resolve()
