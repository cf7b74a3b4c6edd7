"""``mmfl bench GRID --plan [--estimate]``: check every planned run's config and list the runs per
group, running nothing; with ``--estimate`` also time round 1 of each (group, method) at its first
setting and seed and extrapolate the grid's wall time (docs/benchmarks.md, "Profiles and the
accelerator"). And the options that lay run settings over a grid (``--device``, ``--batch-clients``)."""

from __future__ import annotations

import json
import tempfile

from mmfl.errors import ConfigError


def run_sets(device: str | None, batch_clients: str | None) -> list[str]:
    """``--device D`` / ``--batch-clients true|false`` as the ``--grid-set`` values they stand for
    (every run's ``device`` / ``batch_clients``; a run folder made on one device resumes on another)."""
    sets = []
    if device is not None:
        sets.append(f"set.device={json.dumps(device)}")
    if batch_clients is not None:
        v = batch_clients.lower()
        if v not in ("true", "false"):
            raise ConfigError(f"--batch-clients: true or false, got {batch_clients!r}")
        sets.append(f"set.batch_clients={v}")
    return sets


def plan(grid, groups: list[str] | None, estimate: bool = False, estimate_epochs: int = 0, out=print) -> int:
    """List ``grid``'s runs per group (every config checked); ``estimate``: also the measured
    round 1 per (group, method), scaled to the runs' rounds (``estimate_epochs`` N: N local epochs
    timed, the training part scaled by local_epochs / N)."""
    from mmfl.api import configure

    if estimate_epochs < 0:
        raise ConfigError(f"--estimate-epochs: must be >= 0, got {estimate_epochs}")
    runs = grid.runs(groups or None)
    by_group: dict[str, list] = {}
    for r in runs:
        configure(r.raw)  # every run's config checked
        by_group.setdefault(r.group, []).append(r)
    out(f"{grid.path.name}: {len(runs)} runs, {grid.workers} worker(s), raw_dir {grid.raw_dir}")
    for g, rs in by_group.items():
        rounds = sum(int(r.raw.get("rounds", 0)) for r in rs)
        out(f"  {g}: {len(rs)} runs, {rounds} rounds in all; e.g. {rs[0].name}")
    if not estimate:
        return 0
    total = 0.0
    with tempfile.TemporaryDirectory(prefix="mmfl-estimate-") as tmp:
        measured: dict[tuple, float] = {}
        for r in runs:
            key = (r.group, r.method)
            if key not in measured:
                measured[key] = one_round(r.raw, tmp, estimate_epochs)
                out(f"  {r.group} {r.method}: {measured[key]:.1f} s per round (measured)")
            total += measured[key] * int(r.raw.get("rounds", 1))
    out(f"estimated wall time: {total / 3600:.1f} h of rounds on this machine "
        f"({total / 3600 / grid.workers:.1f} h with {grid.workers} worker(s), if they do not compete for cores)")
    return 0


def one_round(raw: dict, tmp: str, epochs: int) -> float:
    """Seconds of round 1 of ``raw`` (evaluation included), scaled to its local epochs."""
    from mmfl.api import run

    full = int(raw.get("train", {}).get("local_epochs", 1))
    over = {"rounds": 1, "eval_every": 1, "output_dir": tmp, "name": "estimate"}
    if epochs:
        over["train__local_epochs"] = epochs
    res = run(raw, overwrite=True, progress=False, **over)
    rows = [json.loads(x) for x in res.metrics_path.read_text().splitlines() if x.strip()]
    train, wall = rows[0]["train_time_s"], rows[0]["wall_time_s"]
    scale = full / epochs if epochs else 1.0
    return train * scale + (wall - train)
