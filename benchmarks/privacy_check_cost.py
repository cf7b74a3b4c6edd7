"""Seconds spent in PrivacyChecker.check during a 2-round PartialFL digits run (docs/architecture.md "Privacy rules", Cost). Run from the repo root: .venv/bin/python benchmarks/privacy_check_cost.py new"""
import sys, time, torch
torch.set_num_threads(1)
from mmfl.config import load_config
from mmfl.engine.runner import Experiment
from mmfl.engine import privacy
spent, calls = [0.0], [0]
orig = privacy.PrivacyChecker.check
def timed(self, *a, **k):
    t = time.perf_counter()
    try:
        return orig(self, *a, **k)
    finally:
        spent[0] += time.perf_counter() - t; calls[0] += 1
privacy.PrivacyChecker.check = timed
cfg = load_config("mmfl/configs/partialfl_digits.toml", ["rounds=2", "threads=1", 'output_dir="/tmp/privchk/runs"', f"name=timed-{(sys.argv[1:] or ['run'])[0]}"])
t0 = time.perf_counter()
Experiment(cfg, progress=False).run()
print(f"run {time.perf_counter() - t0:.2f} s, check {spent[0]:.2f} s over {calls[0]} replies")
