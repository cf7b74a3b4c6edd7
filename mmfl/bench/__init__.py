"""Benchmarks as data: a grid file (groups of settings x methods x seeds, TOML) expanded
into named runs, run where missing in parallel workers with resume, and a report rendered
by a short table spec (``benchmarks/<paper>/tables.py``). Top layer: may import anything in
mmfl. Guide: docs/benchmarks.md; command: ``mmfl bench GRID.toml``."""

from mmfl.bench.grid import Entry, Grid, Group, Run, dotted_get, merge
from mmfl.bench.gridfile import load_grid
from mmfl.bench.render import (PAIR_HEAD, SPREAD_RULE, claim_row, claim_table, md_table, ms, pair_row, paired,
                               plot_series, seed_cell, verdict_cell, verdict_count, write_report)
from mmfl.bench.results import Results, finite
from mmfl.bench.runner import Bench, bench_main, execute, load_sibling, load_spec, render
from mmfl.bench.status import problem_lines, reading_lines, regenerate_line, run_status, runs_line

__all__ = ["Bench", "Entry", "Grid", "Group", "PAIR_HEAD", "Results", "Run", "SPREAD_RULE", "bench_main", "claim_row",
           "claim_table", "dotted_get", "execute", "finite", "load_grid", "load_sibling", "load_spec", "md_table",
           "merge", "ms", "pair_row", "paired", "plot_series", "problem_lines", "reading_lines", "regenerate_line",
           "render", "run_status", "runs_line", "seed_cell", "verdict_cell", "verdict_count", "write_report"]
