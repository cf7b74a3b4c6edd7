"""Performance grids: ``mmfl bench benchmarks/perf/measures.toml`` measures cells (a measurement
kind of :mod:`mmfl.bench.perf_measures` over variants and sizes), stores each report's data as
JSON beside it and renders the markdown from that data (:mod:`mmfl.bench.perf_render`), so a
committed result regenerates from its data (``--tables-only``) and a benchmark is TOML lines.

    kind = "perf"
    [cells.<name>]            measure = "cpu" | "peak_memory" | "per_call"; variants, repeats, warmup,
                              same, hook, ...; params = {...} (``$name`` in the variants);
                              over = [{...}, ...] (a measurement per entry: data ``runs``)
    [reports.<name>]          file = "benchmarks/results/x.md"; cells = [...]; [[reports.<name>.blocks]]

Guide: docs/benchmarks.md "Performance grids".
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from mmfl.bench.perf_measures import MEASURES
from mmfl.bench.perf_render import render_blocks
from mmfl.bench.render import write_report
from mmfl.config_raw import apply_overrides, load_raw
from mmfl.errors import ConfigError

CELL_KEYS = {"measure", "variants", "repeats", "warmup", "same", "params", "over", "hook", "kept", "round_arg",
             "lengths", "threads", "python", "printed", "call", "args", "set", "config", "patch", "diff", "ratios"}
REPORT_KEYS = {"file", "cells", "blocks", "keep_below", "reset"}  # keep_below: hand-written text under a marker
# stays; reset: top-level keys of the data dropped when a cell of the report is measured again


def is_perf_grid(path) -> bool:
    p = Path(path)
    return p.suffix == ".toml" and p.is_file() and load_raw(p).get("kind") == "perf"


def load_perf(path, grid_set: list[str] = ()) -> dict:
    """The grid, every key checked (a bad one is one ConfigError naming it)."""
    g = apply_overrides(load_raw(path), list(grid_set))
    if bad := set(g) - {"kind", "root", "cells", "reports"}:
        raise ConfigError(f"{path}: unknown key {sorted(bad)[0]!r}")
    for name, c in g.get("cells", {}).items():
        if bad := set(c) - CELL_KEYS:
            raise ConfigError(f"{path}: cells.{name}: unknown key {sorted(bad)[0]!r} "
                              f"(allowed: {', '.join(sorted(CELL_KEYS))})")
        if c.get("measure") not in MEASURES:
            raise ConfigError(f"{path}: cells.{name}.measure: one of {', '.join(MEASURES)}, got {c.get('measure')!r}")
        if not c.get("variants"):
            raise ConfigError(f"{path}: cells.{name}: needs [variants]")
        c["name"] = name
    for name, r in g.get("reports", {}).items():
        if bad := set(r) - REPORT_KEYS:
            raise ConfigError(f"{path}: reports.{name}: unknown key {sorted(bad)[0]!r}")
        if unknown := [c for c in r.get("cells", []) if c not in g.get("cells", {})]:
            raise ConfigError(f"{path}: reports.{name}: no cell {unknown[0]!r}")
        if "file" not in r or not r.get("blocks"):
            raise ConfigError(f"{path}: reports.{name}: needs file and [[blocks]]")
    g["root"] = (Path(path).resolve().parent / g.get("root", ".")).resolve()
    return g


def measure_cell(cell: dict) -> dict:
    """One cell's data: its measurement for each entry of ``over`` (``runs``) or, without ``over``,
    the measurement itself; with its params and repeats."""
    import torch

    if cell.get("threads"):
        torch.set_num_threads(cell["threads"])
    base = cell.get("params", {})
    kind = MEASURES[cell["measure"]]
    head = {"params": base, "repeats": cell.get("repeats"), "warmup": cell.get("warmup"),
            "threads": torch.get_num_threads(), "command": "mmfl " + shlex.join(sys.argv[1:])}
    if "over" not in cell:
        return {**head, **kind(cell, base)}
    runs = []
    for entry in cell["over"]:
        print(f"{cell['name']}: {entry}", flush=True)
        runs.append({"params": {**base, **entry}, **kind(cell, {**base, **entry})})
    return {**head, "runs": runs}


def report_path(grid: dict, report: dict) -> Path:
    """Where a report is written: its ``file``, or that name in ``--raw-dir`` (a trial)."""
    return Path(grid["out"]) / Path(report["file"]).name if grid.get("out") else grid["root"] / report["file"]


def data_path(grid: dict, report: dict) -> Path:
    return report_path(grid, report).with_suffix(".json")


def run(grid: dict, only: list[str] | None = None, tables_only: bool = False) -> list[Path]:
    """Measure the reports' cells (``only``: these cells or reports), merge the data into each
    report's JSON and render every report whose data is complete; returns the files written."""
    wrote = []
    for rname, rep in grid.get("reports", {}).items():
        path = data_path(grid, rep)
        data = json.loads(path.read_text()) if path.is_file() else {}
        todo = [] if tables_only else [c for c in rep["cells"] if not only or c in only or rname in only]
        if todo:  # figures of an earlier measurement that a new one replaces (none is left stale)
            data = {k: v for k, v in data.items() if k not in rep.get("reset", [])}
        for c in todo:
            data[c] = measure_cell(grid["cells"][c])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=1, default=float) + "\n")  # after every cell
        if missing := [c for c in rep["cells"] if c not in data]:
            if todo or tables_only:
                print(f"mmfl: note: {rname}: no data yet for {', '.join(missing)}; report not written", flush=True)
            continue
        out = report_path(grid, rep)
        write_report(out, render_blocks(rep["blocks"], data, out.parent), keep_below=rep.get("keep_below"))
        wrote.append(out)
    return wrote


def cmd_perf(args) -> int:
    grid = load_perf(args.grid, getattr(args, "grid_set", []))
    if getattr(args, "raw_dir", None):  # a trial: data and reports there, the committed ones untouched
        grid["out"] = Path(args.raw_dir)
        grid["out"].mkdir(parents=True, exist_ok=True)
    only = getattr(args, "group", None) or None
    names = set(grid.get("cells", {})) | set(grid.get("reports", {}))
    if only and (unknown := [o for o in only if o not in names]):
        raise ConfigError(f"{args.grid}: no cell or report {unknown[0]!r} (have: {', '.join(sorted(names))})")
    for p in run(grid, only, args.tables_only):
        print(f"wrote {p}")
    return 0
