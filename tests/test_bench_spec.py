"""The one table renderer (mmfl/bench/spec.py): each converted benchmark's TOML table spec,
rendered over tiny fixture run folders, equals what its hand-written tables script rendered over
the same folders (the golden files in tests/fixtures/bench_specs/ were written by those scripts
before they were deleted; tests/bench_spec_fixtures.py makes the folders)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bench_spec_fixtures import fixture_grid, render_lines

from mmfl.bench.spec import TableSpec
from mmfl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "bench_specs"
MOON_KEYS = ["moon/ce", "moon/con", "moon/cos_glob", "moon/cos_prev", "moon/cos_glob_prev"]
CASES = [  # (grid, golden report, metric keys the fixture rows carry)
    ("benchmarks/moon/grid.toml", "moon.md", MOON_KEYS),
    ("benchmarks/moon/grid-quick.toml", "moon-quick.md", MOON_KEYS),
]


@pytest.mark.parametrize("grid,golden,keys", CASES, ids=[c[1] for c in CASES])
def test_spec_renders_what_the_hand_written_script_rendered(grid, golden, keys, tmp_path, monkeypatch):
    g = fixture_grid(ROOT / grid, tmp_path, keys=keys)
    assert g.tables.suffix == ".toml"
    assert render_lines(g, monkeypatch) == (GOLDEN / golden).read_text()


def test_a_bad_spec_is_one_config_error(tmp_path):
    p = tmp_path / "tables.toml"
    p.write_text('[[blocks]]\nkind = "pie"\n')
    with pytest.raises(ConfigError, match="kind: one of"):
        TableSpec(p)
    p.write_text('[[blocks]]\ntext = "x"\ncolour = 1\n')
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        TableSpec(p)


def test_fedmsplit_spec_renders_what_its_tables_py_wrote(tmp_path, monkeypatch):
    """benchmarks/fedmsplit/tables.toml (pairs with per-side keys, one shared bootstrap generator)
    over fixture runs equals the report of the tables.py it replaced."""
    g = fixture_grid(ROOT / "benchmarks/fedmsplit/grid.toml", tmp_path / "fedmsplit",
                     keys=["global/personal_accuracy", "global/accuracy", "msplit_self_weight"])
    assert len(g.runs()) == 140
    assert render_lines(g, monkeypatch) == (GOLDEN / "fedmsplit.md").read_text()


def test_robust_clean_cost_spec_renders_what_clean_cost_py_wrote(tmp_path, monkeypatch):
    """benchmarks/robust/grid-clean.toml + tables-clean.toml replace clean_cost.py: over fixture runs
    (all 40 finished: the old script ran the missing ones itself) every table line is the old
    script's. Two lines differ by design: the command (now ``mmfl bench``) and the cost line (the
    old one timed its own invocation, which no rebuild of the tables can reproduce)."""
    g = fixture_grid(ROOT / "benchmarks/robust/grid-clean.toml", tmp_path, skip_every=10**9, fail=0)
    new = render_lines(g, monkeypatch).splitlines()
    old = (GOLDEN / "robust_clean_cost.md").read_text().splitlines()
    assert len(new) == len(old)
    differ = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
    assert [old[i].split(" ")[0] for i in differ] == ["Regenerate:", "(40"]
    assert new[differ[-1]].startswith("(40 runs; their round wall times add up to")


def test_moon_ladder_spec_renders_and_writes_the_section_the_script_did(tmp_path, monkeypatch):
    """grid-ladder.toml's spec (a section of another file, between markers) over fixture runs equals
    tables_ladder.py's output, except the line naming the spec file."""
    import dataclasses

    from mmfl.bench.runner import Bench, load_spec

    raw = tmp_path / "raw"
    g = fixture_grid(ROOT / "benchmarks/moon/grid-ladder.toml", raw, keys=MOON_KEYS)
    target = tmp_path / "moon.md"
    target.write_text("before\n<!-- ladder -->\nold\n<!-- /ladder -->\nafter\n")
    g = dataclasses.replace(g, params={**g.params, "section": str(target)})
    lines = load_spec(g.tables).report(Bench(g))
    text = "\n".join(lines)
    golden = (GOLDEN / "moon-ladder.md").read_text().replace("tables_ladder.py", "tables-ladder.toml")
    assert text.replace(str(raw.resolve()), "RAW") == golden
    assert target.read_text() == "before\n" + text + "\nafter\n"


def test_fedcmi_rung_grid_plans_table_1s_configs_with_more_rounds():
    from mmfl.bench import load_grid

    rung, t1 = (load_grid(ROOT / "benchmarks/fedcmi" / f) for f in ("grid-rung.toml", "grid.toml"))
    base = {r.name: r.raw for r in t1.runs(["t1"])}
    for r in rung.runs():
        rounds = int(r.setting)
        assert r.raw == dict(base[f"t1-mf-A-{r.method}-s{r.seed}"], rounds=rounds, eval_every=rounds)


@pytest.mark.parametrize("golden,skip", [("fedcmi_rung.md", 10**9), ("fedcmi_rung-missing.md", 4)])
def test_fedcmi_rung_spec_renders_what_rung_py_wrote(golden, skip, tmp_path, monkeypatch):
    """tables-rung.toml over fixture runs (all finished; two missing) equals rung.py's report but
    for the command line (now ``mmfl bench``)."""
    g = fixture_grid(ROOT / "benchmarks/fedcmi/grid-rung.toml", tmp_path, keys=["accuracy/features"],
                     skip_every=skip, fail=0)
    old = (GOLDEN / golden).read_text().replace(
        "nice -n 19 .venv/bin/python benchmarks/fedcmi/rung.py --rounds 20",
        "nice -n 19 .venv/bin/mmfl bench benchmarks/fedcmi/grid-rung.toml")
    assert render_lines(g, monkeypatch) == old


def test_a_bad_spec_through_mmfl_bench_is_one_line(tmp_path):
    import subprocess
    import sys

    (tmp_path / "tables.toml").write_text('[[blocks]]\nkind = "cells"\ngroup = "g"\nheader = ["m"]\ncells = ["{nope}"]\n')
    (tmp_path / "grid.toml").write_text(
        'name = "x"\nraw_dir = "raw"\nreport = "out.md"\ntables = "tables.toml"\nseeds = [0]\n'
        '[groups.g]\n[groups.g.methods]\na = { set = { rounds = 1 } }\n')
    out = subprocess.run([sys.executable, "-m", "mmfl.cli", "bench", str(tmp_path / "grid.toml"), "--tables-only"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["mmfl: error: table spec: unknown field {nope}"]


def test_pairs_line_mode_reports_paired_verdict_and_shared_bootstrap_differs(tmp_path, monkeypatch):
    """``line`` rows carry :func:`mmfl.sweep.paired_verdict`'s numbers; ``bootstrap = "shared"`` draws
    the second row's resamples after the first's (so its interval moves, its mean and p do not)."""
    from mmfl.bench.runner import Bench
    from mmfl.sweep import paired_verdict

    (tmp_path / "grid.toml").write_text(
        'name = "x"\nraw_dir = "raw"\nreport = "out.md"\nseeds = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n'
        '[groups.g]\n[groups.g.methods]\na = { set = { rounds = 3 } }\nb = { set = { rounds = 4 } }\n')
    g = fixture_grid(tmp_path / "grid.toml", tmp_path / "raw", skip_every=10**9, fail=0)
    b = Bench(g)
    spec = tmp_path / "t.toml"
    line = "{mean:.6f} {lo:.6f} {hi:.6f} {p:.6f} {n}{seeds_note}"
    block = f'[[blocks]]\nkind = "pairs"\ngroup = "g"\nheader = ["x"]\nline = "{line}"\npairs = [["a", "b"], ["b", "a"]]\n'
    spec.write_text(block)
    rows = TableSpec(spec).report(b)[2:4]
    va, vb = (b.vals("g", m) for m in ("a", "b"))
    v = paired_verdict(va, vb, 100.0)
    assert rows[0] == f"{v['delta']:.6f} {v['lo']:.6f} {v['hi']:.6f} {v['p']:.6f} 10"
    spec.write_text(block + 'bootstrap = "shared"\n')
    shared = TableSpec(spec).report(b)[2:4]
    assert shared[0] == rows[0]  # the first draw of a fresh generator seeded 0 is paired_verdict's
    rng = np.random.default_rng(0)
    for d in (100 * (np.array(va) - vb), 100 * (np.array(vb) - va)):
        lo, hi = np.quantile(d[rng.integers(0, len(d), (10000, len(d)))].mean(1), [0.025, 0.975])
    assert shared[1].split()[1:3] == [f"{lo:.6f}", f"{hi:.6f}"]
    assert shared[1].split()[::3] == rows[1].split()[::3]
