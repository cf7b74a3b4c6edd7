"""The numbers docs/getting-started.md quotes are the output of the commands written beside them.

`scripts/docs_numbers.py` runs those commands and records their output in
tests/docs_numbers.json; here the doc must quote each record verbatim. The cheap one
(`mmfl list algorithm`, a fixed few names: a new algorithm changes neither the record nor the
doc) is also run here, so a changed name or help line fails this test until the record and the
doc are regenerated (`python scripts/docs_numbers.py list`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from docs_numbers import list_lines  # noqa: E402

DOC = (ROOT / "docs" / "getting-started.md").read_text()
RECORD = json.loads((ROOT / "tests" / "docs_numbers.json").read_text())


def _indented(text: str, indent: str) -> str:
    return "\n".join(indent + line for line in text.splitlines())


@pytest.mark.parametrize("job,indent", [("resume", "  "), ("fedcmi", ""), ("list", "")])
def test_getting_started_quotes_the_recorded_output(job, indent):
    assert _indented(RECORD[job], indent) + "\n" in DOC, (
        f"docs/getting-started.md does not quote the output of job '{job}' of scripts/docs_numbers.py")


def test_resume_record_equals_the_straight_run():
    resumed, straight = RECORD["resume"].splitlines()
    assert resumed.split(None, 1)[1] == straight.split(None, 1)[1]  # what the doc claims


def test_mmfl_list_algorithm_matches_the_record():
    # a fresh process: other tests register throwaway algorithms in this one's registry
    out = subprocess.run([sys.executable, "-m", "mmfl.cli", "list", "algorithm"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout
    assert list_lines(out) == RECORD["list"], "run `python scripts/docs_numbers.py list` and update the doc"
