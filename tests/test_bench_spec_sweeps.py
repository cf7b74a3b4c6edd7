"""The TOML table specs of benchmarks/robust, benchmarks/fedcmi and benchmarks/partialfl (kinds of
mmfl/bench/spec_sweeps.py and spec_figures.py), rendered over fixture run folders
(tests/bench_spec_fixtures.py: CASES_SWEEPS), equal what the hand-written table scripts they replaced
rendered over the same folders (goldens in tests/fixtures/bench_specs/sweeps-*; the scripts are in
commit 127b321: benchmarks/robust/tables.py, benchmarks/fedcmi/tables.py and diagnose_tables.py,
benchmarks/partialfl/tables.py with sections/readings/header.py), and their figures plot the same
data (the recorded plot / bar calls)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from bench_spec_fixtures import CASES_SWEEPS, CUSTOM, fixture_grid, render_lines

from mmfl.bench.spec import TableSpec
from mmfl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "bench_specs"
CONVERTED = {"robust", "diagnose", "diagnose-missing", "fedcmi", "fedcmi-quick", "partialfl", "partialfl-quick"}
# what differs by design: the commands of scripts that are gone, and one stray empty line the old
# PartialFL script left after Table 2's checks when no gap sentence could be made (fewer than two
# betas with both methods: the quick grid)
COMMANDS = {"diagnose": [(".venv/bin/python benchmarks/fedcmi/diagnose.py", ".venv/bin/mmfl bench benchmarks/fedcmi/diagnose.toml")],
            "partialfl-quick": [("\n\n\n## Table 3 analog", "\n\n## Table 3 analog")]}


def _record(monkeypatch) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.axes

    calls = []
    for kind in ("plot", "bar", "axhline"):
        orig = getattr(matplotlib.axes.Axes, kind)

        def f(self, *a, _kind=kind, _orig=orig, **k):
            calls.append([_kind, [x if isinstance(x, str) else np.asarray(x, dtype=float).round(6).tolist() for x in a],
                          str(k.get("label", ""))])
            return _orig(self, *a, **k)
        monkeypatch.setattr(matplotlib.axes.Axes, kind, f)
    return calls


SLOW = {"partialfl", "partialfl-quick"}  # they build both settings' federations and load their data sets
PARAMS = [pytest.param(*c, id=c[0], marks=[pytest.mark.slow] if c[0] in SLOW else []) for c in CASES_SWEEPS if c[0] in CONVERTED]


@pytest.mark.parametrize("name,grid,kw", PARAMS)
def test_spec_renders_what_the_hand_written_script_rendered(name, grid, kw, tmp_path, monkeypatch):
    g = fixture_grid(ROOT / grid, tmp_path / "raw", **kw)
    if name in CUSTOM:
        CUSTOM[name](g)
    assert g.tables.suffix == ".toml"
    calls = _record(monkeypatch)
    text = render_lines(g, monkeypatch).replace(os.path.relpath(g.raw_dir, g.root), "RAW").replace(str(g.raw_dir), "RAW")
    golden = (GOLDEN / f"sweeps-{name}.md").read_text()
    for old, new in COMMANDS.get(name, COMMANDS.get(name.split("-")[0], [])):
        golden = golden.replace(old, new)
    assert text == golden
    plots = GOLDEN / f"sweeps-{name}.plots.json"
    if plots.is_file():
        assert json.loads(json.dumps(calls)) == json.loads(plots.read_text())


def test_sweep_outcome_counts_failures_by_cause_and_a_bad_metric_key_is_one_error(tmp_path, monkeypatch):
    (tmp_path / "grid.toml").write_text(
        'name = "x"\nraw_dir = "raw"\nreport = "out.md"\ntables = "t.toml"\nseeds = [0, 1, 2]\n'
        '[settings]\nclean = { info = { kind = "none", f = 0.0 } }\n'
        'a1 = { label = "attack A, 10%", info = { kind = "A", f = 0.1 } }\n'
        'a2 = { label = "attack A, 20%", info = { kind = "A", f = 0.2 } }\n'
        '[groups.g]\n[groups.g.methods]\nm = { label = "M", set = { rounds = 2 } }\n')
    (tmp_path / "t.toml").write_text(
        '[[blocks]]\nkind = "sweep"\ngroup = "g"\nsplit = "kind"\nx = "f"\nbase = "none"\n'
        'title = "{split} ({stem})"\ncol_head = "{info.f:.0%}"\nmetric = { key = "final_accuracy", reader = "summary" }\n')
    g = fixture_grid(tmp_path / "grid.toml", tmp_path / "raw", skip_every=10**9, fail=0)
    for run, msg in (("g-a2-m-s0", "diverged: nan"), ("g-a2-m-s1", "round 2: too few updates")):
        (g.raw_dir / run / "summary.json").unlink()
        (g.raw_dir / run / "failed.txt").write_text(msg)
    text = render_lines(g, monkeypatch).splitlines()
    assert text[0] == "A (attack A)" and text[2] == "| method | 0% | 10% | 20% |"
    assert text[4].endswith("(1 of 3 diverged, 1 of 3 stopped) |")
    (tmp_path / "t.toml").write_text('[[blocks]]\nkind = "sweep"\ngroup = "g"\nmetric = { colour = 1 }\n')
    from mmfl.bench.runner import Bench

    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        TableSpec(tmp_path / "t.toml").report(Bench(g))


def test_a_specs_hooks_file_gives_the_post_run_step(tmp_path):
    """``hooks = "probe.py"``: mmfl bench finds ``done`` / ``post`` on the TOML spec (the probe runs
    after each diagnosis run; a run is done only once probe.json exists)."""
    from mmfl.bench.runner import _SPECS, load_spec

    _SPECS.clear()
    spec = load_spec(ROOT / "benchmarks/fedcmi/tables-diagnose.toml")
    assert callable(spec.post) and spec.FILES == ("probe.json",)
    (tmp_path / "summary.json").write_text("{}")
    assert not spec.done(tmp_path, {})
    (tmp_path / "probe.json").write_text("{}")
    assert spec.done(tmp_path, {})
    assert not hasattr(load_spec(ROOT / "benchmarks/robust/tables.toml"), "post")


def test_a_bad_part_or_run_field_is_one_config_error(tmp_path, monkeypatch):
    p = tmp_path / "t.toml"
    p.write_text('[[blocks]]\n[[blocks.parts]]\ntext = "x"\ncolour = 1\n')
    with pytest.raises(ConfigError, match=r"blocks\[0\].parts\[0\]: unknown key 'colour'"):
        TableSpec(p)
    (tmp_path / "grid.toml").write_text('name = "x"\nraw_dir = "raw"\nreport = "out.md"\ntables = "t.toml"\nseeds = [0]\n'
                                        '[groups.g]\n[groups.g.methods]\nm = { set = { rounds = 1 } }\n')
    p.write_text('[[blocks]]\ntext = "{clients.g}"\n')
    g = fixture_grid(tmp_path / "grid.toml", tmp_path / "raw", skip_every=10**9, fail=0)
    with pytest.raises(ConfigError, match="<group>@<setting>@<method>"):
        render_lines(g, monkeypatch)
