"""The report lines every paper's header repeats: how to regenerate it, how many planned runs
finished and what they cost, which failed or gave non-finite metrics, and the hand-written
reading appended at the end."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def regenerate_line(b, command: str) -> str:
    """``Regenerate: `command` (finished runs in `<raw>/` are reused; ...)`` (the raw folder
    relative to the grid's root)."""
    return (f"Regenerate: `{command}` (finished runs in `{os.path.relpath(b.raw, b.grid.root)}/` are reused; "
            "`--tables-only` rebuilds this file; `--workers N` sets the worker processes).")


def runs_line(n_finished: int, n_planned: int, run_s: float, last: dict | None) -> str:
    """``- Runs: n of N planned finished; summed run time ...`` with the last invocation's
    record (``Bench.last_invocation()``) when there is one."""
    return (f"- Runs: {n_finished} of {n_planned} planned finished; summed run time {run_s / 60:.1f} min of "
            "single-thread compute (the rounds' wall times)"
            + (f"; the last invocation ran {last['runs']} runs in {last['wall_s'] / 60:.1f} min wall with "
               f"{last['workers']} workers (load average at its start: "
               f"{' '.join(f'{x:.1f}' for x in last['load_average_at_start'] or [])})" if last else "") + ".")


def run_status(b, final: Callable[[str], dict | None], done: Callable[[Path, dict], bool] | None = None) -> dict:
    """The planned runs' state: ``finished`` (names; ``done(run_dir, raw)`` or summary.json),
    ``planned`` (count), ``failed`` (sorted ``(name, message)`` of every planned run with a
    failed.txt), ``nonfinite`` (``(name, keys)`` from ``final(name)["_nonfinite"]``) and
    ``run_s`` (the finished runs' summed ``_wall``)."""
    planned = [(r.name, r.raw) for r in b.runs]
    finished = [n for n, r in planned if (done(b.raw / n, r) if done else b.results.finished(n))]
    names = {n for n, _ in planned}
    failed = sorted((p.parent.name, p.read_text().strip()) for p in b.raw.glob("*/failed.txt") if p.parent.name in names)
    run_s, nonfinite = 0.0, []
    for n in finished:
        r = final(n) or {}
        run_s += r.get("_wall", 0.0)
        if r.get("_nonfinite"):
            nonfinite.append((n, r["_nonfinite"]))
    return {"finished": finished, "planned": len(planned), "failed": failed, "nonfinite": nonfinite, "run_s": run_s}


def problem_lines(failed: list[tuple[str, str]], nonfinite: list[tuple[str, list[str]]] = (),
                  command: str | None = None) -> list[str]:
    """The failed runs (with their error; ``command`` reruns them) and the runs with non-finite
    metrics, as bullet lists ([] when there are none)."""
    out = []
    if failed:
        rerun = f"; the error, and `{command}` reruns them" if command else ""
        out += [f"**Failed runs** ({len(failed)}{rerun}):", ""] + [f"- `{n}`: {e}" for n, e in failed] + [""]
    if nonfinite:
        out += [f"**Runs with non-finite metrics** ({len(nonfinite)}):", ""] \
            + [f"- `{n}`: {', '.join(k)}" for n, k in nonfinite] + [""]
    return out


def reading_lines(path: str | Path | None) -> list[str]:
    """``## Reading the results`` with the hand-written analysis file's text ([] when absent)."""
    if path is None or not Path(path).is_file():
        return []
    return ["## Reading the results", "", Path(path).read_text().strip(), ""]
