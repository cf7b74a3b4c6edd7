"""mmfl/bench/timing.py (benchmarks/perf/timing.py re-exports it): interleaved repeats, median and
spread, CPU time of children, user / system time and minor page faults."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "perf" / "timing.py"


def _timing():
    import mmfl.bench.timing as mod

    return mod


def test_the_benchmarks_old_module_name_still_works():
    spec = importlib.util.spec_from_file_location("bench_timing", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.interleave is _timing().interleave and mod.fmt_spread(mod.spread([1.0, 2.0, 3.0])) == "2.00 (1.50–2.50)"


class FakeClock:
    """CPU and wall clocks that only move when a cell says so."""

    def __init__(self):
        self.t_cpu = self.t_wall = 0.0
        self.loads = iter([3.0, 7.0])
        self.cpu = lambda: self.t_cpu
        self.wall = lambda: self.t_wall
        self.load = lambda: next(self.loads)

    def spend(self, cpu, wall):
        self.t_cpu += cpu
        self.t_wall += wall


def test_cells_run_interleaved_after_warmup_and_report_median_spread_and_load():
    t = _timing()
    clock, calls = FakeClock(), []
    cpu_a, cpu_b = iter([99, 1, 2, 3, 4, 5]), iter([99, 2, 4, 6, 8, 100])  # first value: the warm-up

    def cell(name, it):
        def run():
            calls.append(name)
            clock.spend(next(it), 50.0)  # wall: what the load did, not the code
        return run

    res = t.interleave({"A": cell("A", cpu_a), "B": cell("B", cpu_b)}, repeats=5, warmup=1, clock=clock, log=None)
    assert calls == ["A", "B", "A", "B", "B", "A", "A", "B", "B", "A", "A", "B"]  # warm-up, then A B, B A, ...
    assert res.order == calls[2:]
    assert [s.cpu for s in res.samples["A"]] == [1, 2, 3, 4, 5]  # warm-up not timed
    a, b = res.cpu("A"), res.cpu("B")
    assert (a["median"], a["q1"], a["q3"], a["min"], a["max"]) == (3, 2, 4, 1, 5)
    assert (b["median"], b["min"], b["max"]) == (6, 2, 100)  # one outlier does not move the median
    assert res.ratio("B", "A") == 2.0
    assert res.wall("A")["median"] == 50.0
    assert (res.load_start, res.load_end) == (3.0, 7.0)
    assert t.fmt_spread(a, 1) == "3.0 (2.0–4.0)"


def test_a_cell_may_report_its_own_samples():
    t = _timing()
    res = t.interleave({"x": lambda: [t.Sample(1.0, 2.0), t.Sample(3.0, 4.0)]}, repeats=2, warmup=0, log=None)
    assert [s.cpu for s in res.samples["x"]] == [1.0, 3.0, 1.0, 3.0]
    assert res.cpu("x")["median"] == 2.0
    with pytest.raises(ValueError):
        t.interleave({"x": lambda: None}, repeats=0)


def test_cpu_time_of_child_processes_counts():
    t = _timing()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    s, _ = t.measure(lambda: subprocess.run([sys.executable, "-c", burn], check=True))
    assert s.cpu >= 0.25  # the child's CPU seconds, not only this process's (which mostly waits)


def test_cpu_time_ignores_waiting():
    import time

    t = _timing()
    s, _ = t.measure(lambda: time.sleep(0.2))
    assert s.wall >= 0.19 and s.cpu < 0.1  # sleeping (or waiting for a loaded machine) is not CPU time


def test_user_system_time_and_page_faults_of_a_call():
    import torch

    t = _timing()
    fresh = lambda: [torch.ones(4_000_000) for _ in range(5)]  # 16 MB each: fresh mappings the kernel faults in
    res = t.interleave({"fresh": fresh, "idle": lambda: None}, repeats=3, warmup=0, log=None)
    f, i = res.of("fresh", "minflt"), res.of("idle", "minflt")
    assert f["median"] > 1000 and i["median"] < 100
    assert res.of("fresh", "user")["n"] == 3 and res.of("fresh", "sys_share")["median"] is not None
    d = res.to_dict()["cells"]["fresh"]
    assert len(d["usage"]) == 3 and {"cpu", "wall", "user", "sys", "minflt", "sys_share"} <= set(d)
