"""The performance benchmarks as one grid (``cells.toml``): run a profile's cells, each a child
process of its script, then render benchmarks/results/perf.md from perf.json.

    nice -n 10 .venv/bin/python benchmarks/perf/run.py [--profile small|full] [--cells NAME ...]
    .venv/bin/python benchmarks/perf/run.py --render-only

A full run starts perf.json afresh (keeping ``flower_sim_ratio``, which benchmarks/flower/run.py
writes). Every figure in the report is CPU time (median and quartiles over interleaved repeats,
``timing.py``) or peak memory (median and range over repeats), with the load average around it.
The text below ``<!-- analysis -->`` in perf.md is kept.
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
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from timing import fmt_spread  # noqa: E402

from mmfl.bench import md_table, write_report  # noqa: E402

MARKER = "<!-- analysis -->"


def load_grid(path: Path = HERE / "cells.toml") -> dict:
    return tomllib.loads(path.read_text())


def _sp(d: dict | None, digits: int = 2, unit: str = "") -> str:
    return "—" if not d else f"{fmt_spread(d, digits)}{unit}"


def _range(d: dict | None, digits: int = 2) -> str:
    return "—" if not d or d.get("median") is None else f"{d['median']:.{digits}f} ({d['min']:.{digits}f}–{d['max']:.{digits}f})"


def _load(r: dict) -> str:
    a, b = r.get("load_start"), r.get("load_average", r.get("load_end"))
    return " → ".join(f"{x:.1f}" for x in (a, b) if x is not None) or "—"


def _last_run(sec: dict) -> dict:
    return sec["runs"][-1] if isinstance(sec, dict) and sec.get("runs") else sec


def _cpu(s: dict) -> dict:
    return {"median": s["cpu_median"], "q1": s["cpu_q1"], "q3": s["cpu_q3"]}


def render_overhead(name: str, r: dict) -> list[str]:
    ra = r["ratio"]
    return [f"### {name}: mmfl vs the plain PyTorch loop", "", f"`{r['command']}`; {r['threads']} thread(s), "
            f"{r['repeats']} interleaved repeats, load {_load(r)}.", "",
            *md_table(["side", "CPU s, median (q1–q3)", "wall s, median"],
                      [[s, _sp(_cpu(r[s])), f"{r[s]['wall_median']:.2f}"] for s in ("mmfl", "plain")]), "",
            f"mmfl / plain CPU time: **{ra['cpu_median_of_pairs']:.3f}×** (median of the pairs; min/min "
            f"{ra['cpu_min_over_min']:.3f}); same final model within {r['final_model_max_abs_diff']:.1e}.", ""]


def render_batched(name: str, r: dict) -> list[str]:
    modes = [m for m in ("batched", "sequential", "plain") if m in r]
    out = [f"### {name}: stacked clients", "", f"`{r['command']}`; {r['threads']} thread(s), {r['repeats']} "
           f"interleaved repeats, load {_load(r)}.", "",
           *md_table(["variant", "CPU s, median (q1–q3)", "wall s, median"],
                     [[m, _sp(_cpu(r[m])), f"{r[m]['wall_median']:.2f}"] for m in modes]), ""]
    for key, what in (("batched_vs_sequential", "sequential / batched"), ("batched_vs_plain", "plain / batched")):
        if key in r:
            out.append(f"- {what} CPU time: **{r[key]['cpu_median_of_pairs']:.3f}×** (median of the pairs; "
                       f"min/min {r[key]['cpu_min_over_min']:.3f})")
    return out + [f"- batched vs sequential final model: max |diff| {r['final_model_max_abs_diff_vs_sequential']:.1e}", ""]


def render_memory(name: str, r: dict) -> list[str]:
    keys = [k for k in r if "/" in k]
    return [f"### {name}: peak RSS with clients holding state", "",
            f"`{r['command']}`: {r['clients']:,} clients, {r['per_round']:,} per round, {r['rounds']} rounds, "
            f"a checkpoint every round; {r.get('repeats', 1)} interleaved repeats, load {_load(r)}.", "",
            *md_table(["algorithm / store", "peak RSS GB, median (min–max)", "run CPU s, median (q1–q3)",
                       "clients with state", "state files GB", "checkpoints GB"],
                      [[k, _range(r[k].get("peak_rss")), _sp(r[k].get("cpu"), 1), r[k]["clients_with_state"],
                        f"{r[k]['state_files_gb']:.2f}", f"{r[k]['checkpoints_gb']:.2f}"] for k in keys]), ""]


def render_stream(name: str, r: dict) -> list[str]:
    m = r["models"]
    return [f"### {name}: streaming aggregation at full participation", "",
            f"`{r['command']}`: FedAvg, {r['clients']:,} clients all in each of {r['rounds']} round(s); "
            f"{r['repeats']} interleaved repeats, load {_load(r)}.", "",
            *md_table(["stream_aggregation", "peak RSS GB, median (min–max)", "RSS before round 1 GB",
                       "run CPU s, median (q1–q3)"],
                      [[k, _range(r["peak_rss"][k]), f"{r['base_rss_gb'][k]:.2f}", _sp(r["cpu"][k], 1)]
                       for k in ("off", "on")]), "",
            f"Peak RSS off / on {r['peak_ratio_off_over_on']:.2f}× (above the setup "
            f"{r['extra_ratio_off_over_on']:.1f}×); CPU on / off {r['cpu_ratio_on_over_off']:.2f}×; same accuracy "
            f"{r['same_accuracy']}; final models: {m['elements_differing']} of {m['elements']} elements differ "
            f"(max |diff| {m['max_abs_diff']:.2g}).", ""]


def render_scaling(name: str, r: dict) -> list[str]:
    rows = [[f"cohort {k} of 100 clients (600 images each)", _sp(c["cpu"]), f"{c['per_round_s'] / int(k) * 1e3:.0f} ms",
             c["store"]] for k, c in r["cohort"].items()]
    rows += [[f"{k} clients (6 images each), 10 per round", _sp(c["cpu"], 3), "", c["store"]] for k, c in r["total"].items()]
    out = [f"### {name}: per-round time", "", f"`{r['command']}`: {r['algorithm']}, {r['threads']} thread(s); the "
           f"round plus its checkpoint, rounds 2 on; load {_load(r)}.", "",
           *md_table(["cell", "CPU s per round, median (q1–q3)", "per client", "state store"], rows), ""]
    if "total_ratio_largest_to_smallest" in r:
        out += [f"Largest / smallest total: {r['total_ratio_largest_to_smallest']:.2f}× per round (1.00 = flat).", ""]
    return out


def render_public(name: str, r: dict) -> list[str]:
    return [f"### {name}: CreamFL's public-set terms, chunked", "",
            f"`{r['command']}`: |P| = {r['public']:,}, {r['clients']} clients, d = {r['dim']}, chunk {r['chunk']}, "
            f"{r['threads']} thread(s); {r['repeats']} repeats, load {_load(r)}.", "",
            *md_table(["CPU s, median (q1–q3)", "GFLOP/s of CPU time", "inputs GB", "peak extra GB, median (min–max)",
                       "the full matrix, GB per client"],
                      [[_sp(r["cpu"]), f"{r['cpu_gflop_per_s']:.0f}", f"{r['inputs_gb']:.2f}",
                        _range(r["peak_extra"], 3), f"{r['full_matrix_gb_per_client']:.2f}"]]), ""]


RENDER = {"overhead": render_overhead, "batched": render_batched, "memory": render_memory,
          "stream_memory": render_stream, "scaling": render_scaling, "public_agg": render_public}


def render(data: dict, note: str) -> list[str]:
    head = [k for k in ("overhead_ratio", "batched_speedup", "peak_rss_gb_10k_clients", "public_agg_peak_extra_gb",
                        "flower_sim_ratio")]
    lines = ["# Performance (issues 8 and 28)", "",
             "Regenerate: `nice -n 10 .venv/bin/python benchmarks/perf/run.py` (the cells of "
             "`benchmarks/perf/cells.toml`, profile `small`; `--profile full` for the issue's sizes). Tables rendered "
             "from `perf.json` (`benchmarks/perf/run.py --render-only`).", "", note, "",
             "Times are CPU time (user + system of the process and its waited-for children), the cells of a "
             "comparison interleaved (A B, B A, ...), median and quartiles over the repeats; other processes on the "
             "machine do not inflate it. Memory is peak RSS (`ru_maxrss`), median and range over repeats.", "",
             *md_table(["perf.json key", "value"], [[k, data[k] if data.get(k) is not None else
                                                    "— (benchmarks/flower/run.py)" if k == "flower_sim_ratio"
                                                    else "— (set by the full sizes only)"] for k in head]), ""]
    for sec, r in data.get("details", {}).items():
        kind = next((k for k in sorted(RENDER, key=len, reverse=True) if sec.startswith(k)), None)
        r = _last_run(r)
        if kind and isinstance(r, dict) and "command" in r:
            try:
                lines += RENDER[kind](sec, r)
            except KeyError as e:  # an older record without the CPU-time fields
                lines += [f"### {sec}", "", f"(recorded by an older version of the script: no {e} field)", ""]
    return lines + ["## Analysis (hand-written)", "", MARKER, ""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="small")
    ap.add_argument("--cells", nargs="+", help="run only these cells (perf.json is updated, not started afresh)")
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--out", type=Path, help="write perf.json and perf.md here instead (a trial run)")
    a = ap.parse_args(argv)
    grid = load_grid()
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
        loads, failed = [os.getloadavg()[0]], []
        env = {**os.environ, "MMFL_PERF_RESULTS": str(results.parent),
               "MMFL_PERF_OUT": tempfile.mkdtemp(prefix="mmfl-perf-")}
        for c in todo:
            script, args = cells[c]
            cmd = [sys.executable, str(HERE / script), *shlex.split(args)]
            print(f"== {c}: {' '.join(cmd[1:])} (load {os.getloadavg()[0]:.1f})", flush=True)
            if subprocess.run(cmd, cwd=ROOT, env=env).returncode:
                failed.append(c)
                print(f"mmfl: warning: cell {c} failed (its figures are not in perf.json); the others go on", flush=True)
            loads.append(os.getloadavg()[0])
            data = json.loads(results.read_text())  # after every cell: a stopped run still says what ran
            data["run_note"] = {"profile": a.profile, "cells": todo[:len(loads) - 1], "loads": loads, "failed": failed,
                                "nice": os.nice(0), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}
            results.write_text(json.dumps(data, indent=2) + "\n")
        shutil.rmtree(env["MMFL_PERF_OUT"], ignore_errors=True)
    data = json.loads(results.read_text())
    n = data.get("run_note", {})
    note = (f"Last run: profile `{n.get('profile')}` (cells {', '.join(n.get('cells', []))}) at nice {n.get('nice')} on "
            f"{n.get('machine')}, shared with other sessions; the 1-minute load average before, between and after "
            f"the cells: {', '.join(f'{x:.1f}' for x in n.get('loads', []))}."
            + (f" Cells that failed: {', '.join(n['failed'])}." if n.get("failed") else "")
            if n else "Run note missing: perf.json predates benchmarks/perf/run.py.")
    write_report(report, render(data, note), keep_below=MARKER)
    print(f"wrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
