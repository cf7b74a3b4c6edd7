"""The prepared GPU check (scripts/gpu_check.sh, benchmarks/perf/gpu_check.py) in its CPU smoke
mode, so it cannot rot between the sessions that are lent a GPU: every section runs at tiny sizes
and reports figures; a failing section is one line in a report that is still written; a spent
time budget skips sections with a line; nothing is written into the tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["env", "tests", "precision", "cohorts", "public", "moon", "flower"]


def smoke(tmp_path: Path, *args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess, dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMFL_GPU")}
    env["PYTHON"] = sys.executable
    out = tmp_path / "out"
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--smoke", "--out", str(out), *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    md = out / "accelerator-cpu-smoke.md"
    assert md.exists(), p.stdout[-3000:] + p.stderr[-3000:]
    return p, json.loads(md.with_suffix(".json").read_text())["sections"], md.read_text()


def test_smoke_mode_runs_every_section_on_the_cpu(tmp_path):
    before = sorted(p.name for p in (ROOT / "benchmarks" / "results").glob("accelerator-*"))
    p, res, md = smoke(tmp_path, "--budget", "600")  # a cap for slow CI machines; ~1 min on 2 loaded cores
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert list(res) == ORDER
    for name in ORDER[:-1]:
        assert res[name]["status"] == "ok", (name, res[name]["lines"])
    assert res["env"]["figures"]["import_failures"] == []
    assert " passed" in res["tests"]["figures"]["summary"] and res["tests"]["figures"]["rc"] == 0
    prec = res["precision"]["figures"]
    assert {"fp32", "bf16"} <= set(prec) and all(prec[k]["accuracy"] is not None for k in ("fp32", "bf16"))
    cells = res["cohorts"]["figures"]
    assert {c.split("|")[3] for c in cells} == {"one-by-one", "stacked"} and all(
        c["wall_clients_per_s"] > 0 for c in cells.values())
    assert res["public"]["figures"]["wall_s"] > 0
    moon = res["moon"]["figures"]
    assert set(moon["methods"]) == {"fedavg", "moon"} and moon["projected_s"] > 0 and moon["runs"] == 45
    # Flower: its setup runs; the deployment starts only with MMFL_GPU_SMOKE_FLOWER=1 (or flwr is absent)
    assert res["flower"]["status"] == "skipped"
    assert "Skipped in smoke mode" in res["flower"]["lines"][0] or "flwr does not import" in res["flower"]["lines"][0]
    for title in ("## Device tests on the GPU", "## bf16 vs fp32 learning", "## CreamFL's public terms",
                  "Projected wall time of the whole grid", "Flower's Ray simulation: **not measured**"):
        assert title in md
    assert sorted(p.name for p in (ROOT / "benchmarks" / "results").glob("accelerator-*")) == before  # not the tree


def test_a_failing_section_is_one_line_and_the_report_is_still_written(tmp_path):
    p, res, md = smoke(tmp_path, "--sections", "public", "precision", "--fashion", str(tmp_path / "nowhere"))
    assert p.returncode == 1  # a section failed
    assert res["public"]["status"] == "ok"
    (line,) = res["precision"]["lines"]
    assert res["precision"]["status"] == "failed"
    assert line.startswith("**Failed**: DataError: ") and "Fashion-MNIST directory not found" in line
    assert "Traceback" not in md
    assert list(res) == ["env", "precision", "public"]  # --sections: only these (env always)
    assert "| Device tests on the GPU | not run | — |" in md


def test_a_spent_budget_skips_each_section_with_a_line(tmp_path):
    p, res, md = smoke(tmp_path, "--budget", "0.5", timeout=120)
    assert p.returncode == 0
    assert [r["status"] for r in res.values()] == ["skipped"] * len(ORDER)
    assert all(r["lines"][0].startswith("Skipped: the time budget is out") for r in res.values())
    assert "| Machine and imports | skipped | — |" in md


def test_every_config_the_check_trains_at_its_gpu_sizes_resolves(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks" / "perf"))
    import gpu_sections

    import mmfl

    ctx = {"device": "cuda", "smoke": True, "work": str(tmp_path), "fashion": str(tmp_path)}
    cfgs = gpu_sections.full_configs(ctx)
    assert len(cfgs) == 2 + 16 + 1 + 5, sorted(cfgs)  # precision, accelerator cells, flower, moon slice
    for name, raw in cfgs.items():
        conf = mmfl.configure(raw)  # resolves every setting (the data is not loaded)
        assert conf.run.device == "cuda", name
    slice_ = mmfl.configure(cfgs["moon-slice-moon"])
    assert slice_.train.local_epochs == 10 and slice_.run.rounds == 2 and slice_.data.params.train_limit == 0
    assert slice_.algorithm.name == "moon" and slice_.run.batch_clients
    assert mmfl.configure(cfgs["cnn-fedavg-100-stacked"]).run.clients_per_round == 100
    assert mmfl.configure(cfgs["precision-bf16"]).run.precision == "bf16"


def test_the_report_spec_renders_a_gpu_record_with_gpu_figures_notes_and_a_stopped_section():
    """The CUDA-only branches of tables-gpu.toml (a GPU, GPU times, a stopped section's partial
    figures, failed tests), which the CPU smoke mode does not reach."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "perf"))
    import gpu_check

    meta = {"command": "bash scripts/gpu_check.sh", "smoke": False, "device": "cuda", "budget": 450.0, "date": "d",
            "fashion": ".gpu_carry/fashion-mnist", "fixture": False, "titles": gpu_check.TITLES,
            "sizes": gpu_check.G["full"]}
    env = {"host": "h", "cpus": 16, "platform": "p", "python": "3.12", "torch": "2.11.0+cu130", "cuda": "13.0",
           "gpu": "NVIDIA H100 80GB HBM3", "gpu_memory_gib": 79.2, "capability": "9.0", "sms": 132, "cudnn": 91900,
           "driver": "580.1", "modules": 191, "imported": 190, "import_failures": ["mmfl.x: ImportError: y"],
           "packages": {"flwr": "1.42.0"}}
    res = {"env": {"status": "ok", "seconds": 9.0, "figures": env},
           "tests": {"status": "failed", "seconds": 80.0, "figures": {"command": "python -m pytest", "result": "1 failed",
                                                                      "failed": ["FAILED tests/test_device.py::t"]}},
           "precision": {"status": "ok", "seconds": 30.0, "figures": {
               p: {"train_loss": 0.5, "accuracy": 0.8, "round_wall_s": 0.2, "round_gpu_s": 0.15, "fallback": None}
               for p in ("fp32", "bf16")}},
           "public": {"status": "ok", "seconds": 20.0, "figures": {
               "clients": 10, "public": 50000, "dim": 512, "wall_s": 2.0, "gpu_s": 1.9, "tflop_per_s": 134.7,
               "peak_extra_gib": 0.4, "inputs_gib": 1.0, "full_matrix_gib_per_client": 9.3, "matmul_precision": "highest"}},
           "moon": {"status": "timeout", "seconds": 150.0, "lines": ["**Stopped at the time limit (150 s)**; the figures "
                                                                    "below are those measured before it."],
                    "figures": {"methods": {"fedavg": {"round_wall_s": 3.0, "round_gpu_s": 2.9, "eval_s": 0.5,
                                                       "accuracy": 0.7}},
                                "projected_s": 7200.0, "projected_h": 2.0, "runs": 45, "workers": 1, "seed": 0,
                                "rounds": 4500, "local_epochs": 10, "projected_from": {"moon": "fedavg"}}}}
    md = gpu_check.report(res, meta)
    for line in ("# GPU check: NVIDIA H100 80GB HBM3",
                 "GPU: **NVIDIA H100 80GB HBM3**, 79.2 GiB, compute capability 9.0, 132 SMs, driver 580.1.",
                 "mmfl modules: 190 of 191 import; these do not:\n- mmfl.x: ImportError: y",
                 "Result: 1 failed\n\n- FAILED tests/test_device.py::t", "| bf16 | 0.5000 | 0.8000 | 0.200 | 0.150 |",
                 "Time: **1.900 s GPU** / 2.000 s wall; 134.7 TFLOP/s", "peak extra device memory 0.40 GiB",
                 "**Stopped at the time limit (150 s)**; the figures below are those measured before it.\n\n"
                 "benchmarks/moon/grid-paper.toml (45 runs", "10 local epochs, batch 64, stacked",
                 "| fedavg | 3.00 | 2.90 | 0.50 | 0.7000 |", "**2.00 h**", "(the section ran out of time)",
                 "moon ← fedavg", "| Stacked cohorts vs one-by-one | not run | — |"):
        assert line in md, line
