"""The Flower benchmark as a grid (benchmarks/flower/grid.toml + tables.py, replacing run.py): its
configs are the old script's workload, and its spec renders benchmarks/results/flower.md exactly
from run folders holding that report's measurements (the old run.py's report() rendered the same
text from them, with the old command line)."""

import json
import shutil
from pathlib import Path

import torch

from mmfl.bench import load_grid
from mmfl.bench.runner import load_spec, redirect, render

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "benchmarks" / "flower" / "grid.toml"
# flower.md's measurements: (total wall s, rounds wall s); 5 rounds, 30,019,600 bytes, accuracy 0.1
MEASURED = {"simulator": (10.1, 9.343), "flower-simulation": (35.4, 12.4), "flower-loopback": (328.8, 253.0)}
MACHINE = {"load": "1.9 2.5 3.3", "cpus": 2, "python": "3.11.7", "flwr": "1.41.0"}


def flower_runs(raw: Path) -> None:
    """A run folder per transport: metrics.jsonl, summary.json, the final checkpoint, wall.json."""
    from safetensors.torch import save_file

    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}
    for mode, (total, rounds) in MEASURED.items():
        d = raw / mode
        (d / "checkpoints" / "round_5").mkdir(parents=True)
        (d / "checkpoints" / "LATEST").write_text("round_5\n")
        save_file(state, str(d / "checkpoints" / "round_5" / "server.safetensors"))
        rows = [{"round": r, "wall_time_s": rounds / 5, "bytes_up": 3_001_960, "bytes_down": 3_001_960,
                 "accuracy": 0.1} for r in range(1, 6)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "summary.json").write_text(json.dumps({"final_accuracy": 0.1}))
        (d / "wall.json").write_text(json.dumps({**MACHINE, "total_s": total}))


def test_flower_grid_plans_the_three_transports_on_the_old_workload():
    for path, (clients, per_round, rounds, limit) in ((GRID, (100, 10, 5, None)),
                                                      (GRID.with_name("grid-quick.toml"), (20, 4, 2, 6000))):
        runs = load_grid(path).runs()
        assert [r.name for r in runs] == ["simulator", "flower-simulation", "flower-loopback"]
        raw = runs[0].raw
        assert all(r.raw == raw for r in runs)  # one workload, three transports
        assert (raw["partition"], raw["clients_per_round"], raw["rounds"], raw["data"].get("train_limit")) == (
            {"name": "dirichlet", "num_clients": clients, "beta": 0.5}, per_round, rounds, limit)
        assert (raw["model"], raw["algorithm"], raw["seed"], raw["threads"]) == (
            {"name": "simple_cnn"}, {"name": "fedavg"}, 0, 1)
        assert raw["train"] == {"optimizer": "sgd", "local_epochs": 1, "batch_size": 64, "lr": 0.01,
                                "momentum": 0.9, "weight_decay": 1e-5}
    assert hasattr(load_spec(GRID.with_name("tables.py")), "run")  # mmfl bench runs each transport through it


def test_flower_spec_renders_the_committed_report(tmp_path):
    flower_runs(tmp_path)
    path = render(redirect(load_grid(GRID), tmp_path))
    assert path.read_text() == (ROOT / "benchmarks" / "results" / "flower.md").read_text()
    shutil.rmtree(tmp_path / "flower-loopback")  # an unfinished transport: its row is left out
    assert "| flower-loopback |" not in render(redirect(load_grid(GRID), tmp_path)).read_text()


def test_a_spec_run_function_runs_each_run_instead_of_the_simulator(tmp_path):
    """``run(raw, cfg, run_dir, plan)`` in a grid's tables.py: mmfl bench's worker calls it (with the
    run's method, entry info and the grid's params) and trains nothing itself."""
    from mmfl.bench.runner import execute

    (tmp_path / "tables.py").write_text(
        "import json\n"
        "def run(raw, cfg, run_dir, plan):\n"
        "    run_dir.mkdir(parents=True, exist_ok=True)\n"
        "    (run_dir / 'plan.json').write_text(json.dumps(plan))\n"
        "    (run_dir / 'summary.json').write_text('{}')\n"
        "def report(b):\n    return ['# done']\n")
    (tmp_path / "grid.toml").write_text(
        'name = "t"\nraw_dir = "raw"\ntables = "tables.py"\nseeds = [3]\nworkers = 1\n[params]\nk = 7\n'
        '[set]\ndata = { name = "digits" }\nrounds = 1\n'
        '[groups.g]\ntemplate = "{method}"\n[groups.g.methods]\na = { info = { x = 1 } }\n')
    grid = load_grid(tmp_path / "grid.toml")
    assert execute(grid) == 1
    plan = json.loads((tmp_path / "raw" / "a" / "plan.json").read_text())
    assert plan == {"group": "g", "setting": plan["setting"], "method": "a", "seed": 3, "info": {"x": 1},
                    "params": {"k": 7}}
    assert not (tmp_path / "raw" / "a" / "metrics.jsonl").exists()  # the simulator did not run
