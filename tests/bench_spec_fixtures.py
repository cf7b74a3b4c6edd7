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


def make_runs(grid, rounds_key: str = "rounds", skip_every: int = 7, fail: int = 1, keys=(), summary_keys=(),
              lists=None) -> None:
    """Fixture runs for ``grid`` (already redirected to a test folder). ``keys``: extra metric keys
    written into every row (``moon/ce`` ...); ``summary_keys``: extra summary.json keys;
    ``lists``: ``{key: length}``, list-valued keys of every row (``class_accuracy/audio``)."""
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
            for k, n in (lists or {}).items():
                row[k] = [round(_u(run.name, f"{k}{r}/{i}"), 4) for i in range(n)]
            rows.append(row)
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
        summary = {"final_accuracy": rows[-1]["accuracy"], "final_accuracy_std": round(0.05 * _u(run.name, "std"), 4),
                   "wall_time_s": sum(x["wall_time_s"] for x in rows), "rounds": rounds,
                   **{k: round(_u(run.name, k), 4) for k in summary_keys}}
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


# ----------------------------------------------------------------------------- the fixture sets of
# benchmarks/{robust,fedcmi,partialfl} (tests/test_bench_spec_sweeps.py; goldens rendered by the
# hand-written table scripts these specs replaced)

FEDCMI_KEYS = ["accuracy/image", "accuracy/audio", "accuracy/features", "uar", "global/accuracy",
               "global/accuracy/image", "global/accuracy/audio", "global/accuracy/features", "global/uar"]
DIAG_KEYS = ["accuracy/image", "accuracy/audio", "cmi_teacher/image", "cmi_rho", "cmi_rd", "cmi_rd_share",
             "cmi_t_student", "cmi_agree"]


def _robust(grid) -> None:
    """A run stopped by a rule (not diverged), a diverged AV run and a clean-setting failure."""
    for name, msg in (("demo-gaussian-20-krum-s1", "round 3: krum needs more than 2f + 2 = 8 updates, got 7"),
                      ("av-scale-30-median-s2", "diverged: non-finite loss"),
                      ("demo-clean-bulyan-s0", "nan in the server model")):
        (grid.raw_dir / name / "summary.json").unlink(missing_ok=True)
        (grid.raw_dir / name / "failed.txt").write_text(msg)


def _diag(grid) -> None:
    """probe.json (the post-run probe) in every finished run."""
    for run in grid.runs():
        if (grid.raw_dir / run.name / "summary.json").is_file():
            (grid.raw_dir / run.name / "probe.json").write_text(json.dumps(
                {"probe_z/audio": round(_u(run.name, "pa"), 4), "probe_z/image": round(_u(run.name, "pi"), 4)}))


def _split(grid) -> None:
    """split.json (the post-run split evaluation, mmfl.bench.split_eval) in every finished run."""
    for run in grid.runs():
        if (grid.raw_dir / run.name / "summary.json").is_file():
            m = "image" if run.name.startswith("image-") else "audio"
            (grid.raw_dir / run.name / "split.json").write_text(json.dumps(
                {f"accuracy/with:{m}": round(_u(run.name, "w"), 4), f"accuracy/without:{m}": round(_u(run.name, "wo"), 4)}))


CUSTOM = {"missing": _split, "robust": _robust, "diagnose": _diag, "diagnose-missing": _diag}
CASES_SWEEPS = [  # (name, grid, make_runs keywords)
    ("robust", "benchmarks/robust/grid.toml",
     dict(keys=["replies_rejected", "dp/epsilon"], summary_keys=["final_r1_sum"], skip_every=11)),
    ("fedcmi", "benchmarks/fedcmi/grid.toml",
     dict(keys=FEDCMI_KEYS, lists={"class_accuracy/audio": 10, "class_accuracy/image": 10})),
    ("fedcmi-quick", "benchmarks/fedcmi/grid-quick.toml",
     dict(keys=FEDCMI_KEYS, lists={"class_accuracy/audio": 10, "class_accuracy/image": 10}, skip_every=10**9)),
    ("diagnose", "benchmarks/fedcmi/diagnose.toml", dict(keys=DIAG_KEYS, skip_every=10**9, fail=0)),
    ("diagnose-missing", "benchmarks/fedcmi/diagnose.toml", dict(keys=DIAG_KEYS, skip_every=9, fail=0)),
    ("partialfl", "benchmarks/partialfl/grid.toml",
     dict(keys=["uar", "accuracy_top5", "bytes_per_epoch", "messages"])),
    ("partialfl-quick", "benchmarks/partialfl/grid-quick.toml",
     dict(keys=["uar", "accuracy_top5"], skip_every=5, fail=0)),
]
