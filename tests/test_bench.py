"""The benchmark toolkit (mmfl.bench): grid expansion, resume, table rendering, CLI errors."""

import json
from pathlib import Path

import pytest

from mmfl.bench import Results, load_grid, pair_row, render, seed_cell
from mmfl.bench import runner as bench_runner
from mmfl.cli import main

TINY = Path(__file__).parent / "flower_tiny.toml"

GRID = f"""
name = "tiny"
raw_dir = "raw"
report = "out.md"
seeds = [0, 1, 2]
config = "{TINY}"

[set]
threads = 1
train = {{ optimizer = "sgd", lr = 0.1 }}

[groups.g]
template = "g-{{setting}}-{{method}}-s{{seed}}"
set = {{ rounds = 3 }}

[groups.g.settings]
a = {{ label = "beta 0.5", set = {{ "partition.beta" = 0.5 }} }}
b = {{ label = "beta 0.1", set = {{ "partition.beta" = 0.1 }}, seeds = [0, 1] }}

[groups.g.methods]
fedavg = {{ label = "FedAvg", set = {{ "algorithm.name" = "fedavg" }} }}
prox = {{ label = "FedProx", name = "fedprox", seeds = [0], set = {{ "algorithm.name" = "fedprox", "algorithm.mu" = 0.1 }} }}
"""


def _grid(tmp_path, text=GRID):
    p = tmp_path / "grid.toml"
    p.write_text(text)
    return load_grid(p)


def test_grid_expands_names_overrides_and_seeds(tmp_path):
    g = _grid(tmp_path)
    runs = {r.name: r for r in g.runs()}
    # a: 3 seeds x fedavg + seed 0 x prox; b: seeds 0,1 x fedavg + seed 0 x prox
    assert sorted(runs) == sorted(["g-a-fedavg-s0", "g-a-fedavg-s1", "g-a-fedavg-s2", "g-a-fedprox-s0",
                                   "g-b-fedavg-s0", "g-b-fedavg-s1", "g-b-fedprox-s0"])
    r = runs["g-b-fedprox-s0"].raw
    assert r["algorithm"] == {"name": "fedprox", "mu": 0.1}
    assert r["partition"] == {"name": "dirichlet", "num_clients": 3, "beta": 0.1}  # base file merged, not replaced
    assert r["train"]["lr"] == 0.1 and r["train"]["batch_size"] == 64
    assert r["rounds"] == 3 and r["threads"] == 1 and r["seed"] == 0
    assert runs["g-a-fedavg-s2"].raw["seed"] == 2
    assert g.names("g", "fedavg", "b") == {0: "g-b-fedavg-s0", 1: "g-b-fedavg-s1"}
    assert [r.seed for r in g.runs(seeds=[1])] == [1, 1]
    assert list(g.methods("g")) == ["fedavg", "prox"]


def test_adding_a_method_is_one_line(tmp_path):
    g = _grid(tmp_path, GRID + 'fedavgm = { label = "FedAvgM", set = { "algorithm.name" = "fedavgm" } }\n')
    assert list(g.methods("g")) == ["fedavg", "prox", "fedavgm"]
    assert g.names("g", "fedavgm", "a") == {0: "g-a-fedavgm-s0", 1: "g-a-fedavgm-s1", 2: "g-a-fedavgm-s2"}


def test_same_name_for_two_configs_is_an_error(tmp_path):
    from mmfl.errors import ConfigError

    with pytest.raises(ConfigError, match="two different configs"):
        _grid(tmp_path, GRID.replace("g-{setting}-{method}", "g-{method}")).runs()


def test_finished_run_is_not_run_again(tmp_path, monkeypatch):
    import mmfl.sweep as sweep

    g = _grid(tmp_path)
    done = g.raw_dir / "g-a-fedavg-s0"
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    ran = []
    monkeypatch.setattr(sweep, "warm_caches", lambda raws: None)
    monkeypatch.setattr(sweep, "run_pool", lambda todo, fn, raw_dir, workers: ran.extend(n for n, _ in todo) or len(todo))
    assert bench_runner.execute(g, workers=1) == 6
    assert "g-a-fedavg-s0" not in ran and len(ran) == 6
    # a failed run is retried unless the grid says failed_is_done
    (g.raw_dir / "g-a-fedavg-s1").mkdir()
    (g.raw_dir / "g-a-fedavg-s1" / "failed.txt").write_text("diverged")
    ran.clear()
    bench_runner.execute(g, workers=1)
    assert "g-a-fedavg-s1" in ran
    g.failed_is_done = True
    ran.clear()
    bench_runner.execute(g, workers=1)
    assert "g-a-fedavg-s1" not in ran and len(ran) == 5


def _fake_run(raw_dir: Path, name: str, accs: list[float]):
    d = raw_dir / name
    d.mkdir(parents=True)
    rows = [{"round": i + 1, "accuracy": a, "bytes_up": 1_000_000, "bytes_down": 2_000_000, "wall_time_s": 1.5}
            for i, a in enumerate(accs)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"rounds": len(accs), "final_accuracy": accs[-1],
                                                "best_accuracy": max(accs), "wall_time_s": 1.5 * len(accs)}))


def test_tables_from_fake_run_folders(tmp_path):
    g = _grid(tmp_path)
    for seed, acc in ((0, 0.5), (1, 0.7), (2, 0.6)):
        _fake_run(g.raw_dir, f"g-a-fedavg-s{seed}", [0.2, acc + 0.1, acc])
    _fake_run(g.raw_dir, "g-a-fedprox-s0", [0.3, 0.4, 0.45])
    res = Results(g.raw_dir)
    f = res.final("g-a-fedavg-s0")
    assert f["accuracy"] == 0.5 and f["_mb_round"] == pytest.approx(3.0) and f["_wall"] == pytest.approx(4.5)
    assert res.value("g-a-fedavg-s0", reader="best") == pytest.approx(0.6)
    assert res.by_seed(g.names("g", "fedavg", "a")) == {0: 0.5, 1: 0.7, 2: 0.6}
    assert res.mean_curve(g.names("g", "fedavg", "a"))[-1]["accuracy"] == pytest.approx(0.6)
    render(g)  # no table spec: the default report, a method x setting table of final accuracy
    text = (tmp_path / "out.md").read_text()
    assert "| FedAvg | 60.0 ± 8.2 | — |" in text  # std over seeds (ddof 0) of 50, 70, 60
    assert "| FedProx | 45.0 | — |" in text
    # a diverged run (failed.txt) counts in the MOON-style cell and the paired row
    (g.raw_dir / "g-b-fedavg-s0").mkdir()
    (g.raw_dir / "g-b-fedavg-s0" / "failed.txt").write_text("ValueError: non-finite model")
    vals = res.by_seed(g.names("g", "fedavg", "b"), keep_failed=True)
    assert vals == {0: None} and seed_cell(vals) == "– (1 of 1 diverged)"
    a = {s: 0.6 + 0.01 * s for s in range(5)}
    b = {s: 0.5 + 0.01 * s * (s % 2) for s in range(5)}
    row = pair_row("A", "B", a, b)
    assert row.startswith("| A − B | +") and "**A > B** (5 seeds)" in row
    assert "not claimed" in pair_row("A", "B", {0: 0.6, 1: 0.7}, {0: 0.5, 1: 0.55})


def test_cli_bad_grid_is_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('raw_dir = "raw"\n[groups.g]\nmethods = { m = { sett = 1 } }\n')
    assert main(["bench", str(bad), "--tables-only"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mmfl: error: ") and "sett" in err[0]
    assert main(["bench", str(tmp_path / "missing.toml")]) == 2
    assert "file not found" in capsys.readouterr().err


def test_like_post_settings_false_eval_key_and_file_reader(tmp_path, monkeypatch):
    """Group inheritance (like), a group's post step (only on its runs without the file it writes),
    entries restricted to settings or removed by an extending file, eval_key and a file reader."""
    import mmfl.sweep as sweep

    text = GRID + '''
[groups.v]
like = "g"
settings = ["a"]
post = { call = "post_v", writes = "v.json" }
[groups.v.methods]
only_b = { settings = ["b"], set = { "algorithm.name" = "fedavg", rounds = 2 } }
'''
    text = text.replace('name = "tiny"', 'name = "tiny"\neval_key = "r1"')
    (tmp_path / "tables.py").write_text("def post_v(raw, cfg, run_dir, exp):\n    pass\n")
    text = text.replace('report = "out.md"', 'report = "out.md"\ntables = "tables.py"')
    g = _grid(tmp_path, text)
    assert list(g.methods("v")) == ["fedavg", "prox", "only_b"] and list(g.settings("v")) == ["a"]
    assert g.names("v", "fedavg") == g.names("g", "fedavg", "a")  # the same runs as g's
    assert g.names("v", "only_b") == {}  # only_b is for setting b, which v does not have
    names = {r.name for r in g.runs()}
    (tmp_path / "plain.toml").write_text(GRID)
    assert names == {r.name for r in load_grid(tmp_path / "plain.toml").runs()}  # v plans no run of its own
    (tmp_path / "quick.toml").write_text('extends = "grid.toml"\n[groups.g.methods]\nprox = false\n')
    q = load_grid(tmp_path / "quick.toml")
    assert list(q.methods("g")) == ["fedavg"] and list(q.methods("v")) == ["fedavg", "only_b"]
    # post step: runs of v without v.json (finished ones reused), after the grid's runs
    calls = []
    monkeypatch.setattr(sweep, "warm_caches", lambda raws: None)
    monkeypatch.setattr(sweep, "run_pool", lambda todo, fn, raw_dir, workers: calls.append(
        (sorted(n for n, _ in todo), fn.keywords["post"], fn.keywords["reuse_finished"])) or len(todo))
    for n in names:
        _fake_run(g.raw_dir, n, [0.5])
    (g.raw_dir / "g-a-fedavg-s1" / "v.json").write_text(json.dumps({"score": 3.0}))
    assert bench_runner.execute(g, workers=1) == 3
    (todo, post, reuse), = calls
    assert todo == ["g-a-fedavg-s0", "g-a-fedavg-s2", "g-a-fedprox-s0"] and reuse
    assert post.keywords["call"] == "post_v"
    # eval_key: a run total read off the last row with r1; a file reader
    d = g.raw_dir / "g-a-fedavg-s0"
    (d / "metrics.jsonl").write_text(json.dumps({"round": 1, "r1": 5.0, "bytes_up": 10**6}) + "\n"
                                     + json.dumps({"round": 2, "bytes_up": 3 * 10**6}) + "\n")
    b = bench_runner.Bench(g)
    assert b.by_seed("g", "fedavg", "a", key="_mb_up")[0] == pytest.approx(2.0)
    assert b.by_seed("v", "fedavg", key="score", reader="v.json") == {1: 3.0}


def test_cli_grid_set_and_raw_dir(tmp_path):
    _grid(tmp_path)
    assert main(["bench", str(tmp_path / "grid.toml"), "--tables-only", "--raw-dir", str(tmp_path / "elsewhere"),
                 "--grid-set", 'groups.g.methods.prox.label="Prox!"']) == 0
    assert "| Prox! |" in (tmp_path / "elsewhere" / "out.md").read_text()
    assert not (tmp_path / "out.md").exists()
    g = load_grid(tmp_path / "grid.toml", ["groups.g.seeds=[7]"])
    assert g.names("g", "fedavg", "a") == {7: "g-a-fedavg-s7"}


def test_when_rules_override_matching_runs_only(tmp_path):
    g = _grid(tmp_path, GRID + """
[[when]]
methods = ["prox"]
settings = ["b"]
set = { "train.lr" = 0.5 }

[[when]]
names = ["g-a-fedavg-s*"]
seeds = [1, 2]
set = { keep_checkpoints = 3 }
""")
    runs = {r.name: r.raw for r in g.runs()}
    assert runs["g-b-fedprox-s0"]["train"]["lr"] == 0.5  # setting b and method prox: matched
    assert runs["g-a-fedprox-s0"]["train"]["lr"] == 0.1 and runs["g-b-fedavg-s0"]["train"]["lr"] == 0.1
    assert [n for n, r in sorted(runs.items()) if "keep_checkpoints" in r] == ["g-a-fedavg-s1", "g-a-fedavg-s2"]


def test_when_rule_naming_an_unknown_group_is_an_error(tmp_path):
    from mmfl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"when\[0\].groups: no group 'nope'"):
        _grid(tmp_path, GRID + '\n[[when]]\ngroups = ["nope"]\nset = { rounds = 1 }\n')


def test_raw_dir_redirects_runs_and_report(tmp_path):
    from mmfl.bench.runner import redirect

    g = redirect(_grid(tmp_path), tmp_path / "elsewhere")
    assert g.raw_dir == (tmp_path / "elsewhere").resolve() and g.report == g.raw_dir / "out.md"


def test_verdict_count_counts_held_beyond_and_reversed():
    from mmfl.bench import verdict_count

    v = ["holds, beyond the spread", "holds, within the spread", "**reversed**, beyond the spread",
         "reversed, within the spread"]
    assert verdict_count(v, "T") == ("2 of 4 T claims hold in the mean; 1 beyond the seed spread, "
                                     "1 reversed beyond it, the rest within it.")

def test_invocation_record_only_when_this_invocation_ran_runs(tmp_path, monkeypatch):
    """``b.invocation``: the record of the runs this invocation ran (for a cost line); None for
    ``--tables-only`` even when an older record exists, so a rebuilt report stays identical."""
    import mmfl.sweep as sweep

    spec = tmp_path / "tables.py"
    spec.write_text("def report(b):\n    inv = b.invocation\n"
                    "    return ['ran ' + (str(inv['runs']) if inv else 'none'), '']\n")
    g = _grid(tmp_path, 'tables = "tables.py"\n' + GRID)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "last_invocation.json").write_text(json.dumps({"runs": 99, "wall_s": 1.0, "workers": 2}))

    def fake_pool(todo, fn, raw_dir, workers):
        (Path(raw_dir) / "last_invocation.json").write_text(json.dumps({"runs": len(todo), "wall_s": 1.0,
                                                                         "workers": workers}))
        return len(todo)

    monkeypatch.setattr(sweep, "warm_caches", lambda raws: None)
    monkeypatch.setattr(sweep, "run_pool", fake_pool)
    assert main(["bench", str(g.path), "--tables-only"]) == 0
    assert (tmp_path / "out.md").read_text() == "ran none\n"
    assert main(["bench", str(g.path), "--workers", "1"]) == 0
    assert (tmp_path / "out.md").read_text() == "ran 7\n"


def test_claim_table_rows_only_claims_with_values_on_both_sides():
    """``claim_table``: one row per claim "a > b" with values on both sides (Δ scaled, spread
    = std a + std b), the verdicts in order; nothing at all when no claim has values."""
    from mmfl.bench import claim_row, claim_table

    lines, verdicts = claim_table([("A > B", [0.6, 0.7], [0.5, 0.5], 100.0, 1), ("A > C", [0.6], [], 100.0, 1),
                                   ("t: B > A", [2.0, 2.0], [1.0, 1.2], 1.0, 2)], unit="points or s")
    assert lines[0] == "| claim | Δ (points or s) | spread (std a + std b) | here |"
    assert lines[2] == "| A > B | +15.0 | 5.0 | holds, beyond the spread |"
    assert lines[3] == "| t: B > A | +0.90 | 0.10 | holds, beyond the spread |" and lines[-1] == ""
    assert verdicts == ["holds, beyond the spread"] * 2
    assert claim_table([("A > C", [0.6], [], 100.0, 1)]) == ([], [])
    line, d, v = claim_row("x", [0.5, 0.52], [0.6, 0.4])
    assert d == pytest.approx(1.0) and line == f"| x | +1.0 | 11.0 | {v} |" and "within" in v


def test_run_status_and_header_lines(tmp_path):
    """``run_status``: finished / failed (every planned run with a failed.txt) / non-finite runs and
    the summed wall time; the header lines built from it."""
    from mmfl.bench import Bench, problem_lines, reading_lines, regenerate_line, run_status, runs_line

    g = _grid(tmp_path)
    _fake_run(g.raw_dir, "g-a-fedavg-s0", [0.2, 0.4, 0.5])
    _fake_run(g.raw_dir, "g-a-fedavg-s1", [0.2, 0.4, float("nan")])
    (g.raw_dir / "g-b-fedavg-s0").mkdir()
    (g.raw_dir / "g-b-fedavg-s0" / "failed.txt").write_text("ValueError: nan\n")
    (g.raw_dir / "other-run").mkdir()
    (g.raw_dir / "other-run" / "failed.txt").write_text("not planned")
    b = Bench(g)
    st = run_status(b, b.results.final)
    assert st["finished"] == ["g-a-fedavg-s0", "g-a-fedavg-s1"] and st["planned"] == 7
    assert st["failed"] == [("g-b-fedavg-s0", "ValueError: nan")]
    assert st["nonfinite"] == [("g-a-fedavg-s1", ["accuracy"])] and st["run_s"] == pytest.approx(9.0)
    assert runs_line(2, 7, 90.0, None) == ("- Runs: 2 of 7 planned finished; summed run time 1.5 min of "
                                           "single-thread compute (the rounds' wall times).")
    last = {"runs": 2, "wall_s": 120.0, "workers": 2, "load_average_at_start": [0.5, 1.0, 1.25]}
    assert runs_line(2, 7, 90.0, last).endswith("; the last invocation ran 2 runs in 2.0 min wall with 2 workers "
                                                "(load average at its start: 0.5 1.0 1.2).")
    assert problem_lines(st["failed"], st["nonfinite"], "run.py") == [
        "**Failed runs** (1; the error, and `run.py` reruns them):", "", "- `g-b-fedavg-s0`: ValueError: nan", "",
        "**Runs with non-finite metrics** (1):", "", "- `g-a-fedavg-s1`: accuracy", ""]
    assert problem_lines([]) == [] and reading_lines(tmp_path / "absent.md") == []
    (tmp_path / "analysis.md").write_text("\nText.\n")
    assert reading_lines(tmp_path / "analysis.md") == ["## Reading the results", "", "Text.", ""]
    assert regenerate_line(b, "x").startswith("Regenerate: `x` (finished runs in `raw/` are reused;")


def test_load_sibling_loads_a_spec_folders_module_once(tmp_path):
    """A spec split into files: ``load_sibling(__file__, name)`` gives the folder's module, loaded
    once (the spec and its sections share one copy of the readings)."""
    (tmp_path / "readings.py").write_text("CALLS = []\n")
    (tmp_path / "sections.py").write_text("from mmfl.bench import load_sibling\n"
                                          "R = load_sibling(__file__, 'readings')\nR.CALLS.append('sections')\n")
    (tmp_path / "tables.py").write_text("from mmfl.bench import load_sibling\nR = load_sibling(__file__, 'readings')\n"
                                        "S = load_sibling(__file__, 'sections')\n"
                                        "def report(b):\n    return [str(R.CALLS), '']\n")
    g = _grid(tmp_path, 'tables = "tables.py"\n' + GRID)
    render(g)
    assert (tmp_path / "out.md").read_text() == "['sections']\n"


BENCHMARK_GRIDS = sorted((Path(__file__).parent.parent / "benchmarks").glob("*/grid*.toml"))


@pytest.mark.parametrize("grid", BENCHMARK_GRIDS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_planned_run_of_a_committed_benchmark_grid_resolves(grid):
    """Each committed benchmark grid (and its quick variant) plans configs that mmfl accepts: a
    renamed parameter, rule or attack kind fails here, not hours into `mmfl bench`."""
    import tomllib

    from mmfl.bench.sweep_grid import load_sweep
    from mmfl.config import resolve

    sweep_file = "base" in tomllib.loads(grid.read_text())  # a `mmfl sweep` file (docs/sweep.md)
    runs = (load_sweep(grid)[0] if sweep_file else load_grid(grid)).runs()
    assert runs
    for r in runs:
        resolve(r.raw)
