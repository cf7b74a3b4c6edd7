"""Performance grids (mmfl/bench/perf*.py, benchmarks/perf/measures.toml): every committed
perf report renders from its measurement data exactly as the old script rendered it, the
measurement kinds measure what they say inside real training, and bad grids are one line.

The golden markdown in tests/fixtures/perf_reports was written by the old scripts
(benchmarks/perf/{checkpoint_growth,public_terms_cpu,personal_eval_memory,fixed_costs}.py at commit
c46e2d7) from the fixture data beside it, their measuring functions replaced by ones returning that
data and their command line by the new one."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmfl.bench.perf import load_perf, run
from mmfl.bench.perf_render import evaluate, render_blocks
from mmfl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "benchmarks" / "perf" / "measures.toml"
FIX = ROOT / "tests" / "fixtures" / "perf_reports"


@pytest.mark.parametrize("report", ["checkpoint_growth", "public_terms_cpu", "personal_eval_memory", "fixed_costs"])
def test_each_report_renders_from_its_data_as_the_old_script_did(report):
    blocks = load_perf(GRID)["reports"][report]["blocks"]
    data = json.loads((FIX / f"{report}.json").read_text())
    assert "\n".join(render_blocks(blocks, data)) == (FIX / f"{report}.md").read_text()


def test_committed_reports_regenerate_from_their_committed_data(tmp_path):
    grid = load_perf(GRID)
    for name, rep in grid["reports"].items():
        md, js = ROOT / rep["file"], (ROOT / rep["file"]).with_suffix(".json")
        if js.is_file():
            new, mark = "\n".join(render_blocks(rep["blocks"], json.loads(js.read_text()))), rep.get("keep_below")
            assert (new.split(mark)[0] if mark else new) == (md.read_text().split(mark)[0] if mark else md.read_text()), name


@pytest.mark.slow
def test_checkpoint_bytes_per_round_stay_flat_and_the_whole_store_rewrite_grows(tmp_path):
    """per_call on checkpoint.save inside real runs (MOON, digits): the incremental store writes the
    same bytes every round; with ``ClientStateStore.incremental = False`` they grow with clients seen."""
    g = load_perf(GRID, ["cells.growth.params.clients=40", "cells.growth.params.per_round=8",
                         "cells.growth.params.rounds=3", "cells.growth.params.train_limit=400"])
    g["cells"]["growth"]["set"] = [s.replace("fashion_mnist", "digits").replace("simple_cnn", "mlp")
                                   for s in g["cells"]["growth"]["set"] if "out_dim" not in s and "_limit" not in s]
    g["out"] = tmp_path
    [md] = run(g, ["checkpoint_growth"])
    d = json.loads((tmp_path / "checkpoint_growth.json").read_text())["growth"]["cells"]
    before, after = d["before"]["calls"], d["after"]["calls"]
    assert [r["round"] for r in after] == [1, 2, 3] and after[-1]["clients_seen"] > after[0]["clients_seen"]
    assert before[-1]["written"] > 1.5 * before[0]["written"]
    assert max(r["written"] for r in after) < 1.1 * after[0]["written"]
    assert "| 3 |" in md.read_text()


def test_a_tiny_grid_through_the_cli_measures_cpu_interleaved_with_usage(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('''kind = "perf"
[cells.burn]
measure = "cpu"
repeats = 3
warmup = 0
python = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < $s: pass"
variants = { short = { params = { s = 0.05 } }, long = { params = { s = 0.2 } } }
[reports.r]
file = "r.md"
cells = ["burn"]
[[reports.r.blocks]]
text = "long / short: {burn.cells.long.cpu.median / burn.cells.short.cpu.median:.0f}x; {burn.cells.long.cpu.n} samples"
''')
    out = subprocess.run([sys.executable, "-m", "mmfl.cli", "bench", str(grid)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "r.json").read_text())["burn"]
    assert data["order"] == ["short", "long", "long", "short", "short", "long"]  # interleaved
    long = data["cells"]["long"]
    assert data["load_start"] is not None and long["cpu"]["median"] >= 0.2  # the child's CPU time, not this process's
    for (cpu, _), (user, sys_, _) in zip(long["samples"], long["usage"]):  # split into user and system time
        assert abs(user + sys_ - cpu) < 0.05
    text = (tmp_path / "r.md").read_text()
    assert text.startswith("long / short: ") and text.endswith("; 3 samples\n")
    again = subprocess.run([sys.executable, "-m", "mmfl.cli", "bench", str(grid), "--tables-only"], cwd=ROOT,
                           capture_output=True, text=True)
    assert again.returncode == 0 and (tmp_path / "r.md").read_text() == text


def test_bad_grids_and_expressions_are_one_line(tmp_path):
    bad = tmp_path / "b.toml"
    bad.write_text('kind = "perf"\n[cells.x]\nmeasure = "speed"\nvariants = { a = {} }\n')
    out = subprocess.run([sys.executable, "-m", "mmfl.cli", "bench", str(bad)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"mmfl: error: {bad}: cells.x.measure: one of cpu, peak_memory, per_call, value, got 'speed'"]
    with pytest.raises(ConfigError, match="no 'nope' in the measurement data"):
        evaluate("x.nope / 2", {"x": {"a": 1}})
    with pytest.raises(ConfigError, match="only names"):
        evaluate("__import__('os')", {})
    assert evaluate("max(rows.b) / rows[0].b", {"rows": [{"b": 2}, {"b": 6}]}) == 3


@pytest.mark.slow
def test_peak_memory_of_an_mmfl_run_in_fresh_processes_interleaved(tmp_path):
    grid = tmp_path / "m.toml"
    grid.write_text(f'''kind = "perf"
[cells.mem]
measure = "peak_memory"
repeats = 2
set = ["data.name=digits", "partition.num_clients=4", "model.name=mlp", "model.hidden=[16]", "rounds=1",
       "train.local_epochs=1", "threads=1", "algorithm.name=$algo", "output_dir={tmp_path}/runs", "name=$algo"]
variants = {{ fedavg = {{ params = {{ algo = "fedavg" }} }}, moon = {{ params = {{ algo = "moon" }} }} }}
[reports.m]
file = "m.md"
cells = ["mem"]
[[reports.m.blocks]]
rows = "[mem.cells.fedavg, mem.cells.moon]"
row = "{{len(repeats)}} runs, last: {{extra_kb / 1024:.1f}} MB above {{rss_kb / 1024:.0f}} MB"
''')
    out = subprocess.run([sys.executable, "-m", "mmfl.cli", "bench", str(grid)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    cells = json.loads((tmp_path / "m.json").read_text())["mem"]["cells"]
    for c in cells.values():
        assert len(c["repeats"]) == 2 and c["rss_kb"] > 50_000 and c["extra_kb"] > 0 and c["cpu"] > 0
    assert (tmp_path / "m.md").read_text().startswith("2 runs, last: ")


def test_one_renderer_expr_blocks_in_a_table_spec_and_spec_kinds_in_a_perf_report(tmp_path):
    """perf_render is a table-spec kind (``expr``): a tables.toml over a JSON document mixes it with
    ``records`` / ``{data.*}`` text, and a perf grid's report may use those kinds beside its default."""
    from mmfl.bench.spec_data import render_doc

    data = {"c": {"cells": {"a": {"cpu": {"median": 2.0, "q1": 1.5, "q3": 2.5}}, "b": {"cpu": {"median": 1.0}}}}}
    spec = tmp_path / "t.toml"
    spec.write_text('[[blocks]]\ntext = "load {data.c.cells.a.cpu:spread/1}"\n'
                    '[[blocks]]\nkind = "expr"\ntext = "ratio {c.cells.a.cpu.median / c.cells.b.cpu.median:.1f}x"\n'
                    '[[blocks]]\n[[blocks.parts]]\nkind = "expr"\nrows = "[1, 2]"\nrow = "- {r * 10}"\n'
                    '[[blocks.parts]]\nkind = "records"\nsource = "data.c.cells"\nline = "- {key}"\n')
    assert render_doc(spec, data) == ["load 2.0 (1.5–2.5)", "", "ratio 2.0x", "", "- 10", "- 20", "- a", "- b", ""]
    mixed = [{"text": "{len(c.cells)} cells"}, {"kind": "records", "source": "data.c.cells", "keys": ["a"],
                                                 "header": ["v", "cpu"], "cells": ["{key}", "{value.cpu:spread/2}"]}]
    assert render_blocks(mixed, data) == ["2 cells", "", "| v | cpu |", "|---|---|", "| a | 2.00 (1.50–2.50) |", ""]
    plot = [{"kind": "expr_plot", "figure": "f.png", "text": "![f](f.png)",
             "panels": [{"x": "items(c.cells).key", "y": "items(c.cells).value.cpu.median", "xlog": True}]}]
    assert render_blocks(plot, {"c": {"cells": {"10": {"cpu": {"median": 1.0}}, "100": {"cpu": {"median": 1.5}}}}},
                         tmp_path) == ["![f](f.png)", ""]
    assert (tmp_path / "f.png").stat().st_size > 1000
    with pytest.raises(ConfigError, match="sep. is gone"):
        render_blocks([{"text": "x", "sep": []}], data)
