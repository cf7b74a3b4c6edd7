"""The numbers docs/getting-started.md quotes are the output of the commands written beside them.

`scripts/docs_numbers.py` runs those commands and records their output in
tests/docs_numbers.json; here the doc must quote each record verbatim. The cheap one
(`mmfl list algorithm`, names only) is also run here, so a new algorithm fails this test until
the record and the doc are regenerated (`python scripts/docs_numbers.py list`)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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
    from mmfl.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["list", "algorithm"]) == 0
    names = "\n".join(line for line in out.getvalue().splitlines() if not line.startswith("      "))
    assert names == RECORD["list"], "run `python scripts/docs_numbers.py list` and update the doc"
