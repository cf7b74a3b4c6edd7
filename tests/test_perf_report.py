"""benchmarks/results/perf.md as [reports.perf] of the perf grid (benchmarks/perf/measures.toml), and the
table specs over a JSON document (mmfl/bench/spec_data.py; the accelerator report)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PERF = ROOT / "benchmarks" / "perf"
GOLDEN = ROOT / "tests" / "fixtures" / "perf_render"  # rendered by the hand-written Python before it was deleted


def _perf_report():
    from mmfl.bench.perf import load_perf

    return load_perf(PERF / "measures.toml")["reports"]["perf"]


def test_perf_md_renders_from_the_perf_grid_data_as_the_deleted_scripts_rendered_it():
    """tests/fixtures/perf.json (what the deleted run.py scripts wrote), converted by the committed
    converter, renders through [reports.perf] byte for byte as the old spec did (GOLDEN/perf.md),
    but for the one line that names the command (now `mmfl bench`); the committed perf.md too."""
    sys.path.insert(0, str(GOLDEN))
    from convert_perf_json import convert

    from mmfl.bench.perf_render import render_blocks

    rep = _perf_report()
    new = "\n".join(render_blocks(rep["blocks"], convert(json.loads((ROOT / "tests" / "fixtures" / "perf.json").read_text()))))
    old = (GOLDEN / "perf.md").read_text()
    changed = [(a, b) for a, b in zip(new.split("\n"), old.split("\n")) if a != b]
    assert len(new.split("\n")) == len(old.split("\n")) and len(changed) == 1
    assert changed[0][0].startswith("Regenerate: `nice -n 10 .venv/bin/mmfl bench benchmarks/perf/measures.toml --group perf`")
    committed = (ROOT / rep["file"]).read_text()
    data = json.loads((ROOT / rep["file"]).with_suffix(".json").read_text())
    assert "\n".join(render_blocks(rep["blocks"], data)).split(rep["keep_below"])[0] == committed.split(rep["keep_below"])[0]


def test_perf_cells_measure_cpu_time_with_interleaved_repeats():
    from mmfl.bench.perf import load_perf

    grid = load_perf(PERF / "measures.toml")
    for name in _perf_report()["cells"]:
        cell = grid["cells"][name]
        if cell["measure"] != "value":
            assert cell.get("repeats", 1) >= 3, f"{name}: median and spread need repeats"


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
