"""Seconds spent in PrivacyChecker.violation (every checked reply) during a 2-round PartialFL digits run (docs/architecture.md "Privacy rules", Cost), in CPU time (holds on a shared machine; wall time beside it, with the load average; benchmarks/perf/timing.py). Run: .venv/bin/python benchmarks/privacy_check_cost.py"""
import os, sys, time, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's mmfl, not the installed one
sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from timing import cpu_clock
torch.set_num_threads(1)
from mmfl.config import load_config
from mmfl.engine.runner import Experiment
from mmfl.engine import privacy
spent, wall, calls = [0.0], [0.0], [0]
orig = privacy.PrivacyChecker.violation
def timed(self, *a, **k):
    t, w = cpu_clock(), time.perf_counter()
    try:
        return orig(self, *a, **k)
    finally:
        spent[0] += cpu_clock() - t; wall[0] += time.perf_counter() - w; calls[0] += 1
privacy.PrivacyChecker.violation = timed
cfg = load_config("mmfl/configs/partialfl_digits.toml", ["rounds=2", "threads=1", 'output_dir="/tmp/privchk/runs-{time.time_ns()}"', f"name=privacy-cost-{time.time_ns()}"])
load0, c0, t0 = os.getloadavg()[0], cpu_clock(), time.perf_counter()
Experiment(cfg, progress=False).run()
print(f"CPU time: run {cpu_clock() - c0:.2f} s, check {spent[0]:.2f} s over {calls[0]} replies "
      f"(wall: run {time.perf_counter() - t0:.2f} s, check {wall[0]:.2f} s; load average {load0:.1f} -> {os.getloadavg()[0]:.1f})")
