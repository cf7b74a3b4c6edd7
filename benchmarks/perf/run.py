"""The performance benchmarks as one grid (``cells.toml``): run a profile's cells, each a child
process of its script, then render benchmarks/results/perf.md from perf.json (the table spec
``tables.toml``; the text below ``<!-- analysis -->`` in perf.md is kept).

    nice -n 10 .venv/bin/python benchmarks/perf/run.py [--profile small|full] [--cells NAME ...]
    .venv/bin/python benchmarks/perf/run.py --render-only

A full run starts perf.json afresh (keeping ``flower_sim_ratio``, which benchmarks/flower/run.py
writes). Every figure is CPU time (median and quartiles over interleaved repeats, ``timing.py``) or
peak memory (median and range over repeats), with the load average around it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
from mmfl.bench import write_report  # noqa: E402
from mmfl.bench.spec_data import render_doc  # noqa: E402


def run_cells(cells: dict, todo: list[str], profile: str, results: Path) -> None:
    """Each cell a child process (its script writes its figures into perf.json); a run note after each."""
    loads, failed = [os.getloadavg()[0]], []
    env = {**os.environ, "MMFL_PERF_RESULTS": str(results.parent), "MMFL_PERF_OUT": tempfile.mkdtemp(prefix="mmfl-perf-")}
    for c in todo:
        script, args = cells[c]
        cmd = [sys.executable, str(HERE / script), *shlex.split(args)]
        print(f"== {c}: {' '.join(cmd[1:])} (load {os.getloadavg()[0]:.1f})", flush=True)
        if subprocess.run(cmd, cwd=ROOT, env=env).returncode:
            failed.append(c)
            print(f"mmfl: warning: cell {c} failed (its figures are not in perf.json); the others go on", flush=True)
        loads.append(os.getloadavg()[0])
        data = json.loads(results.read_text())  # after every cell: a stopped run still says what ran
        data["run_note"] = {"profile": profile, "cells": todo[:len(loads) - 1], "loads": loads, "failed": failed,
                            "nice": os.nice(0), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}
        results.write_text(json.dumps(data, indent=2) + "\n")
    shutil.rmtree(env["MMFL_PERF_OUT"], ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="small")
    ap.add_argument("--cells", nargs="+", help="run only these cells (perf.json is updated, not started afresh)")
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--out", type=Path, help="write perf.json and perf.md here instead (a trial run)")
    a = ap.parse_args(argv)
    grid = tomllib.loads((HERE / "cells.toml").read_text())
    report, results = ROOT / grid["report"], ROOT / grid["results"]
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        report, results = a.out / report.name, a.out / results.name
    cells = grid["profiles"].get(a.profile)
    if cells is None:
        raise SystemExit(f"mmfl: error: no profile {a.profile!r} in cells.toml (have: {', '.join(grid['profiles'])})")
    if not a.render_only:
        todo = a.cells or list(cells)
        if unknown := [c for c in todo if c not in cells]:
            raise SystemExit(f"mmfl: error: no cell {unknown[0]!r} in profile {a.profile!r}")
        if not a.cells:
            old = json.loads(results.read_text()) if results.is_file() else {}
            results.write_text(json.dumps({"flower_sim_ratio": old.get("flower_sim_ratio")}, indent=2) + "\n")
        run_cells(cells, todo, a.profile, results)
    write_report(report, render_doc(HERE / grid["tables"], results), keep_below="<!-- analysis -->")
    print(f"wrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
