"""benchmarks/perf/run.py: the perf cells as one grid (cells.toml) and perf.md rendered from perf.json."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PERF = ROOT / "benchmarks" / "perf"


def test_every_profile_names_existing_scripts_and_the_same_cells():
    grid = tomllib.loads((PERF / "cells.toml").read_text())
    names = {p: set(cells) for p, cells in grid["profiles"].items()}
    assert names["small"] == names["full"]
    for cells in grid["profiles"].values():
        for script, args in cells.values():
            assert (PERF / script).is_file(), script
            assert "--repeats" in args, f"{script}: every cell repeats (median and spread)"


def test_render_only_writes_every_section_with_cpu_time_and_load(tmp_path):
    shutil.copy(ROOT / "tests" / "fixtures" / "perf.json", tmp_path / "perf.json")  # a small run's figures
    out = subprocess.run([sys.executable, str(PERF / "run.py"), "--render-only", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "perf.md").read_text()
    data = json.loads((tmp_path / "perf.json").read_text())
    for sec in data.get("details", {}):
        assert f"### {sec}" in md
    assert "CPU s" in md and "load" in md and "<!-- analysis -->" in md


def test_an_unknown_profile_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, str(PERF / "run.py"), "--profile", "huge", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and out.stderr.strip().splitlines() == [
        "mmfl: error: no profile 'huge' in cells.toml (have: small, full)"]
