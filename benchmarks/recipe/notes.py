"""Which finished runs of a folder get mmfl's learning note: mmfl.engine.learning_check replayed
over each run's metrics.jsonl (docs/recipe.md, "the learning note").

    .venv/bin/python benchmarks/recipe/notes.py [RUNS]     # default benchmarks/results/raw/recipe
"""

import io
import json
import sys
import tomllib
from pathlib import Path

from mmfl.engine.learning_check import LearningCheck


def notes(runs: Path) -> None:
    for d in sorted(p for p in runs.iterdir() if (p / "summary.json").is_file()):
        labels = json.loads((d / "labels.json").read_text())
        schedule = tomllib.loads((d / "config.toml").read_text()).get("train", {}).get("lr_schedule", "constant")
        check = LearningCheck(len(labels), "-", 0.0, stream=io.StringIO(), decaying=schedule != "constant")
        for line in (d / "metrics.jsonl").read_text().splitlines():
            said = check.update(json.loads(line))
            if said:
                print(f"{d.name}: {said[len('mmfl: note: '):].split(': the model')[0]}")
                break


if __name__ == "__main__":
    notes(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/raw/recipe"))
