"""Running a grid (what is missing, in parallel workers, resumable) and rendering its report
through the grid's table spec. ``mmfl bench GRID.toml`` (parser in :mod:`mmfl.cli`) calls
:func:`cmd_bench`."""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import partial
from pathlib import Path
from types import ModuleType

from mmfl.bench.grid import Grid, Run
from mmfl.bench.gridfile import load_grid
from mmfl.bench.render import md_table, ms, write_report
from mmfl.bench.results import Results
from mmfl.errors import ConfigError

_SPECS: dict[str, ModuleType] = {}


def load_spec(path: Path | None) -> ModuleType | None:
    """The table spec (``tables = "tables.py"`` of the grid), loaded from its file: a module, or a
    :class:`mmfl.bench.spec.TableSpec` for a ``.toml`` spec (rendered by the one general renderer)."""
    if path is None:
        return None
    key = str(path)
    if key not in _SPECS:
        if not path.is_file():
            raise ConfigError(f"tables: {path}: file not found")
        if path.suffix == ".toml":
            from mmfl.bench.spec import TableSpec

            _SPECS[key] = TableSpec(path)
            return _SPECS[key]
        stem = "" if path.stem == "tables" else f"_{path.stem}"
        spec = importlib.util.spec_from_file_location(f"mmfl_bench_spec_{path.parent.name}{stem}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _SPECS[key] = mod
    return _SPECS[key]


def load_sibling(spec_file: str | Path, name: str) -> ModuleType:
    """Another module of a table spec's folder (``load_sibling(__file__, "sections")`` in
    ``tables.py``), loaded from its file like the spec: a long spec split into files by idea.
    A sibling must not load the module that loads it (load the shared helpers from a third)."""
    return load_spec(Path(spec_file).resolve().with_name(f"{name}.py"))


class Bench:
    """What a table spec's ``report(b)`` gets: the grid, the raw folder's results and the
    planned runs, with shortcuts for the common readings."""

    def __init__(self, grid: Grid, files: tuple[str, ...] = ()):
        self.grid = grid
        self.raw = grid.raw_dir
        self.results = Results(grid.raw_dir, files)
        self.runs: list[Run] = grid.runs()
        self.params = grid.params
        self.invocation: dict | None = None  # this invocation's record when it ran runs (None: --tables-only)

    def methods(self, group: str):
        return self.grid.methods(group)

    def names(self, group: str, method: str, setting: str | None = None, seeds=None) -> dict[int, str]:
        return self.grid.names(group, method, setting, seeds)

    def by_seed(self, group: str, method: str, setting: str | None = None, key: str = "accuracy",
                reader: str = "final", keep_failed: bool = False) -> dict[int, float | None]:
        """``{seed: value}`` of one method (and setting) of a group (see :meth:`Results.by_seed`)."""
        return self.results.by_seed(self.names(group, method, setting), key, reader, keep_failed, self.grid.eval_key)

    def vals(self, group: str, method: str, setting: str | None = None, key: str = "accuracy",
             reader: str = "final") -> list[float]:
        return [v for v in self.by_seed(group, method, setting, key, reader).values() if v is not None]

    def config(self, group: str, method: str | None = None, setting: str | None = None) -> dict:
        """The raw config of a group's first run (or of one method / setting)."""
        return self.grid.raw_config(group, method, setting)

    def finished(self) -> list[str]:
        return [r.name for r in self.runs if self.results.finished(r.name)]

    def failed(self) -> list[tuple[str, str]]:
        return [(r.name, f) for r in self.runs if (f := self.results.failed(r.name)) is not None]

    def last_invocation(self) -> dict | None:
        """The record :func:`mmfl.sweep.run_pool` wrote of the last invocation that ran runs."""
        p = self.raw / "last_invocation.json"
        return json.loads(p.read_text()) if p.is_file() else None


def default_report(b: Bench) -> list[str]:
    """Without a table spec: per group, the final accuracy (mean ± std over seeds, %) of each
    method (rows) in each setting (columns)."""
    out = [f"# {b.grid.name}", ""]
    for gk, g in b.grid.groups.items():
        out += [f"## {g.label}", ""]
        header = ["method", *[s.label or "final accuracy (%)" for s in g.settings.values()]]
        rows = [[m.label, *[ms(b.vals(gk, mk, sk), len(b.names(gk, mk, sk)), scale=100.0) for sk in g.settings]]
                for mk, m in g.methods.items()]
        out += [*md_table(header, rows), ""]
    return out


def _spec_post(raw: dict, cfg, run_dir: Path, exp, *, spec_path: str, call: str = "post") -> None:
    """A worker's post-run step: the spec's ``post(raw, cfg, run_dir, exp)`` (or the function
    a group's ``post.call`` names; the spec is loaded from its file in the worker, so it need
    not be importable by name)."""
    getattr(load_spec(Path(spec_path)), call)(raw, cfg, run_dir, exp)


def _spec_run(raw: dict, cfg, run_dir: Path, *, spec_path: str, params: dict, plans: dict) -> None:
    """A worker runs one run through the spec's ``run(raw, cfg, run_dir, plan)`` (``plan``: the run's
    group, setting, method, seed, its entry's ``info`` and the grid's ``params``)."""
    load_spec(Path(spec_path)).run(raw, cfg, run_dir, {**plans[run_dir.name], "params": params})


def execute(grid: Grid, workers: int | None = None, seeds: list[int] | None = None,
            groups: list[str] | None = None) -> int:
    """Run the planned runs that are not done, in ``workers`` spawned one-thread processes
    (:func:`mmfl.sweep.run_missing`). Done: the spec's ``done(run_dir, raw)`` if it has one,
    else summary.json exists (or failed.txt, with ``failed_is_done``). Returns how many ran."""
    from mmfl.sweep import run_missing

    spec = load_spec(grid.tables)
    runs = grid.runs(groups, seeds)
    raw_dir = grid.raw_dir

    def done(name: str, raw: dict) -> bool:
        d = raw_dir / name
        if spec is not None and hasattr(spec, "done"):
            return spec.done(d, raw)
        return (d / "summary.json").is_file() or (grid.failed_is_done and (d / "failed.txt").is_file())

    warm, seen = [], set()
    for r in runs:  # the data sets of each (group, setting) once, before the workers start
        if (r.group, r.setting) not in seen:
            seen.add((r.group, r.setting))
            warm.append(r.raw)
    post = partial(_spec_post, spec_path=str(grid.tables)) if spec is not None and hasattr(spec, "post") else None
    # the spec's run(raw, cfg, run_dir, plan), if it has one, runs each run itself (another transport)
    runner = partial(_spec_run, spec_path=str(grid.tables), params=grid.params, plans={
        r.name: {"group": r.group, "setting": r.setting, "method": r.method, "seed": r.seed,
                 "info": grid.entry(r.group, r.method).info} for r in runs}) if hasattr(spec, "run") else None
    raw_dir.mkdir(parents=True, exist_ok=True)
    n = run_missing(grid.name, [(r.name, r.raw) for r in runs], raw_dir, workers or grid.workers, warm,
                    done=done, post=post, reuse_finished=grid.reuse_finished, runner=runner)
    for gk, g in grid.groups.items():  # a group's post-run step: on each of its runs without the file it writes
        if g.post is None or (groups and gk not in groups):
            continue
        if spec is None or not hasattr(spec, g.post["call"]):
            raise ConfigError(f"groups.{gk}.post: the table spec has no function {g.post['call']!r}")
        writes = g.post["writes"]
        mine = [(r.name, r.raw) for r in grid.runs([gk], seeds)]
        n += run_missing(f"{grid.name} {gk} ({g.post['call']})", mine, raw_dir, workers or grid.workers, [],
                         done=lambda name, raw: (raw_dir / name / writes).is_file(),
                         post=partial(_spec_post, spec_path=str(grid.tables), call=g.post["call"]),
                         reuse_finished=True)
    return n


def render(grid: Grid, ran: int = 0) -> Path | None:
    """Write the grid's report from the finished runs (the spec's ``report(b)``, else
    :func:`default_report`); returns its path (None when the grid names no report). ``ran``:
    how many runs this invocation ran (then ``b.invocation`` is their record, else None)."""
    spec = load_spec(grid.tables)
    b = Bench(grid, tuple(getattr(spec, "FILES", ())))
    b.invocation = b.last_invocation() if ran else None
    lines = spec.report(b) if spec is not None and hasattr(spec, "report") else default_report(b)
    if grid.report is None:
        print("\n".join(lines))
        return None
    return write_report(grid.report, lines, grid.keep_below)


def redirect(grid: Grid, raw_dir: str | Path) -> Grid:
    """The grid with its runs (and its report, under the report's file name) in ``raw_dir``: a
    test location, so that a smoke run or a check never writes into the repository."""
    import dataclasses

    raw = Path(raw_dir).resolve()
    return dataclasses.replace(grid, raw_dir=raw, report=raw / grid.report.name if grid.report else None)


def cmd_bench(args) -> int:
    import time

    from mmfl.bench.perf import cmd_perf, is_perf_grid
    from mmfl.bench.plan import plan, run_sets

    if is_perf_grid(args.grid):  # a performance grid (kind = "perf"): measurements, not runs
        return cmd_perf(args)
    sets = run_sets(getattr(args, "device", None), getattr(args, "batch_clients", None))
    grid = load_grid(args.grid, [*args.grid_set, *sets])
    if getattr(args, "raw_dir", None):  # another folder of runs (a test location): the report stays with its runs
        grid = redirect(grid, args.raw_dir)
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers: must be >= 1, got {args.workers}")
    if getattr(args, "plan", False):
        return plan(grid, args.group, args.estimate, args.estimate_epochs)
    t0 = time.perf_counter()
    ran = 0 if args.tables_only else execute(grid, args.workers, args.seeds, args.group or None)
    path = render(grid, ran)
    if path is not None:
        print(f"wrote {path}")
    if ran:
        print(f"wall time ({grid.path.name}): {time.perf_counter() - t0:.1f} s")
    return 0


def bench_main(grid: str | Path, argv: list[str] | None = None) -> int:
    """``mmfl bench GRID [argv]`` from a benchmark's thin ``run.py``."""
    import argparse

    from mmfl.bench_args import add_bench_parser
    from mmfl.errors import one_line

    parser = argparse.ArgumentParser(prog="mmfl")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", str(grid), *(sys.argv[1:] if argv is None else argv)])
    return one_line(cmd_bench, args)
