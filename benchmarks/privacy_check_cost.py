"""Seconds spent in PrivacyChecker.violation (every checked reply) during a 2-round PartialFL digits run (docs/architecture.md "Privacy rules", Cost). Run: .venv/bin/python benchmarks/privacy_check_cost.py"""
import sys, time, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mmfl, not the installed one
torch.set_num_threads(1)
from mmfl.config import load_config
from mmfl.engine.runner import Experiment
from mmfl.engine import privacy
spent, calls = [0.0], [0]
orig = privacy.PrivacyChecker.violation
def timed(self, *a, **k):
    t = time.perf_counter()
    try:
        return orig(self, *a, **k)
    finally:
        spent[0] += time.perf_counter() - t; calls[0] += 1
privacy.PrivacyChecker.violation = timed
cfg = load_config("mmfl/configs/partialfl_digits.toml", ["rounds=2", "threads=1", 'output_dir="/tmp/privchk/runs-{time.time_ns()}"', f"name=privacy-cost-{time.time_ns()}"])
t0 = time.perf_counter()
Experiment(cfg, progress=False).run()
print(f"run {time.perf_counter() - t0:.2f} s, check {spent[0]:.2f} s over {calls[0]} replies")
