"""Run every command the README and docs/*.md show, verbatim, at reduced size.

    .venv/bin/python scripts/check_docs.py                  # every doc; a line per command, exit 1 if one failed
    .venv/bin/python scripts/check_docs.py README.md --timeout 120
    .venv/bin/python scripts/check_docs.py --fast           # only the commands that take seconds (no training)

A command is a line of a fenced code block that starts with ``mmfl``, ``.venv/bin/mmfl``,
``python``/``python3`` or ``.venv/bin/python`` (in an output block, only the lines after a
``$ `` prompt); ``\\`` continuations are joined, a trailing ``# comment`` and anything after a
pipe are dropped. ``mmfl`` runs as this checkout's ``python -m mmfl.cli``. A line written
``$ mmfl ... -> mmfl: error: MESSAGE`` (getting-started's errors) must exit 2 with that message.

Reduced size: ``mmfl run``/``demo`` get ``--set rounds=1 --set threads=1 --no-progress``.
The commands of one page run in order in one scratch folder (links to ``mmfl/``,
``benchmarks/``, ``tests/``, ...), so ``runs/`` is the scratch's and a page's later commands
see its earlier runs. ``config.toml``, ``x.toml`` and ``moon-fmnist.toml`` there hold the
README's example config. Skipped, with the reason: Flower deployments (executed by
tests/test_flower_deploy.py), ``flower simulate`` (Ray; ``--all`` runs it), benchmark scripts
(hours), commands needing a file that is not there (your own copy of a data set, a
certificate) or a run folder whose command was skipped or failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = {"mmfl": "mmfl", ".venv/bin/mmfl": "mmfl", "python": "python", "python3": "python",
            ".venv/bin/python": "python"}
PLACEHOLDERS = ("config.toml", "x.toml", "moon-fmnist.toml")  # the README's example config
LINKED = ("mmfl", "benchmarks", "tests", "scripts", "docs", "pyproject.toml", "README.md")
FAST_SUBCOMMANDS = {"list"}  # no data loaded, no training


@dataclass
class Command:
    doc: str            # the page, relative to the repository
    line: int           # 1-based line of the command's first line
    text: str           # as written (continuations joined, comment dropped)
    argv: list[str]     # the program's arguments
    program: str        # "mmfl" or "python"
    expect_error: str | None = None  # "-> mmfl: error: ..." lines: the expected message
    usage: bool = False  # a synopsis such as `mmfl list [algorithm|dataset]`, not a command
    status: str = ""
    why: str = ""
    seconds: float = 0.0
    extra: list[str] = field(default_factory=list)

    @property
    def sub(self) -> str:
        return self.argv[0] if self.argv else ""

    @property
    def fast(self) -> bool:
        """Takes seconds: argument parsing, `list`, an expected config error, `--help`."""
        return self.program == "mmfl" and not self.usage and (self.sub in FAST_SUBCOMMANDS or self.expect_error is not None
                                           or "--help" in self.argv or "-h" in self.argv)


# ----------------------------------------------------------------------------- extraction

def _blocks(text: str):
    """(language, first line number, lines) of each fenced code block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```(\S*)", lines[i])
        if m:
            lang, start, body = m.group(1).lower(), i + 2, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            yield lang, start, body
        i += 1


def _split(line: str) -> tuple[list[str], str | None]:
    """Shell words of a command line up to a pipe / && / redirection, and an expected error."""
    expect = None
    head, sep, tail = line.partition(" -> ")
    if sep and tail.strip().startswith("mmfl: error:"):  # not an arrow inside a # comment
        line, expect = head, tail.strip()
    lex = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
    lex.whitespace_split = True
    lex.commenters = "#"
    words = []
    for w in lex:
        if w in ("|", "||", "&&", ";", ">", ">>", "<", "&", "2>"):
            break
        words.append(w)
    return words, expect


def extract(path: Path) -> list[Command]:
    """The commands of one Markdown page."""
    doc = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    out = []
    for lang, start, body in _blocks(path.read_text()):
        if lang not in ("", "bash", "sh", "shell", "console", "text"):
            continue
        prompt_only = lang in ("", "console", "text")
        variables: dict[str, str] = {}  # NAME='value' lines of the block, expanded in later lines
        j = 0
        while j < len(body):
            first, raw = j, body[j].strip()
            while raw.endswith("\\") and j + 1 < len(body):
                j += 1
                raw = raw[:-1].rstrip() + " " + body[j].strip()
            j += 1
            if raw.startswith("$ "):
                raw = raw[2:].strip()
            elif prompt_only:
                continue
            m = re.fullmatch(r"([A-Za-z_]\w*)=(\S.*)", raw)
            if m and not prompt_only:
                try:
                    words = [x for w in shlex.split(m.group(2)) for x in w.split()]  # $NAME unquoted: split
                    variables[m.group(1)] = " ".join(shlex.quote(w) for w in words)
                except ValueError:
                    pass
                continue
            for name, value in variables.items():
                raw = re.sub(r"\$\{?" + name + r"\b\}?", lambda _: value, raw)
            usage = bool(re.search(r"\[[^\]]*\||\[--", raw))
            try:
                words, expect = _split(raw)
            except ValueError:
                continue  # not shell (an unbalanced quote in prose-like output)
            while words[:1] == ["nice"]:  # nice -n N CMD
                words = words[3:] if len(words) > 2 and words[1] == "-n" else words[1:]
            if not words or words[0] not in PROGRAMS:
                continue
            program = PROGRAMS[words[0]]
            argv = words[1:]
            if program == "mmfl" and not argv:
                continue
            out.append(Command(doc, start + first, raw.split(" -> mmfl: error")[0].split("  #")[0].strip(), argv,
                               program, expect, usage=usage))
    return out


def docs(args: list[str] | None = None) -> list[Path]:
    if args:
        return [Path(a).resolve() for a in args]
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# ----------------------------------------------------------------------------- decisions

def readme_example() -> str:
    """The README's example config (the first ```toml block starting with `name =`)."""
    for lang, _, body in _blocks((ROOT / "README.md").read_text()):
        if lang == "toml" and body and body[0].startswith("name ="):
            return "\n".join(body) + "\n"
    raise SystemExit("README.md: no example config (a ```toml block starting with name =)")


def skip_reason(c: Command, cwd: Path, run_all: bool = False) -> str | None:
    """Why ``c`` is not run, or None."""
    a = c.argv
    if c.usage:
        return "a usage line ([optional] arguments)"
    if c.program == "mmfl" and any("$" in w for w in a):
        return "uses a shell variable (a loop or a placeholder)"
    if c.program == "python":
        if a[:1] == ["-c"] or a[:1] == ["-m"]:
            return "inline Python"
        if a and a[0].startswith("benchmarks/"):
            return "a benchmark script (long; `mmfl bench ... grid-quick.toml` is its smoke run)"
        if a and a[0] == "scripts/docs_numbers.py":
            return "regenerates the docs' numbers (minutes; tests/test_docs_numbers.py checks them)"
        if a and a[0] == "scripts/check_docs.py":
            return "this checker"
        if a and a[0] == "scripts/mutants.py" and "--list" not in a:
            return "the mutation runner (minutes; tests/test_mutants.py runs --fast and checks the list)"
        return None
    if a[:1] == ["flower"]:
        if a[1:2] != ["simulate"]:
            return "a Flower deployment (tests/test_flower_deploy.py runs them)"
        if a[1:2] == ["simulate"] and not run_all:
            return "Flower's Ray simulation (slow to start; --all runs it)"
    if a[:1] == ["bench"] and "--tables-only" not in a and not any("quick" in w for w in a) and not run_all:
        return "a whole benchmark (hours; --all runs it)"
    if any("$" in w for w in a):
        return "uses a shell variable (a loop or a placeholder)"
    if any("*" in w for w in a):
        return "a glob over runs of the page's benchmark"
    for i, w in enumerate(a if c.expect_error is None else ()):  # an expected error may name a missing file
        prev = a[i - 1] if i else ""
        if prev in ("--plot", "-o", "--out", "--set", "--grid-set", "--superlink"):
            continue
        looks_input = (w.endswith((".toml", ".crt", ".csv", ".jsonl")) or w.startswith(("~", "/", "runs/"))
                       or prev in ("--root", "--root-certificates"))
        if looks_input and not (cwd / Path(w).expanduser()).exists():
            if w.startswith("runs/"):
                return f"needs {w}, which an earlier command of this page did not make"
            return f"needs {w} (not in this checkout: your own file)"
    return None


def reduced(c: Command) -> list[str]:
    """Arguments appended to run ``c`` at reduced size."""
    a = c.argv
    if c.program == "mmfl" and (a[:1] in (["run"], ["demo"]) or a[:2] == ["flower", "simulate"]) \
            and c.expect_error is None:
        return ["--set", "rounds=1", "--set", "threads=1", "--no-progress"]
    return []


# ----------------------------------------------------------------------------- running

def scratch(root: Path) -> Path:
    """A folder with links to the checkout's code and data and the placeholder configs."""
    root.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        if (ROOT / name).exists() and not (root / name).exists():
            (root / name).symlink_to(ROOT / name)
    example = readme_example()
    for name in PLACEHOLDERS:
        (root / name).write_text(example)
    return root


def run(c: Command, cwd: Path, timeout: float, run_all: bool = False) -> Command:
    why = skip_reason(c, cwd, run_all)
    if why is not None:
        c.status, c.why = "skipped", why
        return c
    c.extra = reduced(c)
    exe = [sys.executable, "-m", "mmfl.cli"] if c.program == "mmfl" else [sys.executable]
    env = dict(os.environ, MMFL_QUIET="1", PYTHONPATH=str(cwd))
    t0 = time.perf_counter()
    try:
        done = subprocess.run([*exe, *c.argv, *c.extra], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        c.seconds = time.perf_counter() - t0
        c.status, c.why = "failed", f"timed out after {timeout:.0f} s"
        return c
    c.seconds = time.perf_counter() - t0
    last = (done.stderr.strip().splitlines() or [""])[-1]
    c.status, c.why = judge(c, done.returncode, done.stderr)
    if c.status == "failed" and not c.why:
        c.why = f"exit {done.returncode}: {last[:300]}"
    return c


def judge(c: Command, rc: int, stderr: str) -> tuple[str, str]:
    """("ok", "") or ("failed", why) from a finished command's exit code and stderr."""
    if c.expect_error is not None:
        want = c.expect_error.split("...")[0].rstrip(" (,")
        if rc == 2 and want in stderr:
            return "ok", ""
        return "failed", f"expected exit 2 with '{want}', got exit {rc}: {stderr.strip()[-300:]}"
    return ("ok", "") if rc == 0 else ("failed", "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("docs", nargs="*", help="pages (default: README.md and docs/**/*.md)")
    p.add_argument("--fast", action="store_true", help="only commands that take seconds (no training)")
    p.add_argument("--all", action="store_true", help="also Flower simulations and whole benchmarks")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per command (600)")
    p.add_argument("--scratch", default="", help="scratch folder (default: a new temporary one)")
    args = p.parse_args(argv)
    base = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="mmfl-check-docs-"))
    counts = {"ok": 0, "failed": 0, "skipped": 0}
    for page in docs(args.docs):
        cmds = extract(page)
        if not cmds:
            continue
        cwd = scratch(base / page.stem)
        for c in cmds:
            if args.fast and not c.fast:
                c.status, c.why = "skipped", "not fast (--fast)"
            else:
                run(c, cwd, args.timeout, args.all)
            counts[c.status] += 1
            took = f" {c.seconds:.0f}s" if c.seconds else ""
            extra = f" [+ {' '.join(c.extra)}]" if c.extra else ""
            print(f"{c.status:7s}{took:>5s} {c.doc}:{c.line}: {c.text}{extra}" + (f"\n        {c.why}" if c.why else ""),
                  flush=True)
    print(f"{counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped (scratch: {base})")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
