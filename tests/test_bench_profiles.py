"""The accelerator benchmark's plan / one-cell mode and the paper benchmarks' profiles
(benchmarks/perf/accelerator.py, `mmfl bench --plan`, benchmarks/*/grid-paper.toml)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from mmfl.bench import load_grid

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


def test_moon_paper_profile_is_the_papers_grid_10_clients_10_epochs_100_rounds():
    runs = load_grid(BENCH / "moon" / "grid-paper.toml").runs()
    assert len(runs) == 45  # 3 betas x 5 methods x 3 seeds
    assert {r.setting for r in runs} == {"0.1", "0.5", "5"}
    assert {r.method for r in runs} == {"fedavg", "fedprox", "scaffold", "moon", "local"}
    assert {r.seed for r in runs} == {0, 1, 2}
    for r in runs:
        assert (r.raw["rounds"], r.raw["train"]["local_epochs"], r.raw["partition"]["num_clients"]) == (100, 10, 10)
        assert r.raw["data"] == {"name": "fashion_mnist", "train_limit": 0}  # the full training set
    assert {r.raw["partition"]["beta"] for r in runs} == {0.1, 0.5, 5.0}


@pytest.mark.parametrize("bench,count,rounds,epochs", [("fedcmi", 288, 100, 5), ("creamfl", 141, 30, 5)])
def test_paper_profile_grid_expands_to_its_cell_count(bench, count, rounds, epochs):
    runs = load_grid(BENCH / bench / "grid-paper.toml").runs()
    assert len(runs) == count
    # the server-alone reference runs one client for one epoch a round (kd_weight 0: no client reaches it)
    trained = [r for r in runs if "server_alone" not in r.name]
    assert {(r.raw["rounds"], r.raw["train"]["local_epochs"]) for r in trained} == {(rounds, epochs)}
    assert {r.raw["rounds"] for r in runs} == {rounds}


def test_bench_options_set_device_and_batch_clients_and_plan_runs_nothing(tmp_path, capsys):
    """``mmfl bench GRID --device D --batch-clients B`` lays the two run settings over every run;
    ``--plan`` checks every config and lists the runs (the profiles' grid files: grid-paper.toml)."""
    from mmfl.bench import bench_main
    from mmfl.bench.plan import run_sets

    sets = run_sets("cuda", "false")
    assert sets == ['set.device="cuda"', "set.batch_clients=false"]
    run = load_grid(BENCH / "moon" / "grid-paper.toml", sets).runs()[0]
    assert (run.raw["device"], run.raw["batch_clients"]) == ("cuda", False)
    grid = BENCH / "moon" / "grid-paper.toml"
    assert bench_main(grid, ["--plan", "--device", "cpu", "--raw-dir", str(tmp_path)]) == 0  # runs nothing
    assert "grid-paper.toml: 45 runs" in capsys.readouterr().out and not any(tmp_path.iterdir())
    assert bench_main(grid, ["--plan", "--batch-clients", "maybe"]) == 2  # one error line
    assert "mmfl: error: --batch-clients: true or false" in capsys.readouterr().err


def test_accelerator_plan_checks_every_cell_config_on_cpu(tmp_path):
    acc = _module(BENCH / "perf" / "accelerator.py", "bench_accelerator")
    a = acc.parse(["--quick", "--device", "cpu", "--out-dir", str(tmp_path)])
    cells = acc.plan(a)
    assert len(cells) == 2 * 2 * 2 * 2 + 4  # workloads x algorithms x cohorts x (one-by-one, stacked) + Flower at 10
    cfg = acc.config("cnn", "moon", 50, "stacked", a)
    assert (cfg["device"], cfg["threads"], cfg["batch_clients"], cfg["clients_per_round"]) == ("cpu", 1, True, 50)
    assert acc.config("cnn", "moon", 50, "one-by-one", a)["batch_clients"] is False
    assert acc.main(["--quick", "--device", "cpu", "--plan", "--out-dir", str(tmp_path)])["cells"] == cells


def test_accelerator_one_cell_measures_throughput_and_kernel_share_on_cpu(tmp_path, monkeypatch):
    import mmfl.engine.runner as runner

    # the benchmark memoizes the federation in the runner module (memo_federation): undone after the test
    monkeypatch.setattr(runner, "build_federation", runner.build_federation)
    acc = _module(BENCH / "perf" / "accelerator.py", "bench_accelerator")
    res = acc.main(["--device", "cpu", "--workloads", "cnn", "--algorithms", "fedavg", "--cohorts", "3",
                    "--rounds", "2", "--repeats", "2", "--modes", "one-by-one", "stacked", "--no-write", "--out-dir", str(tmp_path)])
    cells = res["cells"]
    assert set(cells) == {"cnn|fedavg|3|one-by-one", "cnn|fedavg|3|stacked"}
    assert cells["cnn|fedavg|3|stacked"]["batched_clients"] == 3  # really stacked
    assert all(c["clients_per_s"] > 0 for c in cells.values())
    assert all(c["cpu"]["n"] == 2 and c["cpu"]["q1"] <= c["cpu"]["median"] <= c["cpu"]["q3"] for c in cells.values())
    for u in res["utilization"].values():
        assert 0 < u["kernel_s"] and 0 < u["fraction"] < 1.5
