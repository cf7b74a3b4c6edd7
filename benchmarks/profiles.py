"""The profiles of the paper benchmarks' ``run.py`` (moon, fedcmi, creamfl): which grid file a
profile runs, the device and stacking options laid over it, a plan mode and the wall time.

    run.py [--profile full|quick|paper] [--quick] [--device auto|cpu|cuda|cuda:N]
           [--batch-clients true|false] [--plan [--estimate [--estimate-epochs N]]] [mmfl bench options]

- ``--profile``: ``full`` = grid.toml (the default), ``quick`` = grid-quick.toml (also ``--quick``),
  ``paper`` = grid-paper.toml (the paper's scale; meant for a GPU);
- ``--device`` / ``--batch-clients``: the runs' ``device`` / ``batch_clients`` settings
  (``--grid-set set.device=...``; a run folder made on one device resumes on another);
- ``--plan``: check every run's config and list the runs per group (``--group G``: of G), run nothing;
  ``--estimate``: also time round 1 of each (group, method) at the first setting and seed
  and extrapolate the profile's wall time (one worker; ``--estimate-epochs N`` times N local
  epochs and scales the measured round by local_epochs / N, training being most of a round);
- otherwise ``mmfl bench GRID`` runs the missing runs and writes the report, then this prints
  the invocation's wall time.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

PROFILES = {"full": "grid.toml", "quick": "grid-quick.toml", "paper": "grid-paper.toml"}


def split_args(here: Path, argv: list[str]) -> tuple[str, Path, dict, list[str]]:
    """``(profile, grid file, options of this module, the rest for mmfl bench)``."""
    profile, opts, rest, i = "full", {"plan": False, "estimate": False, "estimate_epochs": 0}, [], 0
    sets: list[str] = []

    def value(flag: str) -> str:
        nonlocal i
        if i + 1 >= len(argv):
            raise SystemExit(f"mmfl: error: {flag}: expected a value")
        i += 1
        return argv[i]

    while i < len(argv):
        a = argv[i]
        if a == "--quick":
            profile = "quick"
        elif a == "--profile":
            profile = value(a)
            if profile not in PROFILES:
                raise SystemExit(f"mmfl: error: --profile: one of {', '.join(PROFILES)}, got {profile!r}")
        elif a == "--device":
            sets.append(f"set.device={json.dumps(value(a))}")
        elif a == "--batch-clients":
            v = value(a).lower()
            if v not in ("true", "false"):
                raise SystemExit(f"mmfl: error: --batch-clients: true or false, got {v!r}")
            sets.append(f"set.batch_clients={v}")
        elif a == "--plan":
            opts["plan"] = True
        elif a == "--estimate":
            opts["estimate"] = True
        elif a == "--estimate-epochs":
            opts["estimate_epochs"] = int(value(a))
        else:
            rest.append(a)
        i += 1
    for s in sets:
        rest += ["--grid-set", s]
    return profile, here / PROFILES[profile], opts, rest


def grid_sets(rest: list[str]) -> list[str]:
    return [rest[j + 1] for j, a in enumerate(rest) if a == "--grid-set" and j + 1 < len(rest)]


def plan(grid_path: Path, rest: list[str], opts: dict) -> int:
    import mmfl
    from mmfl.bench.gridfile import load_grid

    grid = load_grid(grid_path, grid_sets(rest))
    groups = [rest[j + 1] for j, a in enumerate(rest) if a == "--group" and j + 1 < len(rest)]
    runs = grid.runs(groups or None)
    by_group: dict[str, list] = {}
    for r in runs:
        mmfl.configure(r.raw)  # every run's config checked
        by_group.setdefault(r.group, []).append(r)
    print(f"{grid_path.name}: {len(runs)} runs, {grid.workers} worker(s), raw_dir {grid.raw_dir}")
    for g, rs in by_group.items():
        rounds = sum(int(r.raw.get("rounds", 0)) for r in rs)
        print(f"  {g}: {len(rs)} runs, {rounds} rounds in all; e.g. {rs[0].name}")
    if not opts["estimate"]:
        return 0
    total = 0.0
    with tempfile.TemporaryDirectory(prefix="mmfl-estimate-") as tmp:
        measured: dict[tuple, float] = {}
        for r in runs:
            key = (r.group, r.method)
            if key not in measured:
                measured[key] = _one_round(r.raw, tmp, opts["estimate_epochs"])
                print(f"  {r.group} {r.method}: {measured[key]:.1f} s per round (measured)", flush=True)
            total += measured[key] * int(r.raw.get("rounds", 1))
    print(f"estimated wall time: {total / 3600:.1f} h of rounds on this machine "
          f"({total / 3600 / grid.workers:.1f} h with {grid.workers} worker(s), if they do not compete for cores)")
    return 0


def _one_round(raw: dict, tmp: str, epochs: int) -> float:
    """Seconds of round 1 of ``raw`` (evaluation included), scaled to its local epochs."""
    import mmfl

    full = int(raw.get("train", {}).get("local_epochs", 1))
    over = {"rounds": 1, "eval_every": 1, "output_dir": tmp, "name": "estimate"}
    if epochs:
        over["train__local_epochs"] = epochs
    res = mmfl.run(raw, overwrite=True, progress=False, **over)
    rows = [json.loads(x) for x in res.metrics_path.read_text().splitlines() if x.strip()]
    train, wall = rows[0]["train_time_s"], rows[0]["wall_time_s"]
    scale = full / epochs if epochs else 1.0
    return train * scale + (wall - train)


def main(here: Path, argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(here.parent.parent))  # this checkout's mmfl
    from mmfl.bench import bench_main
    from mmfl.errors import MMFLError

    argv = sys.argv[1:] if argv is None else argv
    profile, grid, opts, rest = split_args(here, argv)
    try:
        if opts["plan"]:
            return plan(grid, rest, opts)
    except MMFLError as e:
        print(f"mmfl: error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rc = bench_main(grid, rest)
    print(f"wall time ({profile} profile, {grid.name}): {time.perf_counter() - t0:.1f} s")
    return rc
