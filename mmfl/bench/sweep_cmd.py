"""``mmfl sweep GRID.toml``: a grid of methods x settings x seeds from a user's sweep file
(:mod:`mmfl.bench.sweep_grid`), every planned config checked before anything runs, what is
missing run in worker processes (one torch thread each, a bar over the runs, resumable), and
a mean ± std table over seeds with a plot (:mod:`mmfl.bench.sweep_table`). Guide: docs/sweep.md."""

from __future__ import annotations

import sys

from mmfl.bench.grid import Grid, Run
from mmfl.bench.runner import Bench
from mmfl.bench.status import problem_lines
from mmfl.bench.sweep_grid import load_sweep
from mmfl.bench.sweep_table import cells, markdown, metrics_of, plot, write_csv
from mmfl.errors import ConfigError, MMFLError

OUTPUTS = ("results.md", "results.csv", "results.png")  # written into the raw folder


def check_runs(grid: Grid) -> list[Run]:
    """Every planned run, its config resolved (an error names the run): nothing starts on a
    grid with one bad run."""
    from mmfl.config import resolve

    runs = grid.runs()
    if not runs:
        raise ConfigError(f"{grid.path}: plans no runs (empty seeds?)")
    for r in runs:
        try:
            resolve(dict(r.raw, name=r.name, output_dir=str(grid.raw_dir)))
        except MMFLError as e:
            raise ConfigError(f"{grid.path}: run {r.name}: {e}") from None
    return runs


def _state(grid: Grid, name: str) -> str:
    d = grid.raw_dir / name
    return "finished" if (d / "summary.json").is_file() else "failed" if (d / "failed.txt").is_file() else "to do"


def _done(grid: Grid, name: str) -> bool:
    return _state(grid, name) == "finished" or (grid.failed_is_done and _state(grid, name) == "failed")


def dry_run(grid: Grid, runs: list[Run], workers: int) -> None:
    states = [_state(grid, r.name) for r in runs]
    print(f"{grid.name}: {len(runs)} runs planned ({states.count('finished')} finished, "
          f"{states.count('failed')} failed), {workers} worker{'s' * (workers != 1)}, in {grid.raw_dir}")
    width = max(len(r.name) for r in runs)
    for r, st in zip(runs, states):
        g = grid.groups[r.group]
        where = " | ".join(x for x in (g.settings[r.setting].label, grid.entry(r.group, r.method).label) if x)
        print(f"  {r.name:<{width}}  {st:<8}  {where}  seed {r.seed}")


def run(grid: Grid, runs: list[Run], workers: int) -> int:
    """Run the planned runs that are not done; returns how many ran."""
    from mmfl.sweep import run_one, run_pool, warm_caches

    todo = [(r.name, r.raw) for r in runs if not _done(grid, r.name)]
    print(f"{grid.name}: {len(runs)} runs planned, {len(runs) - len(todo)} finished, {len(todo)} to do, "
          f"{workers} worker{'s' * (workers != 1)} -> {grid.raw_dir}", flush=True)
    if not todo:
        return 0
    grid.raw_dir.mkdir(parents=True, exist_ok=True)
    warm_caches([raw for _, raw in todo])
    return run_pool(todo, run_one, grid.raw_dir, workers, progress=True)


def report(grid: Grid, metrics: list[str] | None, command: str) -> tuple[list[str], int]:
    """The tables' lines (written to results.md/.csv with the plot) and the number of failed runs."""
    b = Bench(grid)
    keys = metrics_of(b, metrics)
    cs = cells(b, keys)
    failed = b.failed()
    lines = [f"# {grid.name}", "", f"{len(b.finished())} of {len(b.runs)} planned runs finished "
             f"(`{command}`).", "", *markdown(b, cs, keys), "", *problem_lines(failed, command=command)]
    out = grid.raw_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / OUTPUTS[0]).write_text("\n".join(lines).rstrip("\n") + "\n")
    write_csv(out / OUTPUTS[1], cs, keys)
    png = plot(b, cs, keys[0], out / OUTPUTS[2])
    lines.append(f"wrote {out / OUTPUTS[0]}, {OUTPUTS[1]}" + (f", {OUTPUTS[2]}" if png else " (no curve to plot)"))
    return lines, len(failed)


def cmd_sweep(args) -> int:
    grid, metrics = load_sweep(args.grid, args.out)
    workers = args.workers if args.workers is not None else grid.workers
    if workers < 1:
        raise ConfigError(f"--workers: must be >= 1, got {workers}")
    runs = check_runs(grid)
    if args.dry_run:
        dry_run(grid, runs, workers)
        return 0
    command = f"mmfl sweep {args.grid}" + (f" --out {args.out}" if args.out else "")
    if not args.tables_only:
        try:
            run(grid, runs, workers)
        except KeyboardInterrupt:
            n = sum(_state(grid, r.name) == "finished" for r in runs)
            print(f"mmfl: interrupted: {n} of {len(runs)} runs finished (kept in {grid.raw_dir}); "
                  f"`{command}` continues", file=sys.stderr)
            return 130
    lines, failed = report(grid, metrics, command)
    print("\n".join(lines))
    return 1 if failed else 0
