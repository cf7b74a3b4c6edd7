"""benchmarks/perf/run.py: the perf cells as one grid (cells.toml) and perf.md rendered from perf.json."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PERF = ROOT / "benchmarks" / "perf"


def test_every_profile_names_existing_scripts_and_the_same_cells():
    grid = tomllib.loads((PERF / "cells.toml").read_text())
    names = {p: set(cells) for p, cells in grid["profiles"].items()}
    assert names["small"] == names["full"]
    for cells in grid["profiles"].values():
        for script, args in cells.values():
            assert (PERF / script).is_file(), script
            assert "--repeats" in args, f"{script}: every cell repeats (median and spread)"


def test_render_only_writes_every_section_with_cpu_time_and_load(tmp_path):
    shutil.copy(ROOT / "tests" / "fixtures" / "perf.json", tmp_path / "perf.json")  # a small run's figures
    out = subprocess.run([sys.executable, str(PERF / "run.py"), "--render-only", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "perf.md").read_text()
    data = json.loads((tmp_path / "perf.json").read_text())
    for sec in data.get("details", {}):
        assert f"### {sec}" in md
    assert "CPU s" in md and "load" in md and "<!-- analysis -->" in md


def test_an_unknown_profile_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(PERF / "run.py"), "--profile", "huge", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and out.stderr.strip().splitlines() == [
        "mmfl: error: no profile 'huge' in cells.toml (have: small, full)"]


# ----------------------------------------------------------------------------- the table specs (golden reports)

GOLDEN = ROOT / "tests" / "fixtures" / "perf_render"  # rendered by the hand-written Python before it was deleted


def test_the_perf_spec_renders_the_golden_report_and_the_committed_one():
    from mmfl.bench.spec_data import render_doc

    assert "\n".join(render_doc(PERF / "tables.toml", ROOT / "tests" / "fixtures" / "perf.json")) == (
        GOLDEN / "perf.md").read_text()
    committed = (ROOT / "benchmarks" / "results" / "perf.md").read_text()
    new = "\n".join(render_doc(PERF / "tables.toml", ROOT / "benchmarks" / "results" / "perf.json"))
    assert new.split("<!-- analysis -->")[0] == committed.split("<!-- analysis -->")[0]


def test_the_accelerator_spec_renders_the_golden_reports(tmp_path):
    from mmfl.bench.spec_data import render_doc

    spec = PERF / "tables-accelerator.toml"
    for name in ("accelerator-cpu", "accelerator-gpu"):  # the committed CPU run; a GPU record with Flower and a fallback
        assert "\n".join(render_doc(spec, GOLDEN / f"{name}.json")) == (GOLDEN / f"{name}.md").read_text(), name
    res = ROOT / "benchmarks" / "results" / "accelerator-cpu.json"
    assert "\n".join(render_doc(spec, res)) == res.with_suffix(".md").read_text()
    # a record with GPU time (CUDA events) gets the GPU table; the render-only mode writes the .md beside the JSON
    data = json.loads((GOLDEN / "accelerator-gpu.json").read_text())
    data["cells"]["cnn|fedavg|10|stacked"] |= {"gpu": {"median": 0.01, "q1": 0.009, "q3": 0.011}, "gpu_clients_per_s": 1000.0}
    (tmp_path / "acc.json").write_text(json.dumps(data))
    out = subprocess.run([sys.executable, str(PERF / "accelerator.py"), "--render-only", str(tmp_path / "acc.json")],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "acc.md").read_text()
    assert "| cnn | fedavg | 10 | — | 1000.0 (0.0100 (0.0090–0.0110)) | — |" in md


def test_data_kinds_fields_filters_missing_values_and_fallbacks(tmp_path):
    from mmfl.bench.spec_data import render_doc

    spec = tmp_path / "t.toml"
    spec.write_text('''
[[blocks]]
text = "n {data.n:,}; loads {data.loads:join/, /.1f}; none {data.absent:dash/.2f}; {data.rec:load}; {data.s:spread/1}"
[[blocks]]
when = "not data.absent"
kind = "records"
source = "data.cells"
split = "|"
pivot = 1
sort = "natural"
header = ["w", "a", "b", "a / b"]
cells = ["{k.0}", "{col.a.x:.1f}", "{col.b.x:.1f}", "{calc.r:.2f}"]
calc = { r = "{col.a.x} / {col.b.x}" }
[[blocks]]
kind = "each"
source = "data.details"
need = "cmd"
fallback = "old {name}: no {error}"
[[blocks.templates.sec]]
text = "{name}: {r.cmd} {r.v:.2f}"
''')
    doc = {"n": 12345, "loads": [1.25, 2.0], "rec": {"load_start": 3.0, "load_end": 4.0},
           "s": {"median": 1.0, "q1": 0.5, "q3": 1.5}, "cells": {"w10|a": {"x": 3.0}, "w10|b": {"x": 2.0},
                                                                  "w2|a": {"x": 1.0}},
           "details": {"sec1": {"cmd": "c", "v": 1.0}, "sec2": {"cmd": "d"}, "other": {"cmd": "e"}, "sec3": {}}}
    assert render_doc(spec, doc) == [
        "n 12,345; loads 1.2, 2.0; none —; 3.0 → 4.0; 1.0 (0.5–1.5)", "",
        "| w | a | b | a / b |", "|---|---|---|---|", "| w2 | 1.0 | — | — |", "| w10 | 3.0 | 2.0 | 1.50 |", "",
        "sec1: c 1.00", "", "old sec2: no 'r.v'", ""]
