"""Tiny fixture run folders for a benchmark grid (tests of table specs): every planned run of the
grid gets a summary.json and a metrics.jsonl whose numbers derive from the run's name (so a
renderer sees the same folders every time), some runs are left out (missing seeds) and one is a
diverged run (failed.txt). ``golden(grid)`` is the report a spec renders over them."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

from mmfl.bench import load_grid
from mmfl.bench.runner import redirect

MACHINE = "MACHINE"  # what mmfl.sweep.machine() is replaced by (the report must not depend on the host)


def _u(name: str, salt: str) -> float:
    """A number in [0, 1) from the run's name."""
    return (zlib.crc32(f"{name}/{salt}".encode()) % 10_000) / 10_000


def make_runs(grid, rounds_key: str = "rounds", skip_every: int = 7, fail: int = 1, keys=()) -> None:
    """Fixture runs for ``grid`` (already redirected to a test folder). ``keys``: extra metric keys
    written into every row (``moon/ce`` ...)."""
    for i, run in enumerate(grid.runs()):
        d = grid.raw_dir / run.name
        d.mkdir(parents=True, exist_ok=True)
        if i % skip_every == skip_every - 1:
            continue  # a missing run
        if i < fail * 5 and i % 5 == 4:
            (d / "failed.txt").write_text("non-finite training loss")
            continue
        rounds = int(run.raw.get(rounds_key, 5))
        rows = []
        for r in range(1, rounds + 1):
            row = {"round": r, "accuracy": round(0.3 + 0.5 * (r / rounds) * (0.6 + 0.4 * _u(run.name, "acc")), 4),
                   "wall_time_s": 1.0 + _u(run.name, f"w{r}"), "bytes_up": 1000 * r, "bytes_down": 2000 * r}
            for k in keys:
                row[k] = round(_u(run.name, f"{k}{r}"), 4)
            rows.append(row)
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
        summary = {"final_accuracy": rows[-1]["accuracy"], "final_accuracy_std": round(0.05 * _u(run.name, "std"), 4),
                   "wall_time_s": sum(x["wall_time_s"] for x in rows), "rounds": rounds}
        (d / "summary.json").write_text(json.dumps(summary))


def fixture_grid(path: str | Path, tmp: Path, **kw):
    grid = redirect(load_grid(path), tmp)
    make_runs(grid, **kw)
    return grid


def render_lines(grid, monkeypatch) -> str:
    """The grid's report over its (fixture) runs, machine-independent."""
    import mmfl.sweep
    from mmfl.bench.runner import _SPECS, render

    monkeypatch.setattr(mmfl.sweep, "machine", lambda: MACHINE)
    _SPECS.clear()
    path = render(grid)
    return Path(path).read_text()
