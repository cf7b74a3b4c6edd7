"""Regenerate the numbers quoted in docs/getting-started.md from the commands written beside them.

    .venv/bin/python scripts/docs_numbers.py            # run every job, write tests/docs_numbers.json
    .venv/bin/python scripts/docs_numbers.py resume     # one job

Each job runs the doc's commands (``mmfl`` = this checkout's ``python -m mmfl.cli``, one torch
thread, run folders in a scratch directory) and records the text the doc shows. The doc quotes
that text verbatim; ``tests/test_docs_numbers.py`` checks that it does, so a change that moves a
number fails the test until this script is run again and the doc updated with its output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "docs_numbers.json"


def mmfl(args: list[str], out: Path) -> str:
    """``mmfl ARGS`` from the repository root, run folders under ``out``; its stdout."""
    cmd = [sys.executable, "-m", "mmfl.cli", *args]
    if args[0] == "run":
        cmd += ["--set", "threads=1", "--set", f"output_dir={json.dumps(str(out))}", "--no-progress"]
    env = dict(os.environ, MMFL_QUIET="1")
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done.stdout


def triples(run: Path) -> str:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return repr([(r["round"], r["accuracy"], r["train_loss"]) for r in rows])


def job_resume(out: Path) -> str:
    """SCAFFOLD on the demo config: 2 rounds + 1 resumed against 3 rounds straight."""
    base = ["run", "mmfl/configs/demo.toml", "--set", "algorithm.name=scaffold"]
    mmfl([*base, "--set", "name=r-resume", "--set", "rounds=2"], out)
    mmfl([*base, "--set", "name=r-resume", "--set", "rounds=3", "--resume"], out)
    mmfl([*base, "--set", "name=r-straight", "--set", "rounds=3"], out)
    return (f"r-resume   {triples(out / 'r-resume')}\n"
            f"r-straight {triples(out / 'r-straight')}")


def job_fedcmi(out: Path) -> str:
    """Two rounds of FedCMI and of MFedAvg on AV-MNIST case D, compared with mmfl report."""
    mmfl(["run", "mmfl/configs/fedcmi.toml", "--set", "rounds=2"], out)
    mmfl(["run", "mmfl/configs/fedcmi.toml", "--set", "rounds=2", "--set", "algorithm.name=mfedavg",
          "--set", "model.two_projector=false", "--set", "name=mfedavg-D"], out)
    table = mmfl(["report", str(out / "fedcmi-av_mnist-D"), str(out / "mfedavg-D")], out)
    # the s/round column is wall time: it changes from run to run, so it is left out of the record
    return "\n".join("|".join(line.split("|")[:-2]) + "|" for line in table.strip().splitlines())


# the algorithms the doc's `mmfl list algorithm | grep -E ...` shows: a fixed few, so that a new
# algorithm (one file, docs/architecture.md) changes neither the record nor the doc
LISTED = ("fedavg", "fedprox", "scaffold", "moon", "fedcmi", "creamfl", "partialfl")


def list_lines(text: str) -> str:
    """The heading and the lines of :data:`LISTED` of `mmfl list algorithm`'s output (the doc's grep)."""
    return "\n".join(line for line in text.splitlines()
                     if line.startswith("algorithms ") or line[2:].split(" ", 1)[0] in LISTED and line[:2] == "  "
                     and not line.startswith("   "))


def job_list(out: Path) -> str:
    """A few algorithms of `mmfl list algorithm` (their parameter lines dropped)."""
    return list_lines(mmfl(["list", "algorithm"], out))


JOBS = {"resume": job_resume, "fedcmi": job_fedcmi, "list": job_list}


def main(names: list[str]) -> None:
    record = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    for name in names or list(JOBS):
        with tempfile.TemporaryDirectory(prefix="mmfl-docs-") as tmp:
            record[name] = JOBS[name](Path(tmp))
        print(f"--- {name}\n{record[name]}", flush=True)
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORD.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
