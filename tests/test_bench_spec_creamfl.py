"""benchmarks/creamfl/tables.toml (kinds of mmfl/bench/spec_by_setting.py and spec_errorbar.py) over
fixture runs of every group equals what the tables.py it replaced rendered over the same runs
(tests/fixtures/bench_specs/creamfl*.md, written by tables.py before it was deleted); and the
general kinds' pieces one by one."""

from __future__ import annotations

import dataclasses
import json
import re
import zlib
from pathlib import Path

import pytest
from bench_spec_fixtures import fixture_grid, render_lines

from mmfl.bench.spec import TableSpec
from mmfl.bench.spec_values import V, Stat
from mmfl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "bench_specs"
KEYS = ["fold_i2t_r1", "fold_t2i_r1", "i2t_r1", "t2i_r1", "rsum_authors", "r1_sum", "target_public_r1_sum",
        "server_public_r1_sum", "target_cos/0", "target_cos/1"]


def _grid(path: str, tmp: Path):
    g = fixture_grid(ROOT / path, tmp, keys=KEYS)
    for r in g.runs(["t2"]):  # what groups.t2's post step writes: the VQA accuracy
        d = g.raw_dir / r.name
        if (d / "summary.json").is_file():
            (d / "vqa.json").write_text(json.dumps({"accuracy": (zlib.crc32(r.name.encode()) % 1000) / 1000}))
    return dataclasses.replace(g, params={**g.params, "analysis": ""})


@pytest.mark.parametrize("grid,golden", [pytest.param("benchmarks/creamfl/grid.toml", "creamfl.md", marks=pytest.mark.slow),
                                         ("benchmarks/creamfl/grid-quick.toml", "creamfl-quick.md")])
def test_creamfl_spec_renders_what_tables_py_rendered(grid, golden, tmp_path, monkeypatch):
    g = _grid(grid, tmp_path)
    assert g.tables.name == "tables.toml"
    text = re.sub(r"finished runs in `[^`]*`", "finished runs in `RAW/`", render_lines(g, monkeypatch))
    assert text == (GOLDEN / golden).read_text()
    assert (tmp_path / g.params["fig4_png"]).stat().st_size > 10_000  # Figure 4 drawn (both settings' panels)


def test_values_in_templates_format_as_documented():
    assert format(V(None)) == "—" and format(V(132.88), ".2f") == "132.88" and format(V("127.65 (T3)"), ".2f") == "127.65 (T3)"
    assert format(V([1, 2.5]), "/.2f") == "1.00 / 2.50" and format(V([1.0, -2.0]), "+.1f") == "+1.0, -2.0"
    assert format(V(True), "?yes|no") == "yes" and format(V(None), "pre=, beta ") == "" and format(V(0.1), "pre=, b ") == ", b 0.1"
    assert format(V(["a", "b"]), "paren") == " (a, b)" and format(V([]), "paren") == ""
    assert format(V({"b": 2, "a": [1], "c": 3}), "kv=a,b") == "b=2, a=[1]"
    assert V({"x": [], "y": [3]})["x|y"].v == [3]
    s = Stat([1.0, 2.0, 3.0], expected=5)
    assert (format(s), format(s, "ms"), format(s, ".2f"), bool(Stat([]))) == ("2.0 ± 0.8", "2.0 ± 0.8 (3/5)", "2.00", False)


def test_a_bad_sub_block_or_post_step(tmp_path):
    p = tmp_path / "tables.toml"
    p.write_text('[[blocks]]\nkind = "each_setting"\n[[blocks.blocks]]\ntext = "x"\ncolour = 1\n')
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        TableSpec(p).report(type("B", (), {"grid": None})())
    p.write_text('[[blocks]]\ntext = "x"\n[post.mark]\nfunction = "os:mkdir"\n')
    spec = TableSpec(p)
    assert not hasattr(spec, "post") and not hasattr(spec, "done")
    spec.mark(None, None, tmp_path / "ran", None)  # a group's post = { call = "mark" } runs fn(run_dir, **args)
    assert (tmp_path / "ran").is_dir()
