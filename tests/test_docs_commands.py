"""Every `mmfl ...` command in README.md and docs/*.md parses (its arguments, and for a run of a
config that exists, its config and overrides resolve), and the fast ones (`mmfl list`, the
documented errors) run and give what the page says. In-process, so it takes seconds; the full
run of every command at reduced size is `python scripts/check_docs.py` (see its docstring)."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import check_docs  # noqa: E402

COMMANDS = [c for page in check_docs.docs() for c in check_docs.extract(page)]
MMFL = [c for c in COMMANDS if c.program == "mmfl" and not c.usage]


def _id(c) -> str:
    return f"{c.doc}:{c.line}"


def test_the_checker_finds_the_docs_commands():
    docs = {c.doc for c in MMFL}
    assert {"README.md", "docs/getting-started.md"} <= docs
    assert sum(c.fast for c in MMFL) >= 8  # list + the errors section
    assert any(c.expect_error for c in MMFL)


def test_extraction_joins_continuations_and_drops_comments_and_pipes(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```bash\n.venv/bin/mmfl run a.toml \\\n    --set 'x=\"a b\"'   # note\n```\n"
                    "```\n$ mmfl list algorithm | grep -v x\nmmfl: error: output, not a command\n"
                    "$ mmfl run x.toml --set foo=1   -> mmfl: error: foo: unknown\n```\n")
    a, b, c = check_docs.extract(page)
    assert a.argv == ["run", "a.toml", "--set", 'x="a b"'] and a.line == 2
    assert b.argv == ["list", "algorithm"] and b.fast
    assert c.expect_error == "mmfl: error: foo: unknown" and c.fast


@pytest.mark.parametrize("c", MMFL, ids=_id)
def test_every_documented_command_parses(c, tmp_path):
    from mmfl.cli import build_parser

    try:
        args = build_parser().parse_args(c.argv)
    except SystemExit as e:
        pytest.fail(f"{c.doc}:{c.line}: `mmfl {' '.join(c.argv)}` does not parse (exit {e.code})")
    config = getattr(args, "config", None)
    if c.expect_error is None and args.command == "run" and config and (ROOT / config).is_file() \
            and not any("$" in o for o in args.overrides):
        from mmfl.config import load_config

        load_config(ROOT / config, [*args.overrides, f"output_dir={tmp_path}"])  # resolves, loads no data


@pytest.mark.parametrize("c", [c for c in MMFL if c.fast], ids=_id)
def test_fast_documented_commands_run_as_written(c, tmp_path, monkeypatch):
    from mmfl.cli import main

    cwd = check_docs.scratch(tmp_path / "scratch")
    monkeypatch.chdir(cwd)
    if check_docs.skip_reason(c, cwd) is not None:
        pytest.skip(check_docs.skip_reason(c, cwd))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(c.argv)
        except SystemExit as e:
            rc = e.code
    status, why = check_docs.judge(c, rc, err.getvalue())
    assert status == "ok", f"{c.doc}:{c.line}: {c.text}: {why or err.getvalue()[-300:]}"
