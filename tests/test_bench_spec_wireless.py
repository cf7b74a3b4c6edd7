"""The block kinds of mmfl/bench/spec_paired.py and the wireless benchmark's paired report spec
(benchmarks/wireless/grid-paired.toml + tables-paired.toml, which replaced paired.py + splice.py):
over fixture runs its sections equal what the old scripts rendered over the same folders
(tests/fixtures/bench_specs/wireless-paired-rerun.md, written by them before they were deleted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_spec_fixtures import MACHINE, make_runs

from mmfl.bench import load_grid
from mmfl.bench.results import Results
from mmfl.bench.runner import _SPECS, redirect, render
from mmfl.bench.spec_paired import claims, count_sentence, setting_columns
from mmfl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "bench_specs" / "wireless-paired-rerun.md"
MARKED = "head\n<!-- rerun-summary -->\n<!-- /rerun-summary -->\nmid\n<!-- rerun-iv-v -->\n<!-- /rerun-iv-v -->\ntail\n"


def _between(text: str, mark: str) -> str:
    return text.split(f"<!-- {mark} -->\n")[1].split(f"<!-- /{mark} -->")[0].strip("\n")


def test_paired_spec_writes_the_sections_the_old_scripts_wrote(tmp_path, monkeypatch):
    import mmfl.sweep

    monkeypatch.setattr(mmfl.sweep, "machine", lambda: MACHINE)
    section = tmp_path / "wireless-paired.md"
    section.write_text(MARKED)
    grid = redirect(load_grid(ROOT / "benchmarks/wireless/grid-paired.toml", [f'params.section="{section}"']),
                    tmp_path / "raw")
    assert len(grid.runs()) == 130
    make_runs(grid, keys=["personal/accuracy", "sim_time_s"])
    _SPECS.clear()
    render(grid)
    out = section.read_text()
    assert out.startswith("head\n") and "\nmid\n" in out and out.endswith("\ntail\n")  # the rest stays
    body, summary = GOLDEN.read_text().split("\n=====\n")
    new = _between(out, "rerun-iv-v").split("\n")
    notes = [i for i, ln in enumerate(new) if ln.startswith("This session's runs alone")]
    assert len(notes) == 2
    # the old note named paired.py / splice.py, and counted 4 fewer runs: the Fig. 3 runs, finished
    # for the old spec only with its post-run xi_history.json (no post-run step under grid-paired)
    assert all(new[i].endswith("Runs: 111 of 130 planned finished; summed run time 62.1 min of single-thread "
                               "compute (the rounds' wall times).") for i in notes)
    assert "\n".join("NOTE" if i in notes else ln for i, ln in enumerate(new)) == body.strip("\n")
    assert _between(out, "rerun-summary") == summary.strip("\n")


class _Results:
    def __init__(self, vals):
        self.vals = vals

    def value(self, name, key, reader, eval_key=None):
        return self.vals.get(name, {}).get(key)

    def final(self, name, key="accuracy"):
        return self.vals.get(name)

    def rows(self, name):
        return [self.vals[name]] if name in self.vals else []

    def finished(self, name):
        return name in self.vals

    by_seed = Results.by_seed  # the real per-seed reader, over these values


class _Grid:
    eval_key = None

    def entry(self, g, m):
        return type("E", (), {"label": m.upper()})

    def settings(self, g):
        return {"s": type("S", (), {"label": "S"})}


class _B:
    """The part of mmfl.bench.Bench the kinds read: runs named "<method>-s<seed>"."""

    def __init__(self, vals, seeds):
        self.results, self.grid, self.seeds = _Results(vals), _Grid(), seeds

    def names(self, g, m, s=None):
        return {k: f"{m}-s{k}" for k in self.seeds[m]}

    def methods(self, g):
        return dict.fromkeys(self.seeds)


def _F():
    from mmfl.bench.spec import Fields

    return Fields(None, {"blocks": []})


def test_claims_pair_by_seed_and_claim_nothing_under_five_seeds():
    a = {f"a-s{k}": {"accuracy": v} for k, v in zip(range(5), [0.50, 0.61, 0.72, 0.83, 0.94])}
    b = {f"b-s{k}": {"accuracy": v} for k, v in zip(range(5), [0.48, 0.59, 0.70, 0.81, 0.92])}  # a − 0.02 per seed
    c = {f"c-s{k}": {"accuracy": 0.5} for k in range(3)}
    bench = _B({**a, **b, **c}, {"a": [4, 3, 2, 1, 0], "b": [0, 1, 2, 3, 4], "c": [0, 1, 2]})
    block = {"group": "g", "claims": [{"text": "a > b", "a": "a", "b": "b"}, {"text": "a > c", "a": "a", "b": "c"}]}
    lines = claims(bench, block, _F())
    assert lines[2] == "| a > b | +2.0 | [+2.0, +2.0] | 0.000 | 5 | holds |"
    assert lines[3].endswith("| 3 | not claimed (3 seeds) |")
    summary = claims(bench, {**block, "summary": "{count}", "what": "T"}, _F())
    assert summary == [count_sentence(["holds", "not claimed (3 seeds)"], "T")]
    assert "1 not claimed (fewer than 5 seeds)" in summary[0]
    with pytest.raises(ConfigError, match="no block with that id"):
        claims(bench, {"claims": "nope"}, _F())


def test_setting_columns_takes_the_first_key_a_run_has_and_sums_per_round_keys():
    vals = {"m-s0": {"personal/accuracy": 0.5, "accuracy": 0.1, "t": 2.0}, "m-s1": {"accuracy": 0.7, "t": 4.0}}
    bench = _B(vals, {"m": [0, 1]})
    block = {"group": "g", "header": ["method", "acc", "time"], "cells": [
        "{label}", {"per_setting": "{v.acc}"}, {"per_setting": "{v.t}"}],
        "values": {"acc": {"key": ["personal/accuracy", "accuracy"]}, "t": {"key": "t", "reader": "sum", "scale": 1}}}
    assert setting_columns(bench, block, _F())[-1] == "| M | 60.0 ± 10.0 | 3.0 ± 1.0 |"


WIRELESS_KEYS = ["personal/accuracy", "sim_time_s", "xi_self/shared", "xi_self/audio", "xi_self/image",
                 "fomo_positive", "amp_self_weight", "uploads", "uploads_forced"]


def _wireless(grid: str, tmp_path, monkeypatch, xi: bool = False):
    import mmfl.sweep
    from wireless_xi_fixture import write_xi_histories

    monkeypatch.setattr(mmfl.sweep, "machine", lambda: MACHINE)
    g = redirect(load_grid(ROOT / "benchmarks/wireless" / grid), tmp_path / "raw")
    make_runs(g, keys=WIRELESS_KEYS)
    if xi:
        assert write_xi_histories(g) == (4 if grid == "grid.toml" else 2)
    _SPECS.clear()
    return g


@pytest.mark.slow
@pytest.mark.parametrize("grid,golden", [("grid.toml", "wireless.md"), ("grid-quick.toml", "wireless-quick.md")])
def test_wireless_report_over_fixture_runs_is_the_golden(grid, golden, tmp_path, monkeypatch):
    """benchmarks/wireless/tables.toml (the full report; its committed wireless.md cannot be rebuilt: its
    runs are lost) over fixture runs renders what the Python it replaced (tables.py, sections.py,
    readings.py, header.py, fig3.py, claims.py; in git before this test's commit) wrote over them, the
    golden (~20 s: the report's scale lines build the federations)."""
    import os

    g = _wireless(grid, tmp_path, monkeypatch)
    assert g.tables.name == "tables.toml"
    out = Path(render(g)).read_text().replace(f"`{os.path.relpath(tmp_path / 'raw', ROOT)}/`", "`RAW/`")
    assert out == (ROOT / "tests" / "fixtures" / "bench_specs" / golden).read_text()


@pytest.mark.slow
@pytest.mark.parametrize("grid,golden", [("grid.toml", "wireless-fig3"), ("grid-quick.toml", "wireless-fig3-quick")])
def test_wireless_fig3_over_fixture_xi_histories_is_the_golden(grid, golden, tmp_path, monkeypatch):
    """With the Fig. 3 runs' xi_history.json (tests/wireless_xi_fixture.py): the Fig. 3 section, its
    lines of the ordering summary, the run count (a Fig. 3 run is finished with its history: the
    hooks' ``done``) and the plotted series (every ``plot`` call) equal the old fig3.py's."""
    from test_bench_spec_sweeps import _record

    g = _wireless(grid, tmp_path, monkeypatch, xi=True)
    calls = _record(monkeypatch)
    out = Path(render(g)).read_text().replace(str(tmp_path / "raw"), "RAW")
    sec = out.split("## Fig. 3: the aggregation coefficients of one device\n")[1].split("\n## ")[0]
    summ = [ln for ln in out.split("\n") if ln.startswith(("- **Fig. 3", "- Runs:"))]
    gold = ROOT / "tests" / "fixtures" / "bench_specs"
    assert sec.strip("\n") + "\n=====\n" + "\n".join(summ) + "\n" == (gold / f"{golden}.md").read_text()
    assert json.loads(json.dumps(calls)) == json.loads((gold / f"{golden}.plots.json").read_text())
    png = (tmp_path / "raw") / ("wireless-quick_fig3.png" if "quick" in grid else "wireless_fig3.png")
    assert png.is_file()


def test_wireless_spec_without_the_scale_lines_renders_the_quick_golden(tmp_path, monkeypatch):
    """The fast check of tables.toml (no federation built): every section of the quick report but the
    scale lines, over fixture runs, equals the golden the old Python wrote."""
    import os

    from mmfl.bench.runner import Bench
    from mmfl.bench.spec import TableSpec

    g = _wireless("grid-quick.toml", tmp_path, monkeypatch)
    spec = TableSpec(g.tables)
    for bl in (bl for bl in spec.spec["blocks"] if "parts" in bl):
        bl["parts"] = [p for p in bl["parts"] if "federation" not in str(p)]
    out = "\n".join(spec.report(Bench(g))).replace(f"`{os.path.relpath(tmp_path / 'raw', ROOT)}/`", "`RAW/`")
    gold = (ROOT / "tests" / "fixtures" / "bench_specs" / "wireless-quick.md").read_text()
    head, rest = gold.split("## Scale\n\n", 1)
    gold = head + "## Scale\n\n" + rest[rest.index("- Baselines"):]
    assert out.rstrip("\n") == gold.rstrip("\n")


def test_wireless_hooks_come_through_the_spec_and_a_bad_field_is_one_error(tmp_path):
    """grid.toml's post-run step is tables.toml's ``hooks`` (xi_history.py): a Fig. 3 run is finished
    only with its xi_history.json; ``{rel.x}`` names what it lacks in one ConfigError."""
    from mmfl.bench.runner import Bench, load_spec
    from mmfl.bench.spec import Fields

    g = load_grid(ROOT / "benchmarks/wireless/grid.toml")
    spec = load_spec(g.tables)
    (tmp_path / "summary.json").write_text("{}")
    assert spec.done(tmp_path, {}) and not spec.done(tmp_path, {"keep_checkpoints": 20}) and callable(spec.post)
    with pytest.raises(ConfigError, match="rel.raw or rel.report_stem"):
        Fields(Bench(g), {"blocks": []}).fill("{rel.nope}")
